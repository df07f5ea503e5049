"""Export stage: merge the LoRA weights into a standalone model and check it against the adapter."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from peft import PeftModel

from loracls import files, runs
from loracls.errors import LoraclsError
from loracls.hardware import Runtime
from loracls.inference.plain_check import plain_transformers_check, write_model_card
from loracls.model.classifier import head_options, is_generic, load_classifier, load_standalone, write_generic_module
from loracls.model.lora import head_name
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
    finite = np.isfinite(merged_probs).reshape(len(merged_probs), -1).all(axis=1)
    gap = float(np.abs(adapter_probs - merged_probs)[finite].max()) if finite.any() else 0.0
    return ExportCheck(
        examples=int(len(adapter_probs)),
        predictions_equal=bool(not real.any() and finite.all()),
        non_finite=int((~finite).sum()),
        disagreements=int(differ.sum()),
        disagreements_beyond_ties=int(real.sum()),
        max_probability_difference=gap,
        dtype=dtype,
    )


def export_merged(
    run: Path, model_dir: Path, id2label: dict[int, str], ids: list[list[int]], config, runtime, log=print
) -> ExportCheck:
    """Saved adapter on a fresh full-precision base -> merge_and_unload -> the decision folded into the head
    -> run/merged (weights in `config.merge_dtype`, the text-only layout) -> checked in staging, swapped in
    only when it passes.

    Starting from the saved adapter also proves the adapter directory is complete, and works the same
    after QLoRA (the merge goes into unquantized weights). Both sides are computed in fp32 without
    autocast: the check is that the two compute the same function (up to the saved weights' rounding in
    bf16), not how a low-precision matmul rounds W x + B A x versus (W + B A) x. The staged copy is then
    read back the way a user reads it: plain transformers in a fresh process (`plain_check`).
    """
    batch_size, dtype = config.eval_batch_size, config.merge_dtype
    exact = Runtime(runtime.device, torch.float32)
    decision = runs.read_decision(run)
    loaded = load_classifier(model_dir, id2label, log=lambda *_: None, problem=decision.problem, **head_options(config))
    peft_model = PeftModel.from_pretrained(loaded.model, str(run / runs.ADAPTER)).to(runtime.device)

    def logits(model) -> np.ndarray:
        return predict_logits(model, ids, loaded.tokenizer.pad_token_id, batch_size, exact)

    adapter_probs = decision.probabilities(logits(peft_model))
    merged = peft_model.merge_and_unload()
    exported = decision.kind.fold_into_head(getattr(merged, head_name(merged)), merged.config, decision, id2label)
    merged = merged.to(DTYPES[dtype])
    fmt = replace(InputFormat.of_run(config, decision), decision=exported)

    def fill(staging: Path) -> None:
        save_text_layout(merged, loaded.tokenizer, staging, fmt)

    def check(staging: Path) -> ExportCheck:
        standalone = load_standalone(staging).to(runtime.device)
        result = compare_predictions(adapter_probs, exported.probabilities(logits(standalone)), dtype, decision)
        refuse_unfaithful(result, run / runs.MERGED, "test examples")
        plain = plain_transformers_check(staging, fmt, ids, adapter_probs, dtype)
        refuse_unfaithful(plain, run / runs.MERGED, "test texts read by plain transformers in a fresh process")
        return result

    result = export_checked(run / runs.MERGED, fill, check, "the merged model")
    log(
        f"export: merged model ({dtype} weights) in {run / runs.MERGED}; test predictions equal the adapter's "
        f"(computed in fp32, max probability difference {result.max_probability_difference:.2e}); "
        f"plain transformers in a fresh process gives the same calibrated probabilities"
    )
    return result


def export_checked(target: Path, fill, check, what: str):
    """Write an export into staging, check the staged copy, and swap it in only when the check passes: after
    a failed check the previous export (if any) is still the one in place. Returns the check's result."""
    results = []

    def fill_and_check(staging: Path) -> None:
        fill(staging)
        results.append(check(staging))

    files.replace_dir(target, fill_and_check, what)
    return results[0]


def save_text_layout(model, tokenizer, directory: Path, fmt: InputFormat) -> None:
    """The model as transformers' text-only class loads it with no mapping: the layout it has in memory
    (`save_original_format=False`: transformers would otherwise revert its load-time renames, a wrapper's
    prefix among them, and plain transformers would then load the head alone onto a random decoder)."""
    model.save_pretrained(directory, save_original_format=False)
    tokenizer.save_pretrained(directory)
    if is_generic(type(model)):
        write_generic_module(directory, type(model))
    fmt.write(directory / INPUT_FORMAT)
    write_model_card(directory, model.config, fmt)


def refuse_unfaithful(check: ExportCheck, where: Path, what: str) -> None:
    """Non-finite outputs are said as such; otherwise the count of disagreements beyond ties."""
    if check.non_finite:
        raise LoraclsError(
            f"the exported model gives NaN or inf on {check.non_finite} of {check.examples} {what}; "
            f"{where} is not a faithful export (nothing was replaced)"
        )
    if not check.predictions_equal:
        raise LoraclsError(
            f"the exported model disagrees with the adapter on {check.disagreements_beyond_ties} of "
            f"{check.examples} {what} (max probability difference {check.max_probability_difference:.2e}); "
            f"{where} is not a faithful export (nothing was replaced)"
        )


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
