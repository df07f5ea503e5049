"""Label scoring with a causal LM: log p(verbalizer | prompt) for every label, in one pass over the prompts
(no free generation), so the label is always in the label set and its probabilities can be calibrated."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from loracls.errors import LoraclsError


def left_padded(sequences: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        input_ids[row, width - len(seq) :] = torch.tensor(seq)
        mask[row, width - len(seq) :] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


@dataclass(frozen=True)
class LabelPrompt:
    """The prompt each label word is scored after: `template` with {text} (cut to `max_length` tokens) and
    {choices} (the words, comma-separated)."""

    template: str
    words: list[str]
    max_length: int


class LabelScorer:
    """Each label's verbalizer scored by log-probability after a prompt, from one pass over the prompts:
    the zero-shot baseline's scorer, and the label scorer of `label_and_comment` runs."""

    def __init__(self, model, tokenizer, prompt: LabelPrompt, batch_size: int, runtime):
        self.model, self.tokenizer, self.template = model, tokenizer, prompt.template
        self.max_length, self.batch_size, self.runtime = prompt.max_length, batch_size, runtime
        words = prompt.words
        self.choices = ", ".join(words)
        self.verbalizer_ids = [tokenizer(" " + w, add_special_tokens=False)["input_ids"] for w in words]
        if any(len(ids) == 0 for ids in self.verbalizer_ids):
            raise LoraclsError(f"a verbalizer tokenizes to nothing: {words}")

    def _prompt_ids(self, texts: list[str]) -> list[list[int]]:
        # the text is truncated, the instruction around it is kept
        text_ids = self.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=self.max_length)[
            "input_ids"
        ]
        texts = self.tokenizer.batch_decode(text_ids)
        return self.tokenizer([self.template.format(text=t, choices=self.choices) for t in texts])["input_ids"]

    @torch.inference_mode()
    def _batch_logprobs(self, prompts: list[list[int]]) -> np.ndarray:
        """log p(verbalizer | prompt) for every label, [len(prompts), labels], from ONE pass over the prompts:
        a verbalizer's first token is read from the prompt's last position; the rest of a multi-token
        verbalizer continues from the prompt's cached keys and values (a few tokens, not the prompt again)."""
        device = self.runtime.device
        batch = {k: v.to(device) for k, v in left_padded(prompts, self.tokenizer.pad_token_id).items()}
        longer = any(len(ids) > 1 for ids in self.verbalizer_ids)
        with self.runtime.autocast:
            out = self.model(**batch, use_cache=longer, logits_to_keep=1)
        first = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        scores = torch.stack([first[:, ids[0]] for ids in self.verbalizer_ids], dim=1)
        for k, ids in enumerate(self.verbalizer_ids):
            if len(ids) > 1:
                scores[:, k] += self._continuation(out.past_key_values, batch, ids)
        return scores.cpu().numpy()

    def _continuation(self, cache, batch: dict, ids: list[int]) -> torch.Tensor:
        """Sum of log p(ids[1:] | prompt, ids[:-1]) with the prompt's cache (copied: each label extends it)."""
        import copy

        rows, extra = batch["input_ids"].shape[0], len(ids) - 1
        device = batch["input_ids"].device
        tokens = torch.tensor(ids[:-1], device=device).expand(rows, -1)
        mask = torch.cat([batch["attention_mask"], torch.ones(rows, extra, dtype=torch.long, device=device)], dim=1)
        positions = batch["position_ids"][:, -1:] + 1 + torch.arange(extra, device=device)
        with self.runtime.autocast:
            logits = self.model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=copy.deepcopy(cache),
                use_cache=True,
            ).logits
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        target = torch.tensor(ids[1:], device=device).expand(rows, -1).unsqueeze(-1)
        return logprobs.gather(-1, target).squeeze(-1).sum(-1)

    def answer_prompts(self, texts: list[str], chosen, separator: list[int]) -> list[list[int]]:
        """Each text's prompt followed by its chosen label's word and the separator: where a comment starts."""
        prompts = self._prompt_ids(texts)
        return [prompt + self.verbalizer_ids[int(label)] + separator for prompt, label in zip(prompts, chosen)]

    def label_logprobs(self, texts: list[str], progress: bool = False) -> np.ndarray:
        return self.prompt_logprobs(self._prompt_ids(texts), progress)

    def prompt_logprobs(self, prompts: list[list[int]], progress: bool = False) -> np.ndarray:
        """log p(verbalizer | prompt) for prompts already tokenized, in length-sorted batches."""
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        scores = np.zeros((len(prompts), len(self.verbalizer_ids)))
        bar = tqdm(
            total=len(prompts), desc="baseline", unit="text", file=sys.stderr, mininterval=2.0, disable=not progress
        )
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            scores[rows] = self._batch_logprobs([prompts[i] for i in rows])
            bar.update(len(rows))
        bar.close()
        return scores
