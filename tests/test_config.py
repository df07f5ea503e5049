import pytest

from loracls.config import Config
from loracls.config_reader import load_config, parse_overrides
from loracls.errors import LoraclsError


def test_defaults_are_the_embedded_default_job():
    config = load_config()
    assert (config.train_size, config.validation_size, config.test_size) == (5000, 800, 1200)
    assert (config.r, config.lora_alpha, config.lora_dropout) == (8, 16.0, 0.05)
    assert config.target_modules is None  # the family's query and value projections
    assert (config.batch_size, config.gradient_accumulation, config.epochs, config.warmup_steps) == (16, 2, 3, 100)
    assert (config.learning_rate, config.weight_decay, config.max_grad_norm, config.max_length) == (
        1e-3,
        0.01,
        1.0,
        256,
    )


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("r: 16\ntarget_modules: [q_proj, k_proj, v_proj]\nlearning_rate: 1e-4\n")
    config = load_config(str(path), ["r=32", "target_modules=o_proj,v_proj", "patience=null", "lora_alpha=8"])
    assert config.r == 32
    assert config.target_modules == ["o_proj", "v_proj"]
    assert config.learning_rate == pytest.approx(1e-4)
    assert config.patience is None
    assert isinstance(config.lora_alpha, float)


def test_unknown_key_names_the_nearest(tmp_path):
    with pytest.raises(LoraclsError, match="unknown key 'learning_rat'.*'learning_rate'"):
        load_config(None, ["learning_rat=0.1"])
    path = tmp_path / "c.yaml"
    path.write_text("batchsize: 4\n")
    with pytest.raises(LoraclsError, match="did you mean 'batch_size'"):
        load_config(str(path))


@pytest.mark.parametrize(
    "pair, message",
    [
        ("r=eight", "r must be int"),
        ("r=0", "r must be >= 1"),
        ("lora_dropout=1.5", "lora_dropout"),
        ("precision=fp8", "precision must be one of"),
        ("merge=maybe", "merge must be bool"),
        ("batch_size=2.5", "batch_size must be int"),
        ("noequals", "KEY=VALUE"),
    ],
)
def test_bad_values_are_refused(pair, message):
    with pytest.raises(LoraclsError, match=message):
        load_config(None, [pair])


def test_bad_config_files(tmp_path):
    with pytest.raises(LoraclsError, match="not found"):
        load_config(str(tmp_path / "missing.yaml"))
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(LoraclsError, match="mapping"):
        load_config(str(path))


def test_override_values_read_as_yaml_scalars():
    assert parse_overrides(["a=2.0e-4", "b=null", "c=[x, y]", "d=text"]) == {
        "a": 2e-4,
        "b": None,
        "c": ["x", "y"],
        "d": "text",
    }
    assert Config().to_dict()["r"] == 8


def test_example_config_loads():
    from pathlib import Path

    config = load_config(str(Path(__file__).parent.parent / "configs" / "example.yaml"))
    assert config.labels == ["negative", "positive"] and config.text_column == "review"


def test_text_values_stay_text():
    config = load_config(None, ["input_template=Review: {text}\nSentiment:", "prompt_template=null", "run_name=123"])
    assert config.input_template == "Review: {text}\nSentiment:" and config.prompt_template is None
    assert config.run_name == "123"
    with pytest.raises(LoraclsError, match="must contain {text}"):
        load_config(None, ["input_template=no slot"])


FLOAT_FIELDS = ["learning_rate", "lora_alpha", "lora_dropout", "weight_decay", "max_grad_norm"]


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_every_float_field_must_be_finite(name, value, tmp_path):
    with pytest.raises(LoraclsError, match=f"config: {name} must be"):
        load_config(None, [f"{name}={value}"])
    path = tmp_path / "c.yaml"
    path.write_text(f"{name}: {value}\n")
    with pytest.raises(LoraclsError, match=f"config: {name} must be"):
        load_config(str(path))


@pytest.mark.parametrize(
    "pair, message",
    [
        ("lora_alpha=-16", "lora_alpha must be > 0.0"),
        ("lora_alpha=0", "lora_alpha must be > 0.0"),
        ("learning_rate=0", "learning_rate must be > 0.0 and <= 10.0"),
        ("learning_rate=1e6", "learning_rate must be > 0.0 and <= 10.0"),
        ("max_length=1", "max_length must be >= 8"),
        ("warmup_steps=-1", "warmup_steps must be >= 0"),
        ("seed=-3", "seed must be >= 0"),
        ("train_size=0", "train_size must be >= 1 or null"),
        ("patience=0", "patience must be >= 1 or null"),
    ],
)
def test_numbers_out_of_range_are_refused(pair, message):
    with pytest.raises(LoraclsError, match=message):
        load_config(None, [pair])


def test_every_numeric_field_has_a_range_and_every_field_help():
    from loracls.config_reader import _TYPES, FIELDS, _base_type

    for name in FIELDS:
        info = Config.__pydantic_fields__[name]
        assert info.description and len(info.description.split()) >= 3, name
        if _base_type(_TYPES[name]) in (int, float):
            assert any(hasattr(m, bound) for m in info.metadata for bound in ("ge", "gt")), name


def test_help_config_and_the_docs_reference_are_the_fields_help(capsys):
    from pathlib import Path

    from loracls.cli import main
    from loracls.config_reader import config_help

    assert main(["train", "--help-config"]) == 0
    printed = capsys.readouterr().out
    assert printed == config_help() and "| `learning_rate` | float (> 0.0 and <= 10.0) | `0.001` |" in printed
    reference = (Path(__file__).parents[1] / "docs" / "config-reference.md").read_text()
    assert reference.endswith(config_help()), "regenerate: python3 -m loracls train --help-config"


@pytest.mark.parametrize("name", ["../escape", "/tmp/abs", "a/b", "..", ".", "a\\b", " padded"])
def test_run_names_stay_inside_output_dir(name):
    with pytest.raises(LoraclsError, match="run_name .* must be a plain folder name"):
        load_config(None, [f"run_name={name}"])


def test_config_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes("run_name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(LoraclsError, match=r"not UTF-8 text \(byte 0xe9 at offset 13\)"):
        load_config(str(path))
    path.write_bytes(b"\xef\xbb\xbfr: 4\n")  # a UTF-8 BOM is fine
    assert load_config(str(path)).r == 4


def test_min_steps_repeat_small_data_and_warmup_stays_a_quarter_of_the_run():
    from loracls.config_reader import from_dict
    from loracls.training.plan import plan_steps, warmup_steps

    config = from_dict({"train_size": 64, "min_steps": None})
    assert plan_steps(64, config) == (2, 6)  # 3 epochs of 2 steps
    assert warmup_steps(config, 6) == 1  # not 100 steps at a few percent of the learning rate
    assert plan_steps(64, from_dict({})) == (2, 100)  # the default: at least 100 steps
    assert plan_steps(64, from_dict({"min_steps": 100, "max_steps": 40})) == (2, 40)
    assert plan_steps(5000, from_dict({"min_steps": 100})) == (157, 471)  # more data: epochs decide
    assert warmup_steps(from_dict({}), 471) == 100  # the default job keeps its warmup
