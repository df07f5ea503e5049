"""`loracls tune CONFIG [CONFIG ...] --trials N [--space key=spec ...]`: an Optuna search over the training
settings, judged on validation only.

Each trial trains one run per config (data set) with the same sampled settings; its value is the mean over
the configs of the best validation score (each config's `select_by`: accuracy, macro F1, or minus the loss),
so a setting that helps one data set and hurts another does not win. The test split is never read for the
search: every trial's results table holds validation scores only. The study lives in `study.db` (SQLite)
inside the tune directory, so an interrupted search continues where it stopped when run again. With
`--engine ray` each trial is a Ray Tune trial (`loracls.jobs.ray_trials`) sampled by the same Optuna study.

A space is `key=spec` per setting: `log:LOW:HIGH` (a float on a log scale), `float:LOW:HIGH`, `int:LOW:HIGH`,
or alternatives separated by commas as in `sweep` (a bracketed YAML list is one alternative).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from loracls import files, runs
from loracls.config import Config
from loracls.config_reader import FIELDS, from_dict, parse_value, split_alternatives
from loracls.errors import Log, LoraclsError, quiet
from loracls.model.lora import DEFAULT_TARGETS

__all__ = ["DEFAULT_SPACE", "Dimension", "Tuning", "parse_space", "run_tune"]

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
ALL_LINEAR = ATTENTION + ["gate_proj", "up_proj", "down_proj"]
# the levers of the default search: learning rate, rank, scale, which layers, how long, how the head starts
DEFAULT_SPACE = {
    "learning_rate": "log:5e-5:2e-3",
    "r": "4,8,16,32",
    "lora_alpha": "8,16,32,64",
    "target_modules": "[q_proj,v_proj],[" + ",".join(ATTENTION) + "],[" + ",".join(ALL_LINEAR) + "]",
    "epochs": "int:1:5",
    "head_init": "zero,verbalizer",
}
SCORE_KEYS = {"accuracy": "validation_accuracy", "macro_f1": "validation_macro_f1", "loss": "validation_loss"}


@dataclass
class Dimension:
    """One searched setting: a float or int range (log scale or not), or a list of alternatives."""

    key: str
    kind: str  # log | float | int | choice
    low: float | None = None
    high: float | None = None
    choices: list | None = None

    def suggest(self, trial):
        return self.decode(self.suggest_raw(trial))

    def suggest_raw(self, trial):
        """The value as Optuna stores it: every alternative travels as its JSON text."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, [json.dumps(c) for c in self.choices])
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high))
        return trial.suggest_float(self.key, self.low, self.high, log=self.kind == "log")

    def decode(self, raw):
        return json.loads(raw) if self.kind == "choice" else raw


def _dimension(key: str, spec: str) -> Dimension:
    kind, _, rest = spec.partition(":")
    if kind in ("log", "float", "int") and rest:
        try:
            low, high = (float(v) for v in rest.split(":"))
        except ValueError:
            raise LoraclsError(f"--space {key}: {kind} needs LOW:HIGH numbers, got {rest!r}") from None
        if not (math.isfinite(low) and math.isfinite(high) and low < high) or (kind == "log" and low <= 0):
            raise LoraclsError(
                f"--space {key}: need finite LOW < HIGH{' and LOW > 0' if kind == 'log' else ''}, got {rest!r}"
            )
        return Dimension(key, kind, low, high)
    choices = [parse_value(key, v) for v in split_alternatives(spec)]
    if not choices:
        raise LoraclsError(f"--space {key} has no values")
    return Dimension(key, "choice", choices=choices)


def parse_space(items: list[str] | None) -> list[Dimension]:
    """`key=spec` strings (none: the default space) -> dimensions; unknown keys get the nearest name."""
    pairs = [item.split("=", 1) for item in items] if items else list(DEFAULT_SPACE.items())
    dims = []
    for pair in pairs:
        if len(pair) != 2:
            raise LoraclsError(f"--space expects key=spec, got {pair[0]!r}")
        key = pair[0].strip()
        if key not in FIELDS:
            from_dict({key: None})  # the unknown-key error with the nearest name
        if any(d.key == key for d in dims):
            raise LoraclsError(f"--space names {key!r} twice")
        dims.append(_dimension(key, pair[1]))
    return dims


def _check_space(bases: list[Config], dims: list[Dimension]) -> None:
    """Every corner of the space must make a valid config for every base: refused before anything runs."""
    for dim in dims:
        values = dim.choices if dim.kind == "choice" else [dim.low, dim.high]
        if dim.kind == "int":
            values = [int(v) for v in values]
        for base in bases:
            for value in values:
                from_dict({dim.key: value}, base=base)


def validation_score(run: Path, select_by: str) -> float:
    """The best checkpoint's validation score by `select_by` (higher is better: the loss is negated)."""
    best = runs.read_metrics(run).validation.best_step
    rows = [row for row in runs.read_train_log(run) if isinstance(row, runs.ValidationLogLine) and row.step == best]
    if not rows:
        raise LoraclsError(f"{run}: no validation at the best step {best} in {runs.TRAIN_LOG}")
    value = float(getattr(rows[-1], SCORE_KEYS[select_by]))
    return -value if select_by == "loss" else value


STUDY = "loracls"
TRIAL_NUMBER = "optuna_trial"  # the Optuna trial's number, beside its values in a Ray trial's params


@dataclass(frozen=True)
class Tuning:
    """One search: a config per data set (`bases`, named by `names`), the searched `dims`, the tune directory the
    trials' runs go to, the job a trial runs (`train(config, log)`) and where it says what it did."""

    bases: list[Config]
    names: list[str]
    dims: list[Dimension]
    tune_dir: Path
    train: Callable
    log: Log = print

    @classmethod
    def of(cls, bases: list[Config], names: list[str], dims: list[Dimension], train: Callable, log: Log = print):
        """The search of `loracls tune`: its directory is the first config's output_dir / run_name (or tune)."""
        first = bases[0]
        tune_dir = (Path(first.output_dir) / (first.run_name or "tune")).resolve()
        return cls(bases, names, dims, tune_dir, train, log)


def _trial_configs(tuning: Tuning, values: dict, number: int):
    trial_values = {**values, "baseline": False, "merge": False, "output_dir": str(tuning.tune_dir)}
    return [
        (name, from_dict({**trial_values, "run_name": _run_name(number, name)}, base=base))
        for base, name in zip(tuning.bases, tuning.names)
    ]


def _run_name(number: int, name: str) -> str:
    return f"trial{number:03d}-{name}"


def _trial_scores(tuning: Tuning, values: dict, number: int) -> dict[str, float]:
    """Train the trial's run on every data set (a run finished before is read, not retrained); the best
    validation score of each."""
    scores = {}
    for name, config in _trial_configs(tuning, values, number):
        run = tuning.tune_dir / config.run_name
        if not (run / runs.METRICS).is_file():
            tuning.train(config, tuning.log)
        scores[name] = validation_score(run, config.select_by)
    return scores


def _open_study(tune_dir: Path, seed: int):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=STUDY,
        storage=f"sqlite:///{tune_dir / 'study.db'}",
        load_if_exists=True,
        direction="maximize",
    )
    study.sampler = _sampler(seed, study)
    return study


def _sampler(seed: int, study):
    """TPE seeded with the seed plus the trials the study holds: a continued study draws new points (the same
    seed replayed the first run's random start-up trials as trials 6-9 of a study continued twice)."""
    import optuna

    return optuna.samplers.TPESampler(seed=seed + len(study.trials))


def run_tune(tuning: Tuning, trials: int, ray=None) -> Path:
    """Run the study (continuing one already in the tune directory), here or (`ray`: RayOptions) as Ray
    Tune trials; returns the tune directory."""
    _check_space(tuning.bases, tuning.dims)
    first, tune_dir = tuning.bases[0], tuning.tune_dir
    tune_dir.mkdir(parents=True, exist_ok=True)
    with runs.hold(tune_dir):  # one driver a study: a trial still RUNNING in study.db was cut off
        study = _open_study(tune_dir, first.seed)
        _fail_cut_off(study, tuning.log)
        if not study.trials:
            _enqueue_own_settings(study, first, tuning.dims, tuning.log)
        _optimize(study, tuning, trials, ray)
        _write_results(_open_study(tune_dir, first.seed), tuning)
    return tune_dir


def _fail_cut_off(study, log) -> None:
    """Trials a killed driver left RUNNING (a Ray node out of memory, kill -9) marked failed: the study then
    counts and continues from its complete trials only."""
    import optuna

    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        log(f"tune: trial {trial.number} was cut off before it finished (its driver stopped); marked failed")


def _optimize(study, tuning: Tuning, trials: int, ray) -> None:
    import optuna

    dims, log = tuning.dims, tuning.log
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    log(
        f"tune: {trials} trials over {', '.join(d.key for d in dims)} on {len(tuning.bases)} data set(s) in "
        + str(tuning.tune_dir)
        + (f" ({done} done before)" if done else "")
        + (f" on Ray, {ray.cpus_per_trial} CPU(s) / {ray.gpus_per_trial:g} GPU(s) a trial" if ray else "")
    )
    remaining = max(trials - done, 0)

    def objective(trial) -> float:
        values = {dim.key: dim.suggest(trial) for dim in dims}
        scores = _trial_scores(tuning, values, trial.number)
        mean = sum(scores.values()) / len(scores)
        log(f"tune: trial {trial.number}: {values} -> mean validation {mean:.4f}")
        return mean

    if ray is None:
        study.optimize(objective, n_trials=remaining, catch=())
    elif remaining:
        _optimize_on_ray(study, tuning, remaining, ray)


def _enqueue_own_settings(study, base: Config, dims: list[Dimension], log) -> None:
    """Trial 0 tries the (first) config's own value of every searched setting that lies in the space, so the
    table shows whether the search beat the settings it started from."""
    own = {}
    for dim in dims:
        value = getattr(base, dim.key)
        if dim.key == "target_modules" and value is None:  # null: the family's q_proj, v_proj
            value = list(DEFAULT_TARGETS)
        if dim.kind == "choice" and value in dim.choices:
            own[dim.key] = json.dumps(value)
        elif dim.kind != "choice" and isinstance(value, int | float) and dim.low <= value <= dim.high:
            own[dim.key] = value
    if own:
        study.enqueue_trial(own)
        log(f"tune: trial 0 tries the config's own {', '.join(f'{k}={getattr(base, k)}' for k in own)}")


def _suggest_numbered(dims: list[Dimension], trial) -> dict:
    """OptunaSearch's define-by-run space: every dimension suggested, and the trial's number passed on."""
    for dim in dims:
        dim.suggest_raw(trial)
    return {TRIAL_NUMBER: trial.number}


def _ray_trial(params: dict, tuning: Tuning, threads: int, cwd: str) -> dict:
    """One Ray Tune trial: the sampled values decoded, a run per data set with the trial's CPU threads."""
    from loracls.jobs.ray_trials import in_trial_dir

    in_trial_dir(cwd)
    values = {dim.key: dim.decode(params[dim.key]) for dim in tuning.dims}
    number = params[TRIAL_NUMBER]
    scores = _trial_scores(replace(tuning, log=quiet), values | {"threads": threads}, number)
    return {"mean_validation": sum(scores.values()) / len(scores), "trial_number": number}


def _optimize_on_ray(study, tuning: Tuning, remaining: int, ray) -> None:
    import optuna

    from loracls.hardware import ray_session
    from loracls.jobs.ray_trials import TrialSearch, run_trials

    dims, tune_dir = tuning.dims, tuning.tune_dir

    with ray_session(ray.address, os.cpu_count(), "tune --engine ray"):
        from ray.tune.search.optuna import OptunaSearch

        searcher = OptunaSearch(
            space=functools.partial(_suggest_numbered, dims),
            metric="mean_validation",
            mode="max",
            sampler=_sampler(tuning.bases[0].seed, study),
            study_name=STUDY,
            storage=optuna.storages.RDBStorage(f"sqlite:///{tune_dir / 'study.db'}"),
        )
        arguments = dict(tuning=tuning, threads=ray.cpus_per_trial, cwd=os.getcwd())
        search = TrialSearch(algorithm=searcher, samples=remaining, command="tune --engine ray")
        results = run_trials(_ray_trial, arguments, tune_dir, ray, search)
    for result in sorted(results, key=lambda r: r["trial_number"]):
        values = {dim.key: dim.decode(result["config"][dim.key]) for dim in dims}
        tuning.log(f"tune: trial {result['trial_number']}: {values} -> mean validation {result['mean_validation']:.4f}")


def _write_results(study, tuning: Tuning) -> None:
    """results.csv / results.md (every complete trial, best first in the markdown) and best.yaml; each data
    set's score read from its run."""
    import optuna

    tune_dir, dims, names, bases = tuning.tune_dir, tuning.dims, tuning.names, tuning.bases

    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    columns = ["trial", *[d.key for d in dims], *[f"validation_{n}" for n in names], "mean_validation", "seconds"]
    rows = [
        {
            "trial": t.number,
            **{d.key: _shown(d, t.params.get(d.key)) for d in dims},
            **{
                f"validation_{n}": validation_score(tune_dir / _run_name(t.number, n), base.select_by)
                for n, base in zip(names, bases)
            },
            "mean_validation": t.value,
            "seconds": (t.datetime_complete - t.datetime_start).total_seconds(),
        }
        for t in complete
    ]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    files.write_text(tune_dir / "results.csv", buffer.getvalue())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += [
        "| " + " | ".join(_cell(r[c]) for c in columns) + " |"
        for r in sorted(rows, key=lambda r: -r["mean_validation"])
    ]
    files.write_text(tune_dir / "results.md", "\n".join(lines) + "\n")
    if complete:
        best = study.best_trial
        settings = {d.key: d.suggest(optuna.trial.FixedTrial(best.params)) for d in dims}
        files.write_text(
            tune_dir / "best.yaml",
            f"# trial {best.number}: mean validation {best.value:.4f} over "
            f"{', '.join(names)} (use with --set, or merge into a config)\n"
            + yaml.safe_dump(settings, sort_keys=False, default_flow_style=None),
        )


def _shown(dim: Dimension, value):
    """A trial's value as the config takes it (alternatives are stored as JSON text)."""
    if dim.kind != "choice" or value is None:
        return value
    value = json.loads(value)
    return ",".join(map(str, value)) if isinstance(value, list) else value


def _cell(value) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
