"""Comment generation with a causal LM: transformers' `generate` (KV cache; greedy, beam search, or sampled
with a temperature and top-p), over length-sorted, left-padded batches, each comment bounded by
`max_new_tokens` and ended at EOS. With several candidates (beams), the comment kept is the most likely one
that the run's own label scorer, reading it alone, gives the chosen label."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from loracls.model.label_scoring import LabelScorer, left_padded
from loracls.problems.label_and_comment import COMMENT_SEPARATOR


@dataclass(frozen=True)
class Decoding:
    """How continuations are written: at most `max_new_tokens` each, `batch_size` sequences a pass, on
    `runtime`; greedy (temperature 0), sampled (temperature > 0, top-p), or `beams` > 1: beam search, and for
    comments the first of the beams that reads back as the chosen label."""

    max_new_tokens: int
    batch_size: int
    runtime: object
    beams: int = 1
    temperature: float = 0.0
    top_p: float = 1.0


@dataclass
class Generated:
    texts: list[str]  # in the input order, EOS and padding removed
    tokens: list[int]  # generated tokens per text (EOS not counted)


@torch.inference_mode()
def generate(model, tokenizer, prompts: list[list[int]], decoding: Decoding) -> Generated:
    """Each prompt's continuation up to EOS or `max_new_tokens` (temperature 0: greedy). With `beams` > 1:
    beam search, and each prompt's `beams` continuations, most likely first, at rows
    [i * beams, (i + 1) * beams); a batch then holds `batch_size // beams` prompts (the same memory)."""
    eos, pad, beams, runtime = tokenizer.eos_token_id, tokenizer.pad_token_id, decoding.beams, decoding.runtime
    texts, tokens = [""] * (len(prompts) * beams), [0] * (len(prompts) * beams)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batch_size = max(1, decoding.batch_size // beams)
    options = dict(do_sample=False)
    if decoding.temperature > 0:
        options = dict(do_sample=True, temperature=decoding.temperature, top_p=decoding.top_p)
    if beams > 1:
        options = dict(do_sample=False, num_beams=beams, num_return_sequences=beams, early_stopping=True)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            batch = left_padded([prompts[i] for i in rows], pad)
            with runtime.autocast:
                out = model.generate(
                    input_ids=batch["input_ids"].to(runtime.device),
                    attention_mask=batch["attention_mask"].to(runtime.device),
                    max_new_tokens=decoding.max_new_tokens,
                    eos_token_id=eos,
                    pad_token_id=pad,
                    **options,
                )
            slots = [row * beams + beam for row in rows for beam in range(beams)]
            for slot, new in zip(slots, out[:, batch["input_ids"].shape[1] :].tolist()):
                kept = new[: new.index(eos)] if eos in new else new
                texts[slot], tokens[slot] = tokenizer.decode(kept, skip_special_tokens=True).strip(), len(kept)
    finally:
        model.train(was_training)
    return Generated(texts, tokens)


def comments_after_labels(
    model, tokenizer, scorer: LabelScorer, texts: list[str], chosen, decoding: Decoding
) -> Generated:
    """Each text's comment, generated after its prompt, its chosen label's word and the comment separator:
    label_and_comment's test, zero-shot baseline, export check, predict and serve. One candidate: greedy.
    More: beam search, and the comment kept is the first beam (most likely first) that the label scorer,
    reading the comment alone, gives the chosen label; the first beam where none does."""
    separator = tokenizer(COMMENT_SEPARATOR, add_special_tokens=False)["input_ids"]
    prompts = scorer.answer_prompts(texts, chosen, separator)
    written = generate(model, tokenizer, prompts, decoding)
    candidates = decoding.beams
    if candidates == 1 or not texts:
        return written
    was_training = model.training
    model.eval()
    try:
        read_back = scorer.label_logprobs(written.texts).argmax(axis=1).reshape(len(texts), candidates)
    finally:
        model.train(was_training)
    agrees = read_back == np.asarray(chosen, dtype=int).reshape(-1, 1)
    kept = [i * candidates + (int(row.argmax()) if row.any() else 0) for i, row in enumerate(agrees)]
    return Generated([written.texts[k] for k in kept], [written.tokens[k] for k in kept])
