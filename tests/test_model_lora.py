import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import make_tokenizer, write_tiny_model
from loracls.errors import LoraclsError
from loracls.model.classifier import classifier_class, is_generic, load_classifier
from loracls.model.lora import LoraSpec, apply_lora, check_targets, match_targets
from loracls.model.tokenizer import fix_special_tokens, load_tokenizer

LABELS = {0: "neg", 1: "pos"}
quiet = lambda *a: None  # noqa: E731


def test_pad_token_comes_from_eos_and_reaches_the_model_config(tmp_path):
    directory = write_tiny_model(tmp_path / "m", pad=False)
    tokenizer = load_tokenizer(directory, quiet)
    assert tokenizer.pad_token == "<eos>"
    loaded = load_classifier(directory, LABELS, log=quiet)
    assert loaded.model.config.pad_token_id == loaded.tokenizer.pad_token_id == tokenizer.convert_tokens_to_ids("<eos>")


def test_tokenizer_without_pad_eos_unk_gets_a_new_pad():
    tokenizer = make_tokenizer(pad=False)
    tokenizer.eos_token = None
    tokenizer.unk_token = None
    notes = fix_special_tokens(tokenizer, quiet)
    assert tokenizer.pad_token == "<pad>"
    assert any("added a new" in n for n in notes) and any("no unk" in n for n in notes)


def test_slow_tokenizer_fallback(gemma3_dir, monkeypatch):
    from transformers import AutoTokenizer

    original = AutoTokenizer.from_pretrained
    calls = []

    def fake(path, use_fast=True, **kw):
        calls.append(use_fast)
        if use_fast:
            raise OSError("no fast tokenizer here")
        return original(path, **kw)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", fake)
    messages = []
    tokenizer = load_tokenizer(gemma3_dir, messages.append)
    assert calls == [True, False] and tokenizer.pad_token == "<pad>"
    assert "using the slow one" in messages[0]


def test_generic_head_for_gemma4(gemma4_dir, gemma3_dir):
    g4 = load_classifier(gemma4_dir, LABELS, log=quiet)
    assert is_generic(type(g4.model)) and type(g4.model).__name__ == "Gemma4TextForSequenceClassification"
    g3 = load_classifier(gemma3_dir, LABELS, log=quiet)
    assert not is_generic(type(g3.model))
    assert g4.hidden_size == 32 and g4.parameters == sum(p.numel() for p in g4.model.parameters())
    batch = torch.tensor([[2, 5, 6, 0, 0], [2, 7, 8, 9, 10]])
    logits = g4.model(input_ids=batch, attention_mask=(batch != 0).long()).logits
    assert logits.shape == (2, 2)
    # the head reads the last non-pad token: padding more does not change the first row
    longer = torch.tensor([[2, 5, 6, 0, 0, 0, 0]])
    again = g4.model(input_ids=longer, attention_mask=(longer != 0).long()).logits
    assert torch.allclose(logits[0], again[0], atol=1e-5)


def test_checkpoint_missing_weights_is_refused(tmp_path):
    directory = write_tiny_model(tmp_path / "m")
    weights = load_file(directory / "model.safetensors")
    dropped = {k: v for k, v in weights.items() if "layers.1.mlp" not in k}
    save_file(dropped, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(LoraclsError, match="missing 3 weight.*beyond the head"):
        load_classifier(directory, LABELS, log=quiet)


def test_lora_matches_and_trains_the_head(gemma3_dir):
    model = load_classifier(gemma3_dir, LABELS, log=quiet).model
    messages = []
    peft_model, report = apply_lora(model, LoraSpec(4, 8, 0.0, ["q_proj", "v_proj"]), messages.append)
    assert len(report.matched) == 4
    assert all(n.endswith(("q_proj", "v_proj")) for n in report.matched)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert any("score" in n for n in trainable) and any("lora_A" in n for n in trainable)
    assert not any("embed" in n for n in trainable)
    assert "trainable" in messages[-1]


@pytest.mark.parametrize(
    "patterns, message",
    [
        (["qkv_proj"], "match no module; linear modules here:.*q_proj"),
        (["embed_tokens"], "only embeddings"),
        (["score", "q_proj"], "classification head"),
        (["(unclosed"], "not a valid regex"),
    ],
)
def test_lora_refusals(gemma3_dir, patterns, message):
    model = load_classifier(gemma3_dir, LABELS, log=quiet).model
    with pytest.raises(LoraclsError, match=message):
        check_targets(model, patterns)


def test_regex_targets(gemma3_dir):
    model = load_classifier(gemma3_dir, LABELS, log=quiet).model
    assert match_targets(model, [r".*layers\.1\..*(q|k)_proj"]) == [
        "model.layers.1.self_attn.q_proj",
        "model.layers.1.self_attn.k_proj",
    ]


def test_frozen_head_is_refused(gemma3_dir, monkeypatch):
    import loracls.model.lora as lora

    model = load_classifier(gemma3_dir, LABELS, log=quiet).model
    peft_model, _ = apply_lora(model, LoraSpec(4, 8, 0.0, ["q_proj"]), quiet)
    for name, param in peft_model.named_parameters():
        if "score" in name:
            param.requires_grad_(False)
    with pytest.raises(LoraclsError, match="head 'score' is frozen"):
        lora.check_head_trainable(peft_model, "score")


def test_classifier_class_refuses_unknown_types():
    from transformers import ViTConfig

    with pytest.raises(LoraclsError, match="not a decoder"):
        classifier_class(ViTConfig())


def test_cpu_offload_is_refused():
    from types import SimpleNamespace

    from loracls.model.classifier import check_no_offload

    check_no_offload(SimpleNamespace(hf_device_map={"": 0}))
    check_no_offload(SimpleNamespace())
    with pytest.raises(LoraclsError, match="offloaded to CPU/disk.*6x slower than gradient accumulation"):
        check_no_offload(
            SimpleNamespace(
                hf_device_map={"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "score": "cpu"}
            )
        )


def test_hub_id_that_cannot_be_reached_is_one_line(monkeypatch):
    from loracls.model.source import resolve_model_dir

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LoraclsError, match="not a local path and the hub is not reachable") as info:
        resolve_model_dir("someone/some-model-that-is-not-cached", quiet)
    assert "\n" not in str(info.value)
    with pytest.raises(LoraclsError, match="model file not found"):
        resolve_model_dir("/nowhere/model.gguf", quiet)


def test_new_head_starts_at_zero_uniform_predictions(gemma3_dir):
    loaded = load_classifier(gemma3_dir, {0: "a", 1: "b", 2: "c"}, log=quiet)
    assert torch.count_nonzero(loaded.model.score.weight) == 0
    probs = torch.softmax(loaded.model(input_ids=torch.tensor([[2, 5, 6]])).logits, -1)
    assert torch.allclose(probs, torch.full((1, 3), 1 / 3))


@pytest.mark.parametrize("variant, field", [("rslora", "use_rslora"), ("dora", "use_dora")])
def test_lora_variants_are_peft_s(gemma3_dir, variant, field):
    from loracls.model.classifier import load_classifier

    model = load_classifier(gemma3_dir, {0: "neg", 1: "pos"}, log=lambda *_: None).model
    peft_model, _ = apply_lora(model, LoraSpec(4, 8, 0.0, ["q_proj"], variant), lambda *_: None)
    assert getattr(peft_model.peft_config["default"], field) is True
    if variant == "dora":
        assert any("lora_magnitude_vector" in name for name, _ in peft_model.named_parameters())
