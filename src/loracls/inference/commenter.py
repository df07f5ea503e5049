"""A finished label_and_comment run, reloaded: each text's label scored after the prompt (calibrated by the
run's temperature), then its comment generated after that label. The base causal LM with the saved adapter."""

from __future__ import annotations

import numpy as np

from loracls import runs
from loracls.data.batching import Encoded
from loracls.errors import Log
from loracls.hardware import setup_runtime
from loracls.model.generation import Decoding, comments_after_labels
from loracls.model.label_scoring import LabelPrompt, LabelScorer
from loracls.model.scorers import LabelWordScorer
from loracls.model.source import resolve_model_dir
from loracls.problems import prediction_rows
from loracls.problems.label_and_comment import label_words, prompt_template


class Commenter:
    """The server's classifier interface too (`encode`, `logits`, `calibrated`, `/info`'s fields), plus
    `comments`: `serve` answers /classify with each text's comment."""

    writes_comments = True
    long_text = "truncate"

    def __init__(
        self, run_path: str, log: Log = print, batch_size: int | None = None, device: str | None = None, precision=None
    ):
        run = runs.check_run_dir(run_path)
        config = runs.read_config(run)
        self.id2label, self.decision = runs.read_labels(run), runs.read_decision(run)
        self.labels = [self.id2label[i] for i in range(len(self.id2label))]
        self.name, self.max_length, self.input_template = run.name, config.max_length, config.input_template
        self.precision = precision or "fp32"  # comments are compared in fp32 by the export check
        self.runtime = setup_runtime(device or config.device, self.precision, config.threads)
        self.batch_size, self.max_comment_tokens = batch_size or config.eval_batch_size, config.max_comment_tokens
        self.comment_candidates = config.comment_candidates
        model_dir = resolve_model_dir(config.model, log)
        model, self.tokenizer = LabelWordScorer().load(config, model_dir, self.id2label, run / runs.ADAPTER)
        self.model = model.to(self.runtime.device).eval()
        self.source = f"{config.model} + {run / runs.ADAPTER}"
        words = label_words(config.verbalizers, self.id2label)
        prompt = LabelPrompt(prompt_template(config.input_template), words, config.max_length)
        self.scorer = LabelScorer(self.model, self.tokenizer, prompt, self.batch_size, self.runtime)

    def probabilities(self, texts: list[str], progress: bool = False) -> np.ndarray:
        return self.decision.probabilities(self.scorer.label_logprobs(texts, progress))

    @property
    def temperature(self) -> float:
        return self.decision.temperature

    def encode(self, texts: list[str]) -> Encoded:
        """The prompts the label words are scored after (texts cut to max_length tokens inside them)."""
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        return Encoded(self.scorer._prompt_ids(texts), list(range(len(texts))), [n > self.max_length for n in lengths])

    def logits(self, ids: list[list[int]], progress: bool = False, max_tokens: int | None = None) -> np.ndarray:
        """Each label word's log-probability after each prompt (the label "logits": softmax gives p(label))."""
        return self.scorer.prompt_logprobs(ids)

    def calibrated(self, logits: np.ndarray) -> np.ndarray:
        return self.decision.probabilities(logits)

    def served_runs(self) -> dict:
        return {self.name: self}

    def score(self, ids: list[list[int]], models: list[str], max_tokens: int | None = None) -> np.ndarray:
        return self.logits(ids, max_tokens=max_tokens)

    def comments(self, texts: list[str], chosen) -> list[str]:
        """Each text's comment, generated (bounded; greedy, or the run's candidates rule) after its chosen label."""
        decoding = Decoding(self.max_comment_tokens, self.batch_size, self.runtime, self.comment_candidates)
        return comments_after_labels(self.model, self.tokenizer, self.scorer, texts, chosen, decoding).texts

    def predict(self, texts: list[str]) -> list[dict]:
        """Prediction rows (`text`, `prediction`, `probabilities`) with each text's `comment`."""
        probs = self.probabilities(texts)
        comments = self.comments(texts, self.decision.chosen(probs))
        rows = prediction_rows(texts, None, probs, self.id2label, self.decision)
        return [{**row.to_json(), "comment": comment} for row, comment in zip(rows, comments)]
