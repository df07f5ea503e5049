"""Bad input: one line on stderr, exit code != 0, nothing written."""

import re
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import synthetic_frame, tiny_overrides
from loracls.cli import main


def run_cli(args, capsys):
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing_column", "column 'label' not found"),
        ("unknown_label", "unknown label"),
        ("empty_text", "empty text"),
        ("one_class", "only one class"),
        ("unknown_key", "unknown key 'lerning_rate'"),
        ("no_targets", "match no module"),
        ("missing_model", "model not found"),
    ],
)
def test_bad_input_one_line_nonzero_nothing_written(case, message, tmp_path, gemma3_dir, capsys):
    frame = synthetic_frame(400)
    extra = {}
    if case == "missing_column":
        frame = frame.rename(columns={"label": "sentiment"})
    elif case == "unknown_label":
        extra["labels"] = "[pos, other]"
    elif case == "empty_text":
        frame.loc[7, "text"] = "   "
    elif case == "one_class":
        frame["label"] = "pos"
        extra["balance"] = False
    elif case == "no_targets":
        extra["target_modules"] = "[attn_q]"
    elif case == "missing_model":
        extra["model"] = str(tmp_path / "nowhere")
    data = tmp_path / "d.csv"
    frame.to_csv(data, index=False)
    out = tmp_path / "runs"
    args = ["train", *tiny_overrides(gemma3_dir, data, out, **extra)]
    if case == "unknown_key":
        args += ["--set", "lerning_rate=0.1"]
    code, err = run_cli(args, capsys)
    assert code != 0
    errors = [line for line in err if line.startswith("loracls: ")]
    assert errors == [err[-1]] and message in err[-1], err
    assert not any("Traceback" in line for line in err)
    assert not out.exists()


def test_run_commands_refuse_a_non_run(tmp_path, capsys):
    code, err = run_cli(["evaluate", str(tmp_path)], capsys)
    assert code == 2 and "not a finished loracls run" in err[0] and len(err) == 1
    code, err = run_cli(["predict", str(tmp_path), "--text", "x"], capsys)
    assert code == 2 and len(err) == 1


def test_modules_lists_and_matches(gemma3_dir, capsys):
    assert main(["modules", str(gemma3_dir), "--pattern", "q_proj", "--pattern", "nothing_here"]) == 0
    out = capsys.readouterr().out
    assert "model.layers.*.self_attn.q_proj" in out and "Linear 32->32" in out and "x2" in out
    assert "pattern 'q_proj' matches 2 module(s)" in out
    assert "pattern 'nothing_here' matches 0 module(s)" in out


COMMAND_LINES = yaml.safe_load((Path(__file__).parent / "hostile" / "command_lines.yaml").read_text())


@pytest.mark.parametrize("case", COMMAND_LINES, ids=lambda case: " ".join(case["args"])[:40])
def test_hostile_command_lines_are_one_line_exit_2(case, trained_runs, tmp_path, capsys):
    run = tmp_path / "run"
    if "RUN" in " ".join(case["args"]):
        shutil.copytree(trained_runs["gemma3"], run)
    out = tmp_path / "out"
    out.mkdir()
    args = [arg.replace("RUN", str(run)).replace("OUT", str(out)) for arg in case["args"]]
    code, err = run_cli(args, capsys)
    assert code == 2 and err and err[-1].startswith("loracls: ") and re.search(case["message"], err[-1]), err
    assert not any("Traceback" in line for line in err)
    assert [line for line in err if line.startswith("loracls: ")] == [err[-1]]


def test_one_set_flag_takes_several_pairs():
    from loracls.cli import build_parser
    from loracls.config_reader import load_config

    args = build_parser().parse_args(["train", "--set", "r=4", "lora_alpha=8", "--set", "epochs=2"])
    assert args.set == ["r=4", "lora_alpha=8", "epochs=2"]
    config = load_config(args.config, args.set)
    assert (config.r, config.lora_alpha, config.epochs) == (4, 8, 2)
