"""Training runs as Ray Tune trials, for `tune --engine ray` (Optuna's sampler through Ray Tune's
OptunaSearch) and `sweep --engine ray` (the grid as Ray Tune's grid search): each trial gets its own
resources (`--cpus-per-trial`, `--gpus-per-trial`) and Ray runs as many at once as the cluster holds. The
runs land in the same directory as a local search's and the same results table is written from them.

With no `--address` a local Ray starts for the command and stops after it; `--address auto` joins a cluster
started with `ray start --head` (docs/scale.md). Optional: the `ray` extra."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loracls.errors import LoraclsError, first_line
from loracls.hardware import ray_session

__all__ = ["RayOptions", "TrialSearch", "run_trials", "in_trial_dir"]


@dataclass(frozen=True)
class RayOptions:
    """Where the trials run and what each one holds."""

    address: str | None = None  # None: a local Ray for the command
    cpus_per_trial: int = 1  # also the trial's torch threads
    gpus_per_trial: float = 0


@dataclass(frozen=True)
class TrialSearch:
    """Which trials run: Ray Tune's `param_space` (sweep's grid), a search `algorithm` drawing `samples` trials
    (tune's OptunaSearch), and the command named in messages."""

    param_space: dict | None = None
    algorithm: object = None
    samples: int = 1
    command: str = "--engine ray"


def in_trial_dir(cwd: str) -> None:
    """A trial starts in its own Ray directory: relative paths in the configs are the driver's."""
    if os.path.isdir(cwd):
        os.chdir(cwd)


def run_trials(trainable: Callable, arguments: dict, out: Path, options: RayOptions, search: TrialSearch) -> list[dict]:
    """Run `trainable(params, **arguments)` as Ray Tune trials; each trial's returned metrics, with its
    params under "config". A trial that fails fails the command, with its error in one line."""
    command = search.command
    # Ray Tune's own output: its legacy reporter honours verbose=0 (the new one prints a settings box), and no
    # TensorBoard / CSV / JSON loggers per trial (the runs log to their own train_log)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    with ray_session(options.address, os.cpu_count(), command):
        from ray import tune

        resources = {"cpu": options.cpus_per_trial, "gpu": options.gpus_per_trial}
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(trainable, **arguments), resources),
            param_space=search.param_space or {},
            tune_config=tune.TuneConfig(search_alg=search.algorithm, num_samples=search.samples),
            run_config=tune.RunConfig(storage_path=str((out / "ray").resolve()), name="trials", verbose=0),
        )
        try:
            grid = tuner.fit()
        except RuntimeError as exc:  # Ray's memory monitor killed a trial's worker: say what to change
            if "low on memory" not in str(exc):
                raise
            raise LoraclsError(
                f"{command}: Ray killed a trial, the node ran low on memory ({first_line(exc, 160)}); run fewer "
                "trials at once (a larger --cpus-per-trial); the finished trials are kept and the same command "
                "continues"
            ) from None
        failed = [result.error for result in grid if result.error is not None]
        if failed:
            cause = getattr(failed[0], "cause", None) or failed[0]
            raise LoraclsError(f"{command}: {len(failed)} trial(s) failed; the first: {first_line(cause, 300)}")
        return [dict(result.metrics) | {"config": dict(result.config)} for result in grid]
