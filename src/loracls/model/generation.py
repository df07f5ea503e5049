"""Comment generation with a causal LM: transformers' `generate` (KV cache; greedy, or sampled with a
temperature and top-p), over length-sorted, left-padded batches, each comment bounded by `max_new_tokens`
and ended at EOS."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loracls.model.label_scoring import LabelScorer, left_padded
from loracls.problems.label_and_comment import COMMENT_SEPARATOR


@dataclass
class Generated:
    texts: list[str]  # in the input order, EOS and padding removed
    tokens: list[int]  # generated tokens per text (EOS not counted)


@torch.inference_mode()
def generate(
    model,
    tokenizer,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    runtime,
    temperature: float = 0.0,
    top_p: float = 1.0,
) -> Generated:
    """Each prompt's continuation up to EOS or `max_new_tokens` (temperature 0: greedy)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    texts, tokens = [""] * len(prompts), [0] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    sampled = temperature > 0
    options = dict(do_sample=True, temperature=temperature, top_p=top_p) if sampled else dict(do_sample=False)
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
                    max_new_tokens=max_new_tokens,
                    eos_token_id=eos,
                    pad_token_id=pad,
                    **options,
                )
            for row, new in zip(rows, out[:, batch["input_ids"].shape[1] :].tolist()):
                kept = new[: new.index(eos)] if eos in new else new
                texts[row], tokens[row] = tokenizer.decode(kept, skip_special_tokens=True).strip(), len(kept)
    finally:
        model.train(was_training)
    return Generated(texts, tokens)


def comments_after_labels(
    model, tokenizer, scorer: LabelScorer, texts: list[str], chosen, max_new_tokens: int, batch_size: int, runtime
) -> Generated:
    """Each text's comment, generated after its prompt, its chosen label's word and the comment separator:
    label_and_comment's test, zero-shot baseline, export check, predict and serve."""
    separator = tokenizer(COMMENT_SEPARATOR, add_special_tokens=False)["input_ids"]
    prompts = scorer.answer_prompts(texts, chosen, separator)
    return generate(model, tokenizer, prompts, max_new_tokens, batch_size, runtime)
