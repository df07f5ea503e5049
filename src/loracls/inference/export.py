"""Export stage: merge the LoRA weights into a standalone model and check it against the adapter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from peft import PeftModel

from loracls import files, runs
from loracls.errors import LoraclsError
from loracls.hardware import Runtime
from loracls.model.classifier import is_generic, load_classifier, load_standalone, write_generic_module
from loracls.model.scoring import predict_probabilities
from loracls.runs import ExportCheck

TIE_MARGIN = 1e-3  # predictions may differ only where the adapter's top two classes are this close
INPUT_FORMAT = "loracls_input.json"  # the merged model's input template, for callers


def compare_predictions(adapter_probs: np.ndarray, merged_probs: np.ndarray) -> ExportCheck:
    """Predictions must be equal; a disagreement counts only where the adapter was not at a tie."""
    differ = adapter_probs.argmax(1) != merged_probs.argmax(1)
    top2 = np.sort(adapter_probs, axis=1)[:, -2:]
    real = differ & ((top2[:, 1] - top2[:, 0]) > TIE_MARGIN)
    gap = float(np.abs(adapter_probs - merged_probs).max()) if len(adapter_probs) else 0.0
    return ExportCheck(examples=int(len(adapter_probs)), predictions_equal=bool(not real.any() and np.isfinite(gap)),
                       disagreements=int(differ.sum()), disagreements_beyond_ties=int(real.sum()),
                       max_probability_difference=gap)


def export_merged(run: Path, model_dir: Path, id2label: dict[int, str], ids: list[list[int]], batch_size: int,
                  runtime, log=print, input_template: str | None = None, max_length: int = 512) -> ExportCheck:
    """Saved adapter on a fresh full-precision base -> merge_and_unload -> run/merged -> same predictions.

    Starting from the saved adapter also proves the adapter directory is complete, and works the same
    after QLoRA (the merge goes into unquantized weights). Both sides are computed in fp32 without
    autocast: the check is that the two compute the same function, not how a low-precision matmul
    rounds W x + B A x versus (W + B A) x.
    """
    exact = Runtime(runtime.device, torch.float32)
    loaded = load_classifier(model_dir, id2label, log=lambda *_: None)
    peft_model = PeftModel.from_pretrained(loaded.model, str(run / runs.ADAPTER)).to(runtime.device)
    adapter_probs = predict_probabilities(peft_model, ids, loaded.tokenizer.pad_token_id, batch_size, exact)
    merged = peft_model.merge_and_unload()
    generic = is_generic(type(merged))

    def fill(staging: Path) -> None:
        merged.save_pretrained(staging)
        loaded.tokenizer.save_pretrained(staging)
        if generic:
            write_generic_module(staging, type(merged))
        # how callers must format their texts: the template (if any) and the length trained with
        files.write_json(staging / INPUT_FORMAT, {"input_template": input_template, "max_length": max_length})

    files.replace_dir(run / runs.MERGED, fill)
    standalone = load_standalone(run / runs.MERGED).to(runtime.device)
    merged_probs = predict_probabilities(standalone, ids, loaded.tokenizer.pad_token_id, batch_size, exact)
    check = compare_predictions(adapter_probs, merged_probs)
    if not check.predictions_equal:
        raise LoraclsError(f"the merged model disagrees with the adapter on {check.disagreements_beyond_ties} of "
                           f"{check.examples} test examples; {run / runs.MERGED} is not a faithful export")
    log(f"export: merged model in {run / runs.MERGED}; test predictions equal the adapter's "
        f"(fp32, max probability difference {check.max_probability_difference:.2e})")
    return check
