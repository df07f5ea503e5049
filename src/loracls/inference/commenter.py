"""A finished label_and_comment run, reloaded: each text's label scored after the prompt (calibrated by the
run's temperature), then its comment generated after that label. The base causal LM with the saved adapter."""

from __future__ import annotations

import numpy as np
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from loracls import runs
from loracls.errors import LoraclsError, first_line
from loracls.hardware import setup_runtime
from loracls.model.generation import generate
from loracls.model.label_scoring import LabelScorer
from loracls.model.source import resolve_model_dir
from loracls.model.tokenizer import load_tokenizer
from loracls.problems import prediction_rows
from loracls.problems.label_and_comment import COMMENT_SEPARATOR, label_words, prompt_template


class Commenter:
    def __init__(self, run_path: str, log=print, batch_size: int | None = None, device: str | None = None):
        run = runs.check_run_dir(run_path)
        config = runs.read_config(run)
        self.id2label, self.decision = runs.read_labels(run), runs.read_decision(run)
        self.runtime = setup_runtime(device or config.device, "fp32", config.threads)
        self.batch_size, self.max_comment_tokens = batch_size or config.eval_batch_size, config.max_comment_tokens
        model_dir = resolve_model_dir(config.model, log)
        self.tokenizer = load_tokenizer(model_dir, lambda *a: None)
        try:
            base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
            self.model = PeftModel.from_pretrained(base, str(run / runs.ADAPTER)).to(self.runtime.device).eval()
        except Exception as exc:
            raise LoraclsError(f"{run}: cannot load the adapter on {model_dir}: {first_line(exc, 200)}") from None
        self.scorer = LabelScorer(
            self.model, self.tokenizer, prompt_template(config.input_template),
            label_words(config.verbalizers, self.id2label), config.max_length, self.batch_size, self.runtime,
        )  # fmt: skip

    def probabilities(self, texts: list[str], progress: bool = False) -> np.ndarray:
        return self.decision.probabilities(self.scorer.label_logprobs(texts, progress))

    def predict(self, texts: list[str]) -> list[dict]:
        """Prediction rows (`text`, `prediction`, `probabilities`) with each text's `comment`."""
        probs = self.probabilities(texts)
        separator = self.tokenizer(COMMENT_SEPARATOR, add_special_tokens=False)["input_ids"]
        prompts = self.scorer.answer_prompts(texts, self.decision.chosen(probs), separator)
        comments = generate(self.model, self.tokenizer, prompts, self.max_comment_tokens, self.batch_size, self.runtime)
        rows = prediction_rows(texts, None, probs, self.id2label, self.decision)
        return [{**row.to_json(), "comment": comment} for row, comment in zip(rows, comments.texts)]
