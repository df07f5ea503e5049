"""The baseline ladder and the verdict: zero-shot (plain and calibrated), TF-IDF + logistic regression and a
fine-tuned encoder, each on the same test split as LoRA, and then one table of quality and cost with the
sentence that says which one to ship (loracls.verdict).

A run writes each baseline's record as it finishes (baseline.json, tfidf.json, encoder.json); a resumed run
reads them back instead of computing them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loracls import files, runs
from loracls.baselines.encoder import EncoderSkipped, encoder_specs, read_encoder_probabilities, run_encoder
from loracls.baselines.ensemble import fit_ensemble
from loracls.baselines.tfidf import run_tfidf
from loracls.baselines.zero_shot import code_labels, codes_reason, run_baseline
from loracls.config import Config
from loracls.model.scorers import Built, Scorer, Setup
from loracls.problems import Decision, prediction_rows, problem_for
from loracls.runs import (
    BaselineRecord,
    BaselineSummary,
    EncoderRecord,
    EnsembleRecord,
    Metrics,
    SkippedBaseline,
    TfidfRecord,
    UntrainedRecord,
)
from loracls.verdict import LadderRow, Verdict, decide, format_table

__all__ = [
    "Ladder",
    "RUNGS",
    "ensemble_of",
    "ensemble_row",
    "rungs_of",
    "run_ladder",
    "zero_shot_skip_reason",
    "verdict_of",
    "say_verdict",
]


@dataclass
class Ladder:
    """The baselines' records (None: not run) and what was left out, and why."""

    zero_shot: BaselineRecord | None = None
    tfidf: TfidfRecord | None = None
    encoders: list[EncoderRecord] = field(default_factory=list)
    skipped: list[SkippedBaseline] = field(default_factory=list)
    untrained: UntrainedRecord | None = None  # label_words: the run's own prompt, the adapter disabled
    head: Metrics | None = None  # label_words: the classification-head LoRA on the same split (its own run)
    ensemble: EnsembleRecord | None = None  # LoRA and the strongest encoder blended (after LoRA is trained)

    def strongest_encoder(self) -> tuple[int, EncoderRecord] | None:
        """The encoder chosen on validation (its index among the run's encoders), or None."""
        if not self.encoders:
            return None
        return max(enumerate(self.encoders), key=lambda pair: pair[1].validation_score)

    def summary(self) -> BaselineSummary:
        out = BaselineSummary(skipped=list(self.skipped))
        if self.zero_shot is not None:
            out.zero_shot_accuracy = self.zero_shot.zero_shot.accuracy
            out.calibrated_accuracy = self.zero_shot.calibrated.accuracy
        if self.tfidf is not None:
            out.tfidf_accuracy, out.tfidf_macro_f1 = self.tfidf.test.accuracy, self.tfidf.test.macro_f1
        if self.encoders:  # the strongest, chosen on validation
            _, strongest = self.strongest_encoder()
            out.encoder_accuracy, out.encoder_macro_f1 = strongest.test.accuracy, strongest.test.macro_f1
        return out


def zero_shot_skip_reason(config: Config, id2label: dict[int, str]) -> str | None:
    """Why the zero-shot prompt would say nothing here (None: it runs)."""
    if unsupported := problem_for(config.problem).zero_shot_unsupported:
        return unsupported
    codes = code_labels(config, id2label)
    return codes_reason(codes) if codes else None


# the rungs each scorer climbs, by the name a config gives them (`baselines`) -> the rung run for it
RUNGS = {
    "head": {"zero_shot": "zero_shot_prompt", "tfidf": "tfidf", "encoder": "encoder"},
    "label_words": {"zero_shot": "untrained", "head": "head_lora"},
}


def rungs_of(config: Config, scorer_name: str) -> list[str]:
    """The rungs a run climbs: the config's baselines that its scorer has, as rung names (in RUNGS' order)."""
    if not config.baseline:
        return []
    return [rung for name, rung in RUNGS[scorer_name].items() if name in config.baselines]


def run_ladder(setup: Setup, tokenizer, run: Path | None, rungs: list[str], own: tuple[Scorer, Built] | None = None):
    """The rungs run in this process, on the test split (`head_lora` trains a run of its own: the job runs
    it); with `run`, each record is written there (and read back where a resumed run already has it).
    `own`: the run's scorer and its model before training, for the `untrained` rung."""
    config, dataset, log = setup.config, setup.dataset, setup.log
    ladder = Ladder()
    if "zero_shot_prompt" in rungs:
        reason = zero_shot_skip_reason(config, dataset.id2label)
        if reason:
            log(f"baseline: zero-shot skipped: {reason}")
            ladder.skipped.append(SkippedBaseline("zero_shot", reason))
        else:
            ladder.zero_shot = _cached(
                run, runs.BASELINE, runs.read_baseline, lambda: _zero_shot(setup, tokenizer, run)
            )
    if "untrained" in rungs and own is not None:
        scorer, built = own
        ladder.untrained = _cached(run, runs.UNTRAINED, runs.read_untrained, lambda: scorer.untrained(setup, built))
    if "tfidf" in rungs:
        ladder.tfidf = _cached(run, runs.TFIDF, runs.read_tfidf, lambda: run_tfidf(dataset, config.seed, log))
    if "encoder" in rungs:
        for index, spec in enumerate(encoder_specs(config)):
            folder = None if run is None else run / runs.encoder_folder(index)
            try:
                record = _cached(
                    run,
                    runs.encoder_file(index),
                    lambda run, index=index: runs.read_encoder(run, index),
                    lambda spec=spec, folder=folder: run_encoder(
                        dataset, config, setup.runtime, spec, log, save_to=folder
                    ),
                )
            except EncoderSkipped as skipped:
                log(f"baseline: {skipped}")
                ladder.skipped.append(SkippedBaseline(f"encoder {spec}", str(skipped)))
                continue
            ladder.encoders.append(record)
    return ladder


def _cached(run: Path | None, name: str, read, compute):
    if run is not None and (run / name).is_file():
        return read(run)
    record = compute()
    if run is not None:
        runs.write_record(run / name, record)
    return record


def _zero_shot(setup: Setup, tokenizer, run: Path | None) -> BaselineRecord:
    dataset = setup.dataset
    test = dataset.test
    result, plain, _ = run_baseline(setup.model_dir, tokenizer, dataset, setup.config, setup.runtime, setup.log)
    if run is not None:
        files.write_jsonl(
            run / runs.PREDICTIONS / "baseline_test.jsonl",
            [row.to_json() for row in prediction_rows(test.texts, test.labels, plain, dataset.id2label, Decision())],
        )
    return result


def ensemble_of(ladder: Ladder | None, run: Path, dataset, select_by: str, lora: dict, log) -> None:
    """The ensemble rung, once LoRA's calibrated probabilities exist (`lora`: split -> probabilities): the
    strongest encoder's saved probabilities blended with them (ensemble.json; a resumed run reads it)."""
    strongest = ladder.strongest_encoder() if ladder is not None else None
    if strongest is None or strongest[1].saved is None:
        return
    if (run / runs.ENSEMBLE).is_file():
        ladder.ensemble = runs.read_ensemble(run)
        return
    index, record = strongest
    other = read_encoder_probabilities(run / runs.encoder_folder(index))
    if other is None or other["test"].shape != lora["test"].shape:
        log(f"ensemble: skipped: the encoder's probabilities in {run / runs.encoder_folder(index)} cannot be read")
        return
    ladder.ensemble = fit_ensemble(dataset, select_by, record.model, lora, other)
    if ladder.ensemble is None:
        log("ensemble: no blend helps on validation (the best weight is one model alone): no ensemble row")
        return
    runs.write_record(run / runs.ENSEMBLE, ladder.ensemble)
    log(
        f"ensemble: LoRA x {ladder.ensemble.weight:g} + encoder {record.model} x {1 - ladder.ensemble.weight:g} "
        f"(chosen on validation): test {dataset.kind.accuracy_name} {ladder.ensemble.test.accuracy:.4f}"
    )


def verdict_of(ladder: Ladder | None, lora: LadderRow, examples: int, select_by: str) -> Verdict:
    """Every model side by side, and which to ship."""
    ladder, rows = ladder or Ladder(), []
    if ladder.zero_shot is not None:
        zero = ladder.zero_shot
        common = dict(train_seconds=0.0, texts_per_second=zero.texts_per_second, parameters=zero.parameters)
        rows += [
            LadderRow(
                "zero-shot",
                zero.zero_shot.accuracy,
                zero.zero_shot.macro_f1,
                **common,
                detail="the base LM scores each label's word after a prompt",
            ),
            LadderRow(
                "zero-shot, calibrated",
                zero.calibrated.accuracy,
                zero.calibrated.macro_f1,
                ece=zero.calibrated_ece,
                **common,
                detail="content-free prompt correction",
            ),
        ]
    if ladder.tfidf is not None:
        tfidf = ladder.tfidf
        rows.append(
            LadderRow(
                "TF-IDF",
                tfidf.test.accuracy,
                tfidf.test.macro_f1,
                ece=tfidf.ece,
                train_seconds=tfidf.seconds,
                texts_per_second=tfidf.texts_per_second,
                parameters=tfidf.parameters,
                detail=f"+ logistic regression, C={tfidf.c:g}",
            )
        )
    several = len(ladder.encoders) > 1
    encoder_rows = []
    for enc in ladder.encoders:
        detail = f"{enc.model} fine-tuned, lr {enc.learning_rate:g}, best epoch {enc.best_epoch} of {enc.epochs}"
        name = f"encoder {enc.model}" if several or enc.model in ("mpnet-base", "minilm") else "encoder"
        notes = (" (still improving)" if enc.still_improving else "") + (
            " (stopped by encoder_budget_s)" if enc.budget_stop else ""
        )
        encoder_rows.append(encoder_row(enc, name, detail + notes))
    rows += encoder_rows + [lora]
    if ladder.ensemble is not None:
        index, _ = ladder.strongest_encoder()
        rows.append(ensemble_row(ladder.ensemble, lora, encoder_rows[index]))
    verdict = decide(rows, examples, select_by)
    verdict.notes = [skip.reason for skip in ladder.skipped if skip.name.startswith("encoder")]
    return verdict


def _sum(a, b):
    return None if a is None or b is None else a + b


def ensemble_row(record: EnsembleRecord, lora: LadderRow, encoder: LadderRow) -> LadderRow:
    """The blend's row: its test scores; its cost is both members' (train time and parameters add up, and a
    text passes through both models: 1 / (1/a + 1/b) texts per second)."""
    speeds = [lora.texts_per_second, encoder.texts_per_second]
    return LadderRow(
        f"ensemble ({lora.name} + {record.encoder})",
        record.test.accuracy,
        record.test.macro_f1,
        ece=record.test_ece,
        train_seconds=_sum(lora.train_seconds, encoder.train_seconds),
        texts_per_second=None if None in speeds or 0 in speeds else 1 / (1 / speeds[0] + 1 / speeds[1]),
        parameters=_sum(lora.parameters, encoder.parameters),
        detail=f"calibrated probabilities averaged, {lora.name} x {record.weight:g} (chosen on validation)",
    )


def encoder_row(record: EncoderRecord, name: str, detail: str) -> LadderRow:
    """A fine-tuned encoder's row of the verdict (a distilled student's too): its test scores and cost."""
    return LadderRow(
        name,
        record.test.accuracy,
        record.test.macro_f1,
        ece=record.test_ece,
        train_seconds=record.train_seconds,
        texts_per_second=record.texts_per_second,
        parameters=record.parameters,
        detail=detail,
    )


def say_verdict(verdict: Verdict, log) -> None:
    log("side by side on the test split:\n" + format_table(verdict))
