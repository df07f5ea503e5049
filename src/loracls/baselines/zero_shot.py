"""Zero-shot baseline: the base causal LM scores each label's verbalizer by log-probability after a prompt
(no free generation), plus contextual calibration (Zhao et al. 2021): the label probabilities of
content-free inputs divide out the prompt's own bias.
"""

from __future__ import annotations

import re
import time

import numpy as np

from loracls.calibration import reliability
from loracls.config import EMBEDDED_DATA, Config, check_template
from loracls.data.splits import Dataset
from loracls.errors import Log, LoraclsError
from loracls.metrics import classification_metrics
from loracls.model.checkpoint import load_causal_lm
from loracls.model.label_scoring import LabelPrompt, LabelScorer
from loracls.runs import BaselineRecord

CONTENT_FREE = ["N/A", "", "[MASK]"]
DEFAULT_TEMPLATE = "Text: {text}\nAnswer with one of: {choices}.\nAnswer:"
EMBEDDED_TEMPLATE = "Movie review: {text}\nIs this review positive or negative?\nAnswer:"
EMBEDDED_VERBALIZERS = {"fresh": "positive", "rotten": "negative"}


def _verbalizers(config: Config) -> dict[str, str]:
    """label name -> the word the prompt scores: the config's, or the embedded data set's own."""
    return config.verbalizers or (EMBEDDED_VERBALIZERS if config.data == EMBEDDED_DATA else {})


def prompt_setup(config: Config, id2label: dict[int, str]) -> tuple[str, list[str]]:
    """(template, verbalizer word per label id). The embedded data set has its own sensible defaults."""
    check_verbalizers(config, id2label)
    mapping = _verbalizers(config)
    words = [mapping.get(id2label[i], id2label[i]) for i in sorted(id2label)]
    template = config.prompt_template or (EMBEDDED_TEMPLATE if config.data == EMBEDDED_DATA else DEFAULT_TEMPLATE)
    check_template("prompt_template", template, ("text", "choices"))
    return template, words


def check_verbalizers(config: Config, id2label: dict[int, str]) -> None:
    """Verbalizers may name only labels the data has (a typo would otherwise score the bare label name)."""
    unknown = sorted(set(config.verbalizers or {}) - set(id2label.values()))
    if unknown:
        raise LoraclsError(
            f"config: verbalizers name labels the data does not have: {', '.join(unknown)} "
            f"(labels: {', '.join(id2label[i] for i in sorted(id2label))})"
        )


# a label name that is a code, not a word: digits (`0`, `label_3`, `C1`), an underscore, a single character,
# or a short all-capitals abbreviation (`ABBR`, `LOC`, `HUM`); a prompt that scores such a name says nothing
_CODE = re.compile(r".*[0-9_].*|.|[A-Z]{2,5}")


def code_labels(config: Config, id2label: dict[int, str]) -> list[str]:
    """The label names the zero-shot prompt would score as they are although they are codes (no verbalizer)."""
    mapping = _verbalizers(config)
    return [name for name in id2label.values() if name not in mapping and _CODE.fullmatch(name.strip())]


def codes_reason(codes: list[str]) -> str:
    shown = ", ".join(codes[:6]) + (", ..." if len(codes) > 6 else "")
    example = ", ".join(f"{name}: <a word>" for name in codes[:2])
    return (
        f"the label names {shown} are codes, not words: a prompt that scores them is not a meaningful "
        f"zero-shot result; give verbalizers ({{{example}}}) to run it"
    )


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def calibrate(label_logprobs: np.ndarray, content_free_logprobs: np.ndarray) -> np.ndarray:
    """Contextual calibration: divide label probabilities by the mean content-free label probabilities."""
    p_cf = _softmax(content_free_logprobs).mean(axis=0)
    return _softmax(np.log(_softmax(label_logprobs)) - np.log(p_cf))


def run_baseline(
    model_dir, tokenizer, dataset: Dataset, config: Config, runtime, log: Log = print
) -> tuple[BaselineRecord, np.ndarray, np.ndarray]:
    """Zero-shot metrics (plain and calibrated) on the test split and the two probability arrays."""
    texts, labels, id2label = dataset.test.texts, dataset.test.labels, dataset.id2label
    template, words = prompt_setup(config, id2label)
    try:
        model = load_causal_lm(model_dir).to(runtime.device).eval()
    except LoraclsError as exc:
        raise LoraclsError(f"baseline: {exc}") from None
    scorer = LabelScorer(
        model, tokenizer, LabelPrompt(template, words, config.max_length), config.eval_batch_size, runtime
    )
    started = time.perf_counter()
    scores = scorer.label_logprobs(texts, progress=True)
    texts_per_second = len(texts) / max(time.perf_counter() - started, 1e-9)
    content_free = scorer.label_logprobs(CONTENT_FREE)
    plain = _softmax(scores)
    calibrated = calibrate(scores, content_free)
    result = BaselineRecord(
        prompt_template=template,
        verbalizers={id2label[i]: w for i, w in enumerate(words)},
        zero_shot=classification_metrics(labels, plain, id2label),
        calibrated=classification_metrics(labels, calibrated, id2label),
        content_free_probabilities=_softmax(content_free).mean(axis=0).round(4).tolist(),
        texts_per_second=texts_per_second,
        calibrated_ece=reliability(calibrated, labels)[0],
        parameters=sum(p.numel() for p in model.parameters()),
    )
    log(
        f"baseline (zero-shot, {len(texts)} test examples): accuracy {result.zero_shot.accuracy:.4f}, "
        f"calibrated {result.calibrated.accuracy:.4f}"
    )
    del model
    return result, plain, calibrated
