"""Export stage: merge the LoRA weights into a standalone model and check it against the adapter."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from loracls import files, runs
from loracls.data.batching import TextEncoder
from loracls.errors import Log, LoraclsError
from loracls.hardware import Runtime
from loracls.inference.plain_check import plain_transformers_probabilities, write_model_card
from loracls.model.classifier import is_generic, load_standalone, write_generic_module
from loracls.model.lora import head_name
from loracls.model.methods import method_of
from loracls.model.scorers import Built, Scorer, Setup, comments, label_logprobs, scorer_for
from loracls.model.scoring import Batching, predict_logits
from loracls.problems import Decision, problem_for
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


def export_run(setup: Setup, scorer: Scorer, built: Built, run: Path) -> ExportCheck:
    """run/merged for the run's scorer, written in staging, checked there and swapped in only when it passes."""
    return EXPORTS[scorer.name](setup, scorer, built, run)


def export_merged(setup: Setup, scorer: Scorer, built: Built | None, run: Path) -> ExportCheck:
    """Saved adapter on a fresh full-precision base -> merge_and_unload -> the decision folded into the head
    -> run/merged (weights in `config.merge_dtype`, the text-only layout) -> checked in staging, swapped in
    only when it passes.

    Starting from the saved adapter also proves the adapter directory is complete, and works the same
    after QLoRA (the merge goes into unquantized weights). Both sides are computed in fp32 without
    autocast: the check is that the two compute the same function (up to the saved weights' rounding in
    bf16), not how a low-precision matmul rounds W x + B A x versus (W + B A) x. The staged copy is then
    read back the way a user reads it: plain transformers in a fresh process (`plain_check`).
    """
    config, runtime, id2label = setup.config, setup.runtime, setup.dataset.id2label
    batch_size, dtype = config.eval_batch_size, config.merge_dtype
    exact = Runtime(runtime.device, torch.float32)
    decision = runs.read_decision(run)
    peft_model, tokenizer = scorer.load(config, setup.model_dir, id2label, run / runs.ADAPTER)
    peft_model = peft_model.to(runtime.device)
    ids = TextEncoder.for_config(config, tokenizer).encode(setup.dataset.test.texts).ids

    def logits(model) -> np.ndarray:
        return predict_logits(model, ids, Batching(tokenizer.pad_token_id, batch_size, exact))

    adapter_probs = decision.probabilities(logits(peft_model))
    merged = method_of(run / runs.ADAPTER).standalone(peft_model)  # LoRA merged in; full: the model itself
    exported = decision.kind.fold_into_head(getattr(merged, head_name(merged)), merged.config, decision, id2label)
    merged = merged.to(DTYPES[dtype])
    fmt = replace(InputFormat.of_run(config, decision), decision=exported)

    def fill(staging: Path) -> None:
        save_text_layout(merged, tokenizer, staging, fmt)

    def check(staging: Path) -> ExportCheck:
        standalone = load_standalone(staging).to(runtime.device)
        result = compare_predictions(adapter_probs, exported.probabilities(logits(standalone)), dtype, decision)
        refuse_unfaithful(result, run / runs.MERGED, "test examples")
        plain_probs = plain_transformers_probabilities(staging, ids)
        plain = compare_predictions(adapter_probs[: len(plain_probs)], plain_probs, dtype, fmt.decision)
        refuse_unfaithful(plain, run / runs.MERGED, "test texts read by plain transformers in a fresh process")
        return result

    result = export_checked(run / runs.MERGED, fill, check, "the merged model")
    setup.log(
        f"export: merged model ({dtype} weights) in {run / runs.MERGED}; test predictions equal the adapter's "
        f"(computed in fp32, max probability difference {result.max_probability_difference:.2e}); "
        f"plain transformers in a fresh process gives the same calibrated probabilities"
    )
    return result


def export_causal_lm(setup: Setup, scorer: Scorer, built: Built, run: Path) -> ExportCheck:
    """label_and_comment: the saved adapter on a fresh fp32 base -> merge_and_unload -> run/merged (the causal
    LM, its tokenizer and loracls_input.json), checked in staging against that adapter on the test split, both
    in fp32 without autocast (the check is that the two compute the same function, not how a bf16 matmul rounds
    W x + B A x against (W + B A) x: under bf16 autocast 1 of 200 WordNet labels flipped): the same labels
    (beyond ties) and the share of equal comments (the same decoding: greedy, or the candidates' rule)."""
    test, config, decision = setup.dataset.test, setup.config, runs.read_decision(run)
    exact_setup = replace(setup, runtime=Runtime(setup.runtime.device, torch.float32))
    model, tokenizer = scorer.load(config, setup.model_dir, setup.dataset.id2label, run / runs.ADAPTER)
    exact = replace(built, model=model.to(setup.runtime.device).eval(), tokenizer=tokenizer)
    adapter_probs = decision.probabilities(label_logprobs(exact_setup, exact, test.texts))
    chosen = decision.chosen(adapter_probs)
    adapter_comments = comments(exact_setup, exact, test.texts, chosen).texts
    merged = exact.model.merge_and_unload()

    def fill(staging: Path) -> None:
        merged.save_pretrained(staging, save_original_format=False)  # the text layout (see save_text_layout)
        save_tokenizer_as_trained(tokenizer, staging, config.max_length)
        InputFormat.of_run(config, decision).write(staging / INPUT_FORMAT)

    def check(staging: Path) -> ExportCheck:
        standalone = AutoModelForCausalLM.from_pretrained(str(staging), dtype=torch.float32)
        reread = replace(exact, model=standalone.to(setup.runtime.device).eval())
        merged_probs = decision.probabilities(label_logprobs(exact_setup, reread, test.texts))
        result = compare_predictions(adapter_probs, merged_probs, "fp32", decision)
        refuse_unfaithful(result, run / runs.MERGED, "test labels")
        again = comments(exact_setup, reread, test.texts, chosen).texts
        equal = [a == b for a, b in zip(again, adapter_comments)]
        result.comments_equal = float(np.mean(equal)) if equal else 1.0
        return result

    result = export_checked(run / runs.MERGED, fill, check, "the merged model")
    setup.log(
        f"export: merged causal LM in {run / runs.MERGED}; test labels equal the adapter's in fp32 (max "
        f"probability difference {result.max_probability_difference:.2e}), {100 * result.comments_equal:.0f}% of "
        "comments equal"
    )
    return result


EXPORTS = {"head": export_merged, "label_words": export_causal_lm}


def export_checked(target: Path, fill, check, what: str):
    """Write an export into staging, check the staged copy, and swap it in only when the check passes: after
    a failed check the previous export (if any) is still the one in place. Returns the check's result."""
    results = []

    def fill_and_check(staging: Path) -> None:
        fill(staging)
        results.append(check(staging))

    files.replace_dir(target, fill_and_check, what)
    return results[0]


def save_tokenizer_as_trained(tokenizer, directory: Path, max_length: int) -> None:
    """The tokenizer with the run's max_length and truncation side in its config: `pipeline(...,
    truncation=True)` then cuts a long text where loracls does (it once read 120 tokens of a 32-token run)."""
    kept = tokenizer.model_max_length, tokenizer.truncation_side
    tokenizer.model_max_length, tokenizer.truncation_side = max_length, "right"
    try:
        tokenizer.save_pretrained(directory)
    finally:
        tokenizer.model_max_length, tokenizer.truncation_side = kept


def save_text_layout(model, tokenizer, directory: Path, fmt: InputFormat) -> None:
    """The model as transformers' text-only class loads it with no mapping: the layout it has in memory
    (`save_original_format=False`: transformers would otherwise revert its load-time renames, a wrapper's
    prefix among them, and plain transformers would then load the head alone onto a random decoder)."""
    model.save_pretrained(directory, save_original_format=False)
    save_tokenizer_as_trained(tokenizer, directory, fmt.max_length)
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


def remerge(run_path: str, dtype: str, log: Log = print) -> ExportCheck:
    """`loracls export RUN --format merged --dtype D`: write run/merged again with weights in D, checked like
    the train job's export; metrics.json's export record is updated."""
    from loracls.config_reader import from_dict
    from loracls.data.spec import DataSpec
    from loracls.data.splits import load_dataset
    from loracls.hardware import setup_runtime
    from loracls.model.source import resolve_model_dir

    run = runs.check_run_dir(run_path)
    config = from_dict({"merge_dtype": dtype}, base=runs.read_config(run))
    metrics = runs.read_metrics(run) if (run / runs.METRICS).is_file() else None
    model_dir = resolve_model_dir(config.model, log)
    dataset = load_dataset(DataSpec.of(config))  # its test split: the rows the train job's export check scored
    dataset.id2label = runs.read_labels(run)
    runtime = setup_runtime(config.device, config.precision, config.threads)
    scorer = scorer_for(problem_for(config.problem))
    check = export_merged(Setup(config, dataset, model_dir, runtime, log), scorer, None, run)
    if metrics is not None:
        metrics.export = check
        runs.write_record(run / runs.METRICS, metrics)
    return check
