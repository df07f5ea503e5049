"""`loracls sweep CONFIG --grid key=v1,v2 ...`: train every combination, one table of the results.

Alternatives are separated by commas; a bracketed YAML list is one alternative:
`--grid r=8,16,32 "target_modules=[q_proj,v_proj],[q_proj,k_proj,v_proj,o_proj]" train_size=1200,5000`.

With `--engine ray` the grid is a Ray Tune grid search: each run a trial with its own resources, as many at
once as the cluster holds (`loracls.jobs.ray_trials`); the same runs and the same table come out.
"""

from __future__ import annotations

import csv
import io
import itertools
import os
import time
from dataclasses import asdict, astuple, dataclass, fields
from pathlib import Path

from loracls import files, runs
from loracls.config import Config
from loracls.config_reader import FIELDS, from_dict, parse_value, split_alternatives
from loracls.errors import Log, LoraclsError, quiet


@dataclass
class SweepRow:
    """One run of a sweep, as results.csv and results.md hold it (None: not measured in that run)."""

    run: str
    validation_accuracy: float
    test_accuracy: float
    test_macro_f1: float
    test_micro_f1: float | None  # multi_label runs
    zero_shot_accuracy: float | None
    calibrated_accuracy: float | None
    tfidf_accuracy: float | None
    encoder_accuracy: float | None
    train_tokens_per_second: float
    seconds: float


COLUMNS = [f.name for f in fields(SweepRow)]


def parse_grid(items: list[str]) -> dict[str, list]:
    grid = {}
    for item in items:
        if "=" not in item:
            raise LoraclsError(f"--grid expects key=v1,v2,..., got {item!r}")
        key, values = item.split("=", 1)
        key = key.strip()
        if key not in FIELDS:
            from_dict({key: None})  # raises the unknown-key error with the nearest name
        if key in grid:
            raise LoraclsError(f"--grid names {key!r} twice")
        grid[key] = [parse_value(key, v) for v in split_alternatives(values)]
        if not grid[key]:
            raise LoraclsError(f"--grid {key} has no values")
    return grid


def _label(value) -> str:
    return "+".join(map(str, value)) if isinstance(value, list) else str(value)


def combinations(base: Config, grid: dict[str, list]) -> list[tuple[str, Config]]:
    """(run name, config) per grid point; every config is validated before anything runs."""
    out = []
    keys = list(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        name = "-".join(f"{k}={_label(v)}" for k, v in zip(keys, values)).replace("/", "_").replace("\\", "_")
        out.append((name, from_dict(dict(zip(keys, values)), base=base)))
    return out


def _row(name: str, run: Path, seconds: float) -> SweepRow:
    metrics = runs.read_metrics(run)
    baselines = {
        f"{name}_accuracy": _rounded(getattr(metrics.baseline, f"{name}_accuracy", None))
        for name in ("zero_shot", "calibrated", "tfidf", "encoder")
    }
    return SweepRow(
        run=name,
        validation_accuracy=round(metrics.validation.best_accuracy, 4),
        test_accuracy=round(metrics.test.accuracy, 4),
        test_macro_f1=round(metrics.test.macro_f1, 4),
        test_micro_f1=_rounded(getattr(metrics.test, "micro_f1", None)),
        train_tokens_per_second=round(metrics.train.tokens_per_second, 1),
        seconds=round(seconds, 1),
        **baselines,
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def markdown_table(rows: list[SweepRow]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join("" if v is None else str(v) for v in astuple(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def run_sweep(base: Config, grid: dict[str, list], train, log: Log = print, ray=None) -> Path:
    """Train every grid point (here one after another, or as Ray Tune trials with `ray`: RayOptions)."""
    points = combinations(base, grid)
    sweep_dir = Path(base.output_dir) / (base.run_name or time.strftime("sweep-%Y%m%d-%H%M%S"))
    if sweep_dir.exists() and any(sweep_dir.iterdir()):
        raise LoraclsError(f"sweep directory {sweep_dir} already exists and is not empty")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with runs.hold(sweep_dir):  # one writer per sweep directory
        if ray is not None:
            return _run_points_on_ray(sweep_dir, points, grid, train, ray, log)
        return _run_points(sweep_dir, points, grid, train, log)


def _run_points(sweep_dir: Path, points: list, grid: dict[str, list], train, log) -> Path:
    log(f"sweep: {len(points)} runs in {sweep_dir}")
    rows = []
    for i, (name, config) in enumerate(points, 1):
        log(f"sweep: run {i}/{len(points)}: {name}")
        started = time.perf_counter()
        run = train(from_dict({"output_dir": str(sweep_dir), "run_name": name}, base=config), log)
        rows.append(_row(name, run, time.perf_counter() - started))
        _write_rows(sweep_dir, rows)  # rewritten after every run
    return _finish(sweep_dir, rows, grid, log)


def _write_rows(sweep_dir: Path, rows: list[SweepRow]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(asdict(row) for row in rows)
    files.write_text(sweep_dir / "results.csv", buffer.getvalue())
    files.write_text(sweep_dir / "results.md", markdown_table(rows))


def _finish(sweep_dir: Path, rows: list[SweepRow], grid: dict[str, list], log) -> Path:
    files.write_json(sweep_dir / "grid.json", grid)
    log("\n" + markdown_table(rows))
    return sweep_dir


def _ray_point(params: dict, points: dict, sweep_dir: str, train, threads: int, cwd: str) -> dict:
    """One Ray Tune trial: the grid point named in `params`, trained with the trial's CPU threads."""
    from loracls.jobs.ray_trials import in_trial_dir

    in_trial_dir(cwd)
    name = params["point"]
    started = time.perf_counter()
    train(from_dict({"output_dir": sweep_dir, "run_name": name, "threads": threads}, base=points[name]), quiet)
    return {"seconds": time.perf_counter() - started}


def _run_points_on_ray(sweep_dir: Path, points: list, grid: dict[str, list], train, ray, log) -> Path:
    from loracls.jobs.ray_trials import TrialSearch, run_trials

    log(
        f"sweep: {len(points)} runs in {sweep_dir} as Ray Tune trials "
        f"({ray.cpus_per_trial} CPU(s) / {ray.gpus_per_trial:g} GPU(s) a trial)"
    )
    arguments = dict(points=dict(points), sweep_dir=str(sweep_dir.resolve()), train=train, threads=ray.cpus_per_trial)
    grid_search = {"point": {"grid_search": [name for name, _ in points]}}  # Ray Tune's grid form
    search = TrialSearch(param_space=grid_search, command="sweep --engine ray")
    results = run_trials(_ray_point, arguments | {"cwd": os.getcwd()}, sweep_dir, ray, search)
    seconds = {result["config"]["point"]: result["seconds"] for result in results}
    rows = [_row(name, sweep_dir / name, seconds[name]) for name, _ in points]
    _write_rows(sweep_dir, rows)
    return _finish(sweep_dir, rows, grid, log)
