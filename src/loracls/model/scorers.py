"""How a problem's model turns texts into label scores: the two scorers, registered by name.

- `head`: the decoder with a classification head (transformers' own class or the generic one) and LoRA on its
  attention; the head's logits are the label scores (single_label, multi_label).
- `label_words`: the causal LM itself with LoRA; each label word's log-probability after the prompt is the
  label score, and a comment is generated after the chosen label (label_and_comment).

Each Problem names its scorer (`Problem.scorer`). The training job (jobs/train.py) runs the same phases for
both through this protocol; `load` is the one place a run's base model and saved adapter are read back.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np
import torch

from loracls.config import Config
from loracls.data.batching import Encoded, TextEncoder, TrainSet, check_texts_have_tokens
from loracls.data.splits import Dataset, Split, class_weight_vector
from loracls.errors import Log, quiet
from loracls.hardware import Runtime
from loracls.metrics import comment_scores
from loracls.model.checkpoint import load_causal_lm
from loracls.model.classifier import HeadSpec, check_max_length, init_head_from_verbalizers, load_classifier
from loracls.model.generation import Decoding, Generated, comments_after_labels
from loracls.model.label_scoring import LabelPrompt, LabelScorer
from loracls.model.lora import LoraReport, LoraSpec, apply_causal_lora
from loracls.model.methods import method_named, method_of
from loracls.model.scoring import Batching, evaluate, predict_logits
from loracls.model.tokenizer import load_tokenizer
from loracls.problems import Decision, Evaluation, Problem, evaluation, training_sequence
from loracls.problems.label_and_comment import COMMENT_SEPARATOR, label_words, prompt_template
from loracls.runs import CommentMetrics, UntrainedRecord

__all__ = ["Built", "Setup", "Scorer", "HeadScorer", "LabelWordScorer", "UntrainedRecord", "scorer_for"]


@dataclass(frozen=True)
class Setup:
    """What a scorer builds from: the run's config, its data, the base model's directory, the runtime, the log."""

    config: Config
    dataset: Dataset
    model_dir: Path
    runtime: Runtime
    log: Log


@dataclass
class Built:
    """A scorer's model for training: the PEFT model, its tokenizer, the LoRA report, each split's encoded
    inputs (the head scorer's; the label-word scorer builds its prompts itself), the sizes the metrics record,
    and a few training inputs for the finite-forward check."""

    model: torch.nn.Module
    tokenizer: object
    lora: LoraReport
    hidden_size: int
    parameters: int
    probe: list[list[int]]
    encoded: dict[str, Encoded] = field(default_factory=dict)
    words: list[str] = field(default_factory=list)  # label_words: the word of each label id


class Scorer(Protocol):
    name: ClassVar[str]

    def build(self, setup: Setup, head_words: list[str] | None = None) -> Built:
        """Base model + LoRA, on the runtime's device; every split encoded; nothing written."""

    def train_set(self, setup: Setup, built: Built) -> TrainSet: ...

    def validate(self, setup: Setup, built: Built) -> Callable[[torch.nn.Module], Evaluation]:
        """A pure `evaluate(model) -> Evaluation` of the validation split, with the untuned decision."""

    def logits(self, setup: Setup, built: Built, split: str) -> np.ndarray:
        """Label scores per text of a split (eval mode; windows averaged)."""

    def untrained(self, setup: Setup, built: Built) -> UntrainedRecord | None:
        """What the scorer's model gives before training (None: nothing worth a rung, e.g. a random head)."""

    def extras(self, setup: Setup, built: Built, chosen: np.ndarray) -> tuple[list[dict], CommentMetrics] | None:
        """Per test row extra fields and their metrics (label_words: the comments), or None."""

    def load(self, config: Config, model_dir: Path, id2label: dict[int, str], adapter: Path) -> tuple:
        """(the base model with the saved adapter: PEFT, fp32, on the CPU; its tokenizer)."""


SCORERS: dict[str, type[Scorer]] = {}


def register(cls: type[Scorer]) -> type[Scorer]:
    SCORERS[cls.name] = cls
    return cls


def scorer_for(problem: Problem) -> Scorer:
    return SCORERS[problem.scorer]()


def _adapter_on(base: torch.nn.Module, adapter: Path) -> torch.nn.Module:
    """The run's trained weights on a fresh base, by the method that saved them (model/methods.py)."""
    return method_of(adapter).load_onto(base, adapter)


@register
class HeadScorer:
    name = "head"

    def build(self, setup: Setup, head_words: list[str] | None = None) -> Built:
        config, dataset, log = setup.config, setup.dataset, setup.log
        check_max_length(setup.model_dir, config.max_length)
        torch.manual_seed(config.seed)  # head init, LoRA init and dropout follow the seed
        head = HeadSpec.of(config)
        loaded = load_classifier(
            setup.model_dir, dataset.id2label, log=log, quantization=config.quantization, head=head
        )
        if head_words is not None:
            _verbalizer_head(loaded, head_words, log)
        model, lora = method_named(config.method).apply(loaded.model, config, setup.runtime, log)
        encoded = encode_splits(loaded.tokenizer, dataset, config, log)
        # unknown label names are refused here, before anything is written
        weights = class_weight_vector(config.class_weights, dataset)
        if weights is not None:
            log("loss: class weights " + ", ".join(f"{dataset.id2label[i]}={w:.3g}" for i, w in enumerate(weights)))
        if config.quantization == "none":
            model.to(setup.runtime.device)
        probe = encoded["train"].ids[:4]
        return Built(model, loaded.tokenizer, lora, loaded.hidden_size, loaded.parameters, probe, encoded)

    def train_set(self, setup: Setup, built: Built) -> TrainSet:
        dataset, train = setup.dataset, built.encoded["train"]
        weights = class_weight_vector(setup.config.class_weights, dataset)
        return TrainSet(
            ids=train.ids,
            labels=[dataset.train.labels[i] for i in train.owner],
            num_labels=len(dataset.id2label),
            pad_id=built.tokenizer.pad_token_id,
            problem=dataset.kind,
            class_weight=None if weights is None else torch.tensor(weights, device=setup.runtime.device),
        )

    def validate(self, setup: Setup, built: Built) -> Callable[[torch.nn.Module], Evaluation]:
        return functools.partial(
            evaluate,
            encoded=built.encoded["validation"],
            split=setup.dataset.validation,
            id2label=setup.dataset.id2label,
            decision=Decision(setup.config.problem),  # thresholds are tuned after training: 0.5 until then
            batching=_batching(setup, built),
        )

    def logits(self, setup: Setup, built: Built, split: str) -> np.ndarray:
        encoded = built.encoded[split]
        return encoded.per_text(predict_logits(built.model, encoded.ids, _batching(setup, built)))

    def untrained(self, setup: Setup, built: Built) -> UntrainedRecord | None:
        return None  # a new head says nothing: the ladder's zero-shot prompt is the untrained rung

    def extras(self, setup: Setup, built: Built, chosen: np.ndarray) -> tuple[list[dict], CommentMetrics] | None:
        return None

    def load(self, config: Config, model_dir: Path, id2label: dict[int, str], adapter: Path) -> tuple:
        loaded = load_classifier(model_dir, id2label, log=quiet, head=HeadSpec.of(config))
        return _adapter_on(loaded.model, adapter), loaded.tokenizer


def _verbalizer_head(loaded, words: list[str], log: Log) -> None:
    ids = [loaded.tokenizer(" " + word, add_special_tokens=False)["input_ids"] for word in words]
    init_head_from_verbalizers(loaded.model, loaded.model_dir, [token[0] for token in ids])
    several = [w for w, token in zip(words, ids) if len(token) > 1]
    log(
        f"head: initialised from the LM head rows of the verbalizers {', '.join(words)}"
        + (f" (first token only for {', '.join(several)})" if several else "")
    )


def encode_splits(tokenizer, dataset: Dataset, config: Config, log: Log) -> dict[str, Encoded]:
    """Every split's token ids under the long_text policy, encoded once for the whole job (with chunks every
    window of a long training text is an example with the text's label, or only its first window with
    `chunk_training: first`; an evaluated text is the mean of its windows' logits); how many texts are
    longer than max_length (and what `long_text` does with them) is said, never silent."""
    check_texts_have_tokens(tokenizer, {name: getattr(dataset, name).texts for name in ("train", "validation", "test")})
    encoded, encoder = {}, TextEncoder.for_config(config, tokenizer)
    first_only = config.long_text == "chunks" and config.chunk_training == "first"
    train_encoder = TextEncoder.for_config(config, tokenizer, "truncate") if first_only else encoder
    done = {"truncate": "truncated", "head_tail": "cut to their head and tail", "chunks": "split into windows"}
    for name in ("train", "validation", "test"):
        texts = getattr(dataset, name).texts
        encoded[name] = (train_encoder if name == "train" else encoder).encode(texts)
        count = sum(encoded[name].long)
        if count:
            note = (
                f"data: {count} of {len(texts)} {name} texts ({100 * count / len(texts):.1f}%) are "
                f"longer than max_length {config.max_length} tokens and are {done[config.long_text]} "
                f"(long_text: {config.long_text})"
            )
            dataset.notes.append(note)
            log(note)
    return encoded


@register
class LabelWordScorer:
    """The causal LM trained on prompt + label word + newline + comment + EOS, the loss on the label word and
    the comment only (`problems.label_and_comment`); validation and test score each label word after the
    prompt (`model.label_scoring`, the zero-shot baseline's scorer), so the label is always in the label set."""

    name = "label_words"

    def build(self, setup: Setup, head_words: list[str] | None = None) -> Built:
        config, log = setup.config, setup.log
        words = label_words(config.verbalizers, setup.dataset.id2label)
        tokenizer = load_tokenizer(setup.model_dir, log)
        torch.manual_seed(config.seed)
        base = load_causal_lm(setup.model_dir, log=log)
        model, lora = apply_causal_lora(base, LoraSpec.of(config), log)
        model.to(setup.runtime.device)
        built = Built(model, tokenizer, lora, model.config.get_text_config().hidden_size, lora.total, [], words=words)
        built.probe = _label_scorer(setup, built)._prompt_ids(setup.dataset.train.texts[:4])
        return built

    def train_set(self, setup: Setup, built: Built) -> TrainSet:
        """Prompt + label word + separator + comment (at most max_comment_tokens) + EOS per training text."""
        scorer, tokenizer, config, split = (
            _label_scorer(setup, built),
            built.tokenizer,
            setup.config,
            setup.dataset.train,
        )
        separator = tokenizer(COMMENT_SEPARATOR, add_special_tokens=False)["input_ids"]
        comments = tokenizer(split.comments, add_special_tokens=False)["input_ids"]
        ids, targets = [], []
        for prompt, label, comment in zip(scorer._prompt_ids(split.texts), split.labels, comments):
            sequence, target = training_sequence(
                prompt, scorer.verbalizer_ids[label], separator, comment[: config.max_comment_tokens],
                tokenizer.eos_token_id, config.label_token_weight,
            )  # fmt: skip
            ids.append(sequence)
            targets.append(target)
        return TrainSet(ids, targets, len(setup.dataset.id2label), tokenizer.pad_token_id, setup.dataset.kind)

    def validate(self, setup: Setup, built: Built) -> Callable[[torch.nn.Module], Evaluation]:
        split, dataset, decision = setup.dataset.validation, setup.dataset, Decision(setup.config.problem)

        def validate(model) -> Evaluation:
            probs = decision.probabilities(label_logprobs(setup, built, split.texts))
            return evaluation(split.texts, split.labels, probs, dataset.id2label, decision)

        return validate

    def logits(self, setup: Setup, built: Built, split: str) -> np.ndarray:
        return label_logprobs(setup, built, getattr(setup.dataset, split).texts)

    def untrained(self, setup: Setup, built: Built) -> UntrainedRecord:
        """The same prompt with no training (the adapter disabled, before its first step)."""
        test = setup.dataset.test
        with built.model.disable_adapter():
            chosen = label_logprobs(setup, built, test.texts).argmax(axis=1)
            written = comments(setup, built, test.texts, chosen)
        accuracy = float((chosen == np.asarray(test.labels)).mean())
        rouge_l, _ = comment_scores(written.texts, test.comments)
        setup.log(
            f"baseline (zero-shot, the same prompt untrained): accuracy {accuracy:.4f}, comments ROUGE-L {rouge_l:.4f}"
        )
        return UntrainedRecord(accuracy, rouge_l)

    def extras(self, setup: Setup, built: Built, chosen: np.ndarray) -> tuple[list[dict], CommentMetrics]:
        return test_comments(setup, built, setup.dataset.test, chosen)

    def load(self, config: Config, model_dir: Path, id2label: dict[int, str], adapter: Path) -> tuple:
        tokenizer = load_tokenizer(model_dir, quiet)
        return _adapter_on(load_causal_lm(model_dir), adapter), tokenizer


def _batching(setup: Setup, built: Built) -> Batching:
    return Batching(built.tokenizer.pad_token_id, setup.config.eval_batch_size, setup.runtime)


def _label_scorer(setup: Setup, built: Built) -> LabelScorer:
    config = setup.config
    prompt = LabelPrompt(prompt_template(config.input_template), built.words, config.max_length)
    return LabelScorer(built.model, built.tokenizer, prompt, config.eval_batch_size, setup.runtime)


def label_logprobs(setup: Setup, built: Built, texts: list[str]) -> np.ndarray:
    """log p(label word | prompt) per text and label, with the model in eval mode (no dropout)."""
    was_training = built.model.training
    built.model.eval()
    try:
        return _label_scorer(setup, built).label_logprobs(texts)
    finally:
        built.model.train(was_training)


def comments(setup: Setup, built: Built, texts: list[str], chosen, candidates: int | None = None) -> Generated:
    """The model's comments after each text's chosen label (at most max_comment_tokens; greedy, or the first
    of `comment_candidates` beams that reads back as the label)."""
    config = setup.config
    decoding = Decoding(
        config.max_comment_tokens, config.eval_batch_size, setup.runtime, candidates or config.comment_candidates
    )
    return comments_after_labels(built.model, built.tokenizer, _label_scorer(setup, built), texts, chosen, decoding)


def test_comments(setup: Setup, built: Built, test: Split, chosen: np.ndarray) -> tuple[list[dict], CommentMetrics]:
    """Each test text's comment after its chosen label, scored against the reference; with several candidates,
    the greedy comments too (what the candidates buy); and how often the reference comments themselves read
    back as their label. Returns the rows' extra fields and the record."""
    started = time.perf_counter()
    generated = comments(setup, built, test.texts, chosen)
    seconds = time.perf_counter() - started
    rouge_l, chrf = comment_scores(generated.texts, test.comments)
    read_back = label_logprobs(setup, built, generated.texts).argmax(axis=1)
    references = label_logprobs(setup, built, test.comments).argmax(axis=1)
    rows = [{"comment": c, "reference_comment": r} for c, r in zip(generated.texts, test.comments)]
    record = CommentMetrics(
        examples=len(test.texts),
        rouge_l=rouge_l,
        chrf=chrf,
        consistency=_share(read_back == chosen),
        mean_tokens=float(np.mean(generated.tokens)) if generated.tokens else 0.0,
        tokens_per_second=sum(generated.tokens) / max(seconds, 1e-9),
        candidates=setup.config.comment_candidates,
        reference_consistency=_share(references == np.asarray(test.labels)),
    )
    if record.candidates > 1:
        greedy = comments(setup, built, test.texts, chosen, candidates=1)
        record.greedy_rouge_l, _ = comment_scores(greedy.texts, test.comments)
        record.greedy_consistency = _share(label_logprobs(setup, built, greedy.texts).argmax(axis=1) == chosen)
    return rows, record


def _share(agrees: np.ndarray) -> float:
    return float(np.mean(agrees)) if len(agrees) else 0.0
