"""Tiny randomly initialised decoders, a word-level tokenizer, and a learnable synthetic data set."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertModel,
    Gemma3TextConfig,
    Gemma4TextConfig,
    PreTrainedTokenizerFast,
)

POSITIVE = ["good", "great", "fine", "superb", "lovely", "brilliant", "charming", "moving"]
NEGATIVE = ["bad", "awful", "dull", "boring", "weak", "clumsy", "tedious", "messy"]
NEUTRAL = ["film", "movie", "plot", "actor", "scene", "story", "the", "a", "was", "very", "and", "script"]
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]


def synthetic_frame(n: int, seed: int = 0, classes: dict[str, list[str]] | None = None) -> pd.DataFrame:
    """Texts whose label is given by which sentiment words they contain."""
    classes = classes or {"pos": POSITIVE, "neg": NEGATIVE}
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = list(classes)[i % len(classes)]
        words = [rng.choice(NEUTRAL) for _ in range(rng.randint(3, 9))]
        for _ in range(rng.randint(1, 3)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(classes[label]))
        rows.append({"text": " ".join(words), "label": label})
    return pd.DataFrame(rows)


def make_tokenizer(pad: bool = True) -> PreTrainedTokenizerFast:
    vocab_words = SPECIALS + POSITIVE + NEGATIVE + NEUTRAL + [str(i) for i in range(1000)]
    vocab_words += ["ok", "meh", "neutral", "so-so"]
    vocab = {w: i for i, w in enumerate(vocab_words)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = {"eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>"}
    if pad:
        specials["pad_token"] = "<pad>"
    return PreTrainedTokenizerFast(tokenizer_object=backend, **specials)


# the small sizes every tiny decoder of the suite shares (tests/families.py too)
TINY_DECODER = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    max_position_embeddings=128,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
)


def tiny_config(kind: str, vocab_size: int):
    common = dict(TINY_DECODER, vocab_size=vocab_size)
    if kind == "gemma3":
        return Gemma3TextConfig(**common, sliding_window=16)
    if kind == "gemma4":
        return Gemma4TextConfig(
            **common,
            sliding_window=16,
            vocab_size_per_layer_input=vocab_size,
            hidden_size_per_layer_input=8,
            global_head_dim=16,
            layer_types=["sliding_attention", "full_attention"],
        )
    raise ValueError(kind)


def write_tiny_model(directory: Path, kind: str = "gemma3", pad: bool = True) -> Path:
    torch.manual_seed(0)
    tokenizer = make_tokenizer(pad=pad)
    config = tiny_config(kind, len(tokenizer))
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_tiny_encoder(directory: Path) -> Path:
    """A tiny randomly initialised BERT (the encoder baseline's mechanics; no download)."""
    torch.manual_seed(0)
    tokenizer = make_tokenizer()
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


TINY_ENCODER: list[Path] = []  # set once per session by the autouse fixture below


@pytest.fixture(scope="session", autouse=True)
def tiny_encoder_dir(tmp_path_factory) -> Path:
    directory = write_tiny_encoder(tmp_path_factory.mktemp("bert"))
    TINY_ENCODER[:] = [directory]
    return directory


@pytest.fixture(scope="session")
def gemma3_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("gemma3"), "gemma3")


@pytest.fixture(scope="session")
def gemma4_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("gemma4"), "gemma4")


@pytest.fixture(scope="session")
def data_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "train.csv"
    synthetic_frame(500).to_csv(path, index=False)
    return path


def tiny_overrides(model_dir: Path, data: Path, out: Path, **extra) -> list[str]:
    """--set arguments for a fast, learnable run on a tiny model."""
    values = {
        "model": str(model_dir),
        "data": str(data),
        "train_size": 240,
        "validation_size": 60,
        "test_size": 60,
        "max_length": 32,
        "batch_size": 8,
        "gradient_accumulation": 2,
        "epochs": 10,
        "learning_rate": 5e-3,
        "warmup_steps": 5,
        "eval_every": 10,
        "log_every": 5,
        "precision": "fp32",
        "output_dir": str(out),
        "run_name": "run",
        "r": 4,
        "lora_alpha": 8,
        "patience": None,
        "eval_batch_size": 16,
        "min_steps": None,  # epochs decide: the tests count steps
        "extend_epochs": 0,  # ... and no epoch is added while validation still improves
        "encoder_model": str(TINY_ENCODER[0]),
        "encoder_epochs": 2,
        "encoder_learning_rate": 1e-4,  # one value: the grid's cost is not what these tests are about
    }
    values.update(extra)
    args = []
    for key, value in values.items():
        args += ["--set", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
    return args


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory, gemma3_dir, gemma4_dir, data_csv):
    """One finished run per tiny model (Gemma 3 text: transformers' head; Gemma 4 text: the generic head)."""
    from loracls.cli import main

    runs = {}
    for kind, model_dir in (("gemma3", gemma3_dir), ("gemma4", gemma4_dir)):
        out = tmp_path_factory.mktemp(f"runs_{kind}")
        assert main(["train", *tiny_overrides(model_dir, data_csv, out)]) == 0
        runs[kind] = out / "run"
    return runs


def tiny_trainer(model_dir: Path, data: Path, run: Path, evaluate=None, runtime=None, lora=None, head=None, **values):
    """A Trainer on the tiny model, built as the train job builds it (speed-ups applied in its prepare phase),
    and the dataset. `evaluate(real, model) -> Evaluation` stands in for the job's validation (tests script
    what it returns); `lora` is (r, alpha, dropout, targets); `head(model)` runs before LoRA is applied."""
    import functools

    from loracls.config_reader import from_dict
    from loracls.data.batching import TextEncoder, TrainSet
    from loracls.data.spec import DataSpec
    from loracls.data.splits import class_weight_vector, load_dataset
    from loracls.hardware import setup_runtime
    from loracls.model.classifier import load_classifier
    from loracls.model.lora import LoraSpec, apply_lora
    from loracls.model.scoring import Batching
    from loracls.model.scoring import evaluate as evaluate_split
    from loracls.model.speedups import apply_speedups
    from loracls.problems import Decision
    from loracls.training.logger import RunLogger
    from loracls.training.loop import Trainer

    settings = {"model": str(model_dir), "data": str(data), "train_size": 40, "validation_size": 4, "test_size": 4}
    config = from_dict({**settings, "precision": "fp32", "output_dir": str(run.parent), **values})
    dataset, quiet = load_dataset(DataSpec.of(config)), lambda *a: None
    runtime = runtime or setup_runtime(config.device, config.precision, 1)
    torch.manual_seed(config.seed)
    loaded = load_classifier(model_dir, dataset.id2label, log=quiet)
    if head is not None:
        head(loaded.model)
    model, _ = apply_lora(loaded.model, LoraSpec(*(lora or (2, 4, 0.0, ["q_proj"]))), quiet)
    model.to(runtime.device)
    apply_speedups(model, runtime, False, False)
    encoder, pad_id = TextEncoder.for_config(config, loaded.tokenizer), loaded.tokenizer.pad_token_id
    train, validation = encoder.encode(dataset.train.texts), encoder.encode(dataset.validation.texts)
    weights = class_weight_vector(config.class_weights, dataset)
    train_set = TrainSet(
        train.ids, [dataset.train.labels[i] for i in train.owner], len(dataset.id2label), pad_id, dataset.kind,
        None if weights is None else torch.tensor(weights, device=runtime.device),
    )  # fmt: skip
    real = functools.partial(
        evaluate_split, encoded=validation, split=dataset.validation, id2label=dataset.id2label,
        decision=Decision(config.problem), batching=Batching(pad_id, 8, runtime),
    )  # fmt: skip
    validate = real if evaluate is None else functools.partial(evaluate, real)
    run.mkdir(parents=True, exist_ok=True)
    return Trainer(model, train_set, validate, config, runtime, RunLogger(run, quiet)), dataset
