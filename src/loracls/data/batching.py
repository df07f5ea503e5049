"""Tokenization and batching: token ids without padding, length-grouped training batches, length-sorted
evaluation batches, and dynamic padding to the longest sequence of a batch."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch

from loracls.errors import CutNotHere, LoraclsError, NoTokens, shown
from loracls.problems import Problem


def encode(tokenizer, texts: list[str], max_length: int, template: str | None = None) -> list[list[int]]:
    """Token ids per text, truncated to max_length; no padding here (dynamic padding happens per batch)."""
    return encode_with_truncation(tokenizer, texts, max_length, template)[0]


def _template_budget(tokenizer, max_length: int, template: str) -> int:
    overhead = len(tokenizer(template.format(text=""))["input_ids"]) + 2
    if overhead >= max_length:
        raise LoraclsError(
            f"max_length {max_length} leaves no room for text: the input_template takes "
            f"{overhead - 2} tokens; raise max_length or shorten the template"
        )
    return max_length - overhead


def check_texts_have_tokens(tokenizer, splits: dict[str, list[str]]) -> None:
    """Refuse texts the tokenizer turns into no tokens beyond its special ones: a model would read nothing
    but BOS/EOS, and a tokenizer that does not fit the data would give chance accuracy without a word."""
    empty = []
    for name, texts in splits.items():
        pieces = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
        empty += [(name, i, texts[i]) for i, ids in enumerate(pieces) if not ids]
    if empty:
        total = sum(len(texts) for texts in splits.values())
        name, index, text = empty[0]
        raise LoraclsError(
            f"data: {len(empty)} of {total} texts encode to no tokens, e.g. {name} text {index}: {text[:60]!r}: "
            f"the tokenizer does not fit this data"
        )


def encode_with_truncation(
    tokenizer, texts: list[str], max_length: int, template: str | None = None
) -> tuple[list[list[int]], list[bool]]:
    """(token ids, whether each text was cut to fit max_length).

    With a template (`"Movie review: {text}\nSentiment:"`) the text is placed inside it; when too long the
    text is shortened, never the template, so the pooled last token stays the template's last token.
    """
    if template is not None:
        budget = _template_budget(tokenizer, max_length, template)
        pieces = tokenizer(texts, add_special_tokens=False)["input_ids"]
        truncated = [len(ids) > budget for ids in pieces]
        texts = [
            template.format(text=t if len(ids) <= budget else tokenizer.decode(ids[:budget]))
            for t, ids in zip(texts, pieces)
        ]
        out = tokenizer(texts, truncation=True, max_length=max_length, padding=False)["input_ids"]
        return [list(ids) for ids in out], truncated
    full = tokenizer(texts, padding=False)["input_ids"]
    truncated = [len(ids) > max_length for ids in full]
    if not any(truncated):
        return [list(ids) for ids in full], truncated
    out = tokenizer(texts, truncation=True, max_length=max_length, padding=False)["input_ids"]
    return [list(ids) for ids in out], truncated


@dataclass
class Encoded:
    """Token ids of some texts: one row per text, or (long_text: chunks) one row per window of a text."""

    ids: list[list[int]]
    owner: list[int]  # the text each row belongs to
    long: list[bool]  # per text: longer than max_length (truncated, cut to head + tail, or chunked)

    @property
    def tokens(self) -> int:
        return sum(len(x) for x in self.ids)

    def per_text(self, logits: np.ndarray) -> np.ndarray:
        """A text's logits: its row's, or the mean of its windows' logits."""
        if len(self.owner) == len(self.long):
            return logits
        out = np.zeros((len(self.long), logits.shape[1]), dtype=logits.dtype)
        np.add.at(out, np.asarray(self.owner), logits)
        return out / np.bincount(self.owner, minlength=len(self.long))[:, None]


class TextEncoder:
    """Texts -> token ids under a `long_text` policy for texts longer than max_length:
    `truncate` (keep the start), `head_tail` (the first quarter and the last three quarters of the budget,
    as Sun et al. 2019 found best for long reviews), or `chunks` (windows of max_length every `stride` tokens;
    a text's prediction is the mean of its windows' logits)."""

    def __init__(
        self,
        tokenizer,
        max_length: int,
        template: str | None = None,
        long_text: str = "truncate",
        stride: int | None = None,
    ):
        self.tokenizer, self.max_length, self.template, self.long_text = tokenizer, max_length, template, long_text
        if long_text != "truncate":  # the text budget and framing of windows, worked out once
            self.prefix, self.suffix = self._special_tokens()
            self.budget = (
                _template_budget(tokenizer, max_length, template)
                if template
                else max_length - len(self.prefix) - len(self.suffix)
            )
            self.stride = min(stride or max(self.budget // 2, 1), self.budget)

    @classmethod
    def for_config(cls, config, tokenizer, long_text: str | None = None) -> TextEncoder:
        """The encoder a run's config asks for; `long_text` overrides its mode (`truncate`: first windows only)."""
        return cls(
            tokenizer, config.max_length, config.input_template, long_text or config.long_text, config.chunk_stride
        )

    def _special_tokens(self) -> tuple[list[int], list[int]]:
        """The tokens the tokenizer puts before and after a text's own (e.g. BOS), read once from a probe."""
        full = list(self.tokenizer("x")["input_ids"])
        core = list(self.tokenizer("x", add_special_tokens=False)["input_ids"])
        start = next(i for i in range(len(full)) if full[i : i + len(core)] == core)
        return full[:start], full[start + len(core) :]

    def _frame(self, window: list[int]) -> list[int]:
        """The window as the tokenizer would encode a text of exactly these tokens (its special tokens added)."""
        if self.template is not None:
            text = self.template.format(text=self.tokenizer.decode(window))
            return list(self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"])
        return self.prefix + list(window) + self.suffix

    def encode(self, texts: list[str], keep_end: bool = False, last_tokens: int | None = None) -> Encoded:
        """Token ids under the long_text policy; a text with no tokens of its own is refused (NoTokens), never
        scored as the bare special tokens or the template (a silent 0.5 / 0.5, or a reshape error).
        A client may ask a truncating run to cut from the other end: `keep_end` (TEI's truncation_direction
        Left) keeps a long text's end, `last_tokens` (vLLM's truncate_prompt_tokens) at most that many tokens
        of each prompt, its end, special tokens and template kept."""
        pieces = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        empty = [i for i, text_ids in enumerate(pieces) if not text_ids]
        if empty:
            raise NoTokens(
                f"{len(empty)} of {len(texts)} texts encode to no tokens, e.g. text {empty[0]}: "
                f"{shown(texts[empty[0]])}: the model would read nothing"
            )
        if (keep_end or last_tokens is not None) and self.long_text != "truncate":
            raise CutNotHere(
                f"this run reads long texts as {self.long_text}, not by truncation: cutting from the end "
                f"(truncation_direction, truncate_prompt_tokens) does not apply"
            )
        if self.long_text == "truncate":
            ids, long = encode_with_truncation(self.tokenizer, texts, self.max_length, self.template)
            if keep_end or last_tokens is not None:
                ids, long = self._cut_from_the_start(pieces, ids, long, last_tokens)
            return Encoded(ids, list(range(len(texts))), long)
        plain, long = encode_with_truncation(self.tokenizer, texts, self.max_length, self.template)
        ids, owner = [], []
        for i, (text_ids, is_long) in enumerate(zip(pieces, long)):
            windows = [plain[i]] if not is_long else self._windows(list(text_ids))
            ids += windows
            owner += [i] * len(windows)
        return Encoded(ids, owner, long)

    def _cut_from_the_start(self, pieces, ids, long, last_tokens: int | None):
        """Rows longer than the limit (max_length, or `last_tokens` where smaller) rebuilt from their text's
        last tokens, framed as the tokenizer frames a text (its special tokens, the template)."""
        limit = self.max_length if last_tokens is None else min(last_tokens, self.max_length)
        self.prefix, self.suffix = self._special_tokens()
        budget = (
            _template_budget(self.tokenizer, limit, self.template)
            if self.template
            else limit - len(self.prefix) - len(self.suffix)
        )
        if budget < 1:
            raise CutNotHere(f"{limit} tokens cannot hold a text beside the special tokens and the template")
        ids, long = list(ids), list(long)
        for i, text_ids in enumerate(pieces):
            if len(text_ids) > budget:
                ids[i], long[i] = self._frame(list(text_ids[-budget:])), True
        return ids, long

    def _windows(self, text_ids: list[int]) -> list[list[int]]:
        if self.long_text == "head_tail":
            head = self.budget // 4
            return [self._frame(text_ids[:head] + text_ids[len(text_ids) - (self.budget - head) :])]
        starts = range(0, max(len(text_ids) - self.budget, 0) + self.stride, self.stride)
        return [self._frame(text_ids[s : s + self.budget]) for s in starts if s < len(text_ids)]


def length_grouped_batches(lengths: list[int], batch_size: int, seed: int, mega: int = 50) -> list[list[int]]:
    """Shuffle, then sort by length inside windows of `mega` batches, then shuffle the batches.

    Batches hold examples of similar length (little padding) while the order stays random per seed;
    the longest batch comes first so that memory problems show at once.
    """
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * mega
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: -lengths[i])
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    if len(batches) > 1:
        longest = max(range(len(batches)), key=lambda b: max(lengths[i] for i in batches[b]))
        first = batches.pop(longest)
        rng.shuffle(batches)
        batches.insert(0, first)
    return batches


def sorted_batches(lengths: list[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Deterministic batches of similar length for evaluation (order restored by the caller): longest first,
    at most `batch_size` texts and, with `max_tokens`, at most that many padded tokens a batch (a batch of
    mixed lengths is then cut where padding would cost more than the budget allows)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        current = batches[-1] if batches else None
        full = (
            current is None
            or len(current) >= batch_size
            or (max_tokens is not None and (len(current) + 1) * lengths[current[0]] > max_tokens)
        )
        if full:
            batches.append([i])
        else:
            current.append(i)
    return batches


def collate(ids: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence in the batch."""
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[row, : len(seq)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@dataclass
class TrainSet:
    """The training split as the loop sees it: token ids (one row per example, or per window of a long text)
    with their labels, and what the loss needs."""

    ids: list[list[int]]
    labels: list
    num_labels: int
    pad_id: int
    problem: Problem
    class_weight: torch.Tensor | None = None
