"""Comment generation speed of the embedded Gemma 3 270M on this machine: greedy, batched, length-sorted
(`model.generation.generate`, as label_and_comment runs use it), after the embedded Rotten Tomatoes prompts.

    python3 benchmarks/generation_speed.py [TEXTS] [MAX_NEW_TOKENS] [BATCH]   # prints one JSON line
"""

from __future__ import annotations

import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from loracls.config_reader import load_config
from loracls.data.spec import DataSpec
from loracls.data.splits import load_dataset
from loracls.hardware import setup_runtime
from loracls.model.generation import Decoding, generate
from loracls.model.label_scoring import LabelPrompt, LabelScorer
from loracls.model.source import resolve_model_dir
from loracls.model.tokenizer import load_tokenizer
from loracls.problems.label_and_comment import DEFAULT_TEMPLATE


def main(texts: int = 32, max_new_tokens: int = 32, batch: int = 16) -> dict:
    config = load_config()
    runtime = setup_runtime("cpu", "auto", None)
    model_dir = resolve_model_dir(config.model, lambda *a: None)
    tokenizer = load_tokenizer(model_dir, lambda *a: None)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    split = load_dataset(DataSpec.of(config)).test
    scorer = LabelScorer(
        model, tokenizer, LabelPrompt(DEFAULT_TEMPLATE, ["fresh", "rotten"], config.max_length), batch, runtime
    )
    prompts = scorer.answer_prompts(split.texts[:texts], [0] * texts, [])
    generate(model, tokenizer, prompts[:batch], Decoding(2, batch, runtime))  # warm-up
    started = time.perf_counter()
    out = generate(model, tokenizer, prompts, Decoding(max_new_tokens, batch, runtime))
    seconds = time.perf_counter() - started
    return {
        "texts": texts,
        "max_new_tokens": max_new_tokens,
        "batch": batch,
        "threads": torch.get_num_threads(),
        "precision": str(runtime.dtype).replace("torch.", ""),
        "generated_tokens": sum(out.tokens),
        "seconds": seconds,
        "tokens_per_second": sum(out.tokens) / seconds,
    }


if __name__ == "__main__":
    print(json.dumps(main(*(int(a) for a in sys.argv[1:]))))
