"""A .gguf model converts once to a safetensors cache, as the embedded Gemma 3 270M does: a tiny Gemma 3 GGUF
(written by the `gguf` package's writer) reads back to the same weights and trains; a Gemma 4 GGUF, whose
settings transformers 5.25 reads only in part, is refused before anything is cached."""

import torch
import transformers

from conftest import TINY_DECODER, synthetic_frame, tiny_overrides
from families import BY_NAME, _text_fields
from gguf_files import VOCABULARY, write_gguf
from loracls.cli import main
from loracls.model import source


def _tiny(config_class, model_class, **fields):
    torch.manual_seed(0)
    values = {**TINY_DECODER, "vocab_size": len(VOCABULARY), **fields}
    return model_class(config_class(**values))


def test_a_gemma3_gguf_converts_to_the_same_weights_and_trains(tmp_path, monkeypatch):
    monkeypatch.setattr(source, "CACHE_ROOT", tmp_path / "cache")
    model = _tiny(transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM, sliding_window=8)
    gguf = write_gguf(model, tmp_path / "tiny-gemma3.gguf", "gemma3")
    converted = transformers.AutoModelForCausalLM.from_pretrained(source.resolve_model_dir(str(gguf)))
    ids = torch.tensor([[2, 40, 7, 90, 12, 5]])
    assert torch.equal(model(ids).logits, converted(ids).logits)
    synthetic_frame(200).to_csv(tmp_path / "train.csv", index=False)
    values = dict(train_size=100, validation_size=30, test_size=30, epochs=1, baselines=["tfidf"], merge=False)
    assert main(["train", *tiny_overrides(gguf, tmp_path / "train.csv", tmp_path / "out", **values)]) == 0
    assert (tmp_path / "out" / "run" / "metrics.json").is_file()


def test_a_gemma4_gguf_read_in_part_is_refused_and_nothing_cached(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(source, "CACHE_ROOT", tmp_path / "cache")
    fields = _text_fields(BY_NAME["gemma4-e2b"], len(VOCABULARY))
    model = _tiny(transformers.Gemma4TextConfig, transformers.Gemma4ForCausalLM, **fields)
    gguf = write_gguf(model, tmp_path / "tiny-gemma4.gguf", "gemma4")
    synthetic_frame(400).to_csv(tmp_path / "train.csv", index=False)
    assert main(["train", *tiny_overrides(gguf, tmp_path / "train.csv", tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(
        f"loracls: GGUF tiny-gemma4.gguf: transformers {transformers.__version__} does not read this gemma4_text "
        "GGUF fully:"
    ), err[-1]
    assert "in the file" in err[-1] and "use the model's safetensors release" in err[-1]
    assert not list((tmp_path / "cache" / "gguf").glob("tiny-gemma4*")) and not (tmp_path / "out").exists()
