"""Tokenization and batching: token ids without padding, length-grouped training batches, length-sorted
evaluation batches, and dynamic padding to the longest sequence of a batch."""

from __future__ import annotations

import random

import torch

from loracls.errors import LoraclsError

def encode(tokenizer, texts: list[str], max_length: int, template: str | None = None) -> list[list[int]]:
    """Token ids per text, truncated to max_length; no padding here (dynamic padding happens per batch)."""
    return encode_with_truncation(tokenizer, texts, max_length, template)[0]


def encode_with_truncation(tokenizer, texts: list[str], max_length: int,
                           template: str | None = None) -> tuple[list[list[int]], list[bool]]:
    """(token ids, whether each text was cut to fit max_length).

    With a template (`"Movie review: {text}\nSentiment:"`) the text is placed inside it; when too long the
    text is shortened, never the template, so the pooled last token stays the template's last token.
    """
    if template is not None:
        overhead = len(tokenizer(template.replace("{text}", ""))["input_ids"]) + 2
        if overhead >= max_length:
            raise LoraclsError(f"max_length {max_length} leaves no room for text: the input_template takes "
                               f"{overhead - 2} tokens; raise max_length or shorten the template")
        budget = max_length - overhead
        pieces = tokenizer(texts, add_special_tokens=False)["input_ids"]
        truncated = [len(ids) > budget for ids in pieces]
        texts = [template.replace("{text}", t if len(ids) <= budget else tokenizer.decode(ids[:budget]))
                 for t, ids in zip(texts, pieces)]
        out = tokenizer(texts, truncation=True, max_length=max_length, padding=False)["input_ids"]
        return [list(ids) for ids in out], truncated
    full = tokenizer(texts, padding=False)["input_ids"]
    truncated = [len(ids) > max_length for ids in full]
    if not any(truncated):
        return [list(ids) for ids in full], truncated
    out = tokenizer(texts, truncation=True, max_length=max_length, padding=False)["input_ids"]
    return [list(ids) for ids in out], truncated


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
        chunk = sorted(order[start:start + window], key=lambda i: -lengths[i])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    if len(batches) > 1:
        longest = max(range(len(batches)), key=lambda b: max(lengths[i] for i in batches[b]))
        first = batches.pop(longest)
        rng.shuffle(batches)
        batches.insert(0, first)
    return batches


def sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Deterministic batches of similar length for evaluation (order restored by the caller)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def collate(ids: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence in the batch."""
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        input_ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[row, :len(seq)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}
