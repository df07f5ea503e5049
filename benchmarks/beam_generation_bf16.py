"""Beam-search comments with the frozen weights stored in bf16 (the training speed-up the label_and_comment
test phase runs with), with and without `model.speedups`' contiguous-input hook, beside fp32 weights under
the same bf16 autocast. The embedded Gemma 3 270M (untrained: only the time is compared), after the
embedded Rotten Tomatoes prompts. Needs a CPU with bf16 autocast.

    python3 benchmarks/beam_generation_bf16.py [TEXTS] [BEAMS] [MAX_NEW_TOKENS]   # prints one JSON line
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
from loracls.hardware import Runtime
from loracls.model.generation import Decoding, comments_after_labels
from loracls.model.label_scoring import LabelPrompt, LabelScorer
from loracls.model.source import resolve_model_dir
from loracls.model.speedups import store_frozen_linears_in
from loracls.model.tokenizer import load_tokenizer
from loracls.problems.label_and_comment import DEFAULT_TEMPLATE


def _seconds(model, tokenizer, texts, beams: int, max_new_tokens: int, runtime) -> float:
    scorer = LabelScorer(model, tokenizer, LabelPrompt(DEFAULT_TEMPLATE, ["negative", "positive"], 256), 32, runtime)
    chosen = [0] * len(texts)
    started = time.perf_counter()
    comments_after_labels(model, tokenizer, scorer, texts, chosen, Decoding(max_new_tokens, 32, runtime, beams))
    return time.perf_counter() - started


def main(texts: int = 8, beams: int = 4, max_new_tokens: int = 16) -> dict:
    config = load_config()
    runtime = Runtime(torch.device("cpu"), torch.bfloat16)
    model_dir = resolve_model_dir(config.model, lambda *a: None)
    tokenizer = load_tokenizer(model_dir, lambda *a: None)
    prompts = load_dataset(DataSpec.of(config)).test.texts[:texts]
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    model.requires_grad_(False)
    result = {"texts": texts, "beams": beams, "max_new_tokens": max_new_tokens, "threads": torch.get_num_threads()}
    result["fp32_weights_s"] = _seconds(model, tokenizer, prompts, beams, max_new_tokens, runtime)
    store_frozen_linears_in(model, torch.bfloat16)
    result["bf16_weights_s"] = _seconds(model, tokenizer, prompts, beams, max_new_tokens, runtime)
    for module in model.modules():  # the same weights without the hook: the behaviour before it
        module._forward_pre_hooks.clear()
    result["bf16_weights_no_hook_s"] = _seconds(model, tokenizer, prompts, beams, max_new_tokens, runtime)
    return result


if __name__ == "__main__":
    print(json.dumps(main(*(int(a) for a in sys.argv[1:]))))
