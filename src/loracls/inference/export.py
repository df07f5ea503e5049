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
from loracls.model.scoring import predict_logits
from loracls.problems import Decision
from loracls.runs import INPUT_FORMAT, ExportCheck, InputFormat

# predictions may differ only where the adapter's top two classes are this close: in fp32 the merge changes
# nothing but rounding; bf16 weights (8 bits of mantissa) move probabilities by up to about a percent
TIE_MARGINS = {"fp32": 1e-3, "bf16": 5e-2, "int8": 1e-1}  # top two this close: a disagreement is a tie
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def compare_predictions(
    adapter_probs: np.ndarray, merged_probs: np.ndarray, dtype: str = "fp32", decision: Decision | None = None
) -> ExportCheck:
    """Predictions must be equal; a disagreement counts only where the adapter was at a tie: its top two
    classes within the margin, or (multi_label) a label's probability within the margin of its threshold."""
    decision, margin = decision or Decision(), TIE_MARGINS[dtype]
    differ_cells = decision.chosen(adapter_probs) != decision.chosen(merged_probs)
    differ = differ_cells.reshape(len(differ_cells), -1).any(axis=1)
    real = decision.kind.beyond_ties(adapter_probs, differ_cells, decision, margin)
    gap = float(np.abs(adapter_probs - merged_probs).max()) if len(adapter_probs) else 0.0
    return ExportCheck(
        examples=int(len(adapter_probs)),
        predictions_equal=bool(not real.any() and np.isfinite(gap)),
        disagreements=int(differ.sum()),
        disagreements_beyond_ties=int(real.sum()),
        max_probability_difference=gap,
        dtype=dtype,
    )


def export_merged(
    run: Path, model_dir: Path, id2label: dict[int, str], ids: list[list[int]], config, runtime, log=print
) -> ExportCheck:
    """Saved adapter on a fresh full-precision base -> merge_and_unload -> run/merged (weights in
    `config.merge_dtype`) -> same predictions.

    Starting from the saved adapter also proves the adapter directory is complete, and works the same
    after QLoRA (the merge goes into unquantized weights). Both sides are computed in fp32 without
    autocast: the check is that the two compute the same function (up to the saved weights' rounding in
    bf16), not how a low-precision matmul rounds W x + B A x versus (W + B A) x.
    """
    batch_size, dtype = config.eval_batch_size, config.merge_dtype
    exact = Runtime(runtime.device, torch.float32)
    decision = runs.read_decision(run)
    loaded = load_classifier(model_dir, id2label, log=lambda *_: None, problem=decision.problem)
    peft_model = PeftModel.from_pretrained(loaded.model, str(run / runs.ADAPTER)).to(runtime.device)

    def probabilities(model) -> np.ndarray:
        return decision.probabilities(predict_logits(model, ids, loaded.tokenizer.pad_token_id, batch_size, exact))

    adapter_probs = probabilities(peft_model)
    merged = peft_model.merge_and_unload().to(DTYPES[dtype])
    generic = is_generic(type(merged))

    def fill(staging: Path) -> None:
        merged.save_pretrained(staging)
        loaded.tokenizer.save_pretrained(staging)
        if generic:
            write_generic_module(staging, type(merged))
        InputFormat.of_run(config, decision).write(staging / INPUT_FORMAT)

    files.replace_dir(run / runs.MERGED, fill, "the merged model")
    standalone = load_standalone(run / runs.MERGED).to(runtime.device)
    check = compare_predictions(adapter_probs, probabilities(standalone), dtype, decision)
    if not check.predictions_equal:
        raise LoraclsError(
            f"the merged model disagrees with the adapter on {check.disagreements_beyond_ties} of "
            f"{check.examples} test examples; {run / runs.MERGED} is not a faithful export"
        )
    log(
        f"export: merged model ({dtype} weights) in {run / runs.MERGED}; test predictions equal the adapter's "
        f"(computed in fp32, max probability difference {check.max_probability_difference:.2e})"
    )
    return check


def remerge(run_path: str, dtype: str, log=print) -> ExportCheck:
    """`loracls export RUN --format merged --dtype D`: write run/merged again with weights in D, checked like
    the train job's export; metrics.json's export record is updated."""
    from loracls.config import from_dict
    from loracls.data.batching import TextEncoder
    from loracls.data.splits import load_dataset
    from loracls.hardware import setup_runtime
    from loracls.model.source import resolve_model_dir
    from loracls.model.tokenizer import load_tokenizer

    run = runs.check_run_dir(run_path)
    config = from_dict({"merge_dtype": dtype}, base=runs.read_config(run))
    id2label = runs.read_labels(run)
    metrics = runs.read_metrics(run) if (run / runs.METRICS).is_file() else None
    model_dir = resolve_model_dir(config.model, log)
    encoder = TextEncoder.for_config(config, load_tokenizer(model_dir, lambda *_: None))
    ids = encoder.encode(load_dataset(config).test.texts).ids  # the rows the train job's export check scored
    runtime = setup_runtime(config.device, config.precision, config.threads)
    check = export_merged(run, model_dir, id2label, ids, config, runtime, log)
    if metrics is not None:
        metrics.export = check
        runs.write_record(run / runs.METRICS, metrics)
    return check
