"""The run directory: every file written atomically (temp file + rename), so nothing is half-written."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from loracls.errors import LoraclsError

# file names inside a run directory
CONFIG = "config.yaml"
ENV = "env.json"
LABELS = "labels.json"
TRAIN_LOG = "train_log.jsonl"
METRICS = "metrics.json"
BASELINE = "baseline.json"
ADAPTER = "adapter"
MERGED = "merged"
PREDICTIONS = "predictions"
CHECKPOINT = "checkpoint.pt"


def new_run_dir(output_dir: str, run_name: str | None) -> Path:
    name = run_name or time.strftime("run-%Y%m%d-%H%M%S")
    path = Path(output_dir) / name
    if path.exists() and any(path.iterdir()):
        raise LoraclsError(f"run directory {path} already exists and is not empty (choose another run_name)")
    path.mkdir(parents=True, exist_ok=True)
    (path / PREDICTIONS).mkdir(exist_ok=True)
    return path


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def write_json(path: Path, data) -> None:
    write_text(path, json.dumps(data, indent=2) + "\n")


def write_yaml(path: Path, data) -> None:
    write_text(path, yaml.safe_dump(data, sort_keys=False))


def write_jsonl(path: Path, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def append_jsonl(path: Path, row: dict) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def truncate_lines(path: Path, keep: int) -> None:
    """Keep the first `keep` lines (a resumed run drops what was logged after its checkpoint)."""
    if path.is_file():
        lines = path.read_text().splitlines(keepends=True)
        write_text(path, "".join(lines[:keep]))


def replace_dir(target: Path, fill) -> None:
    """Write a directory through `fill(staging_path)` and swap it in whole."""
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    old = target.with_name(target.name + ".old")
    try:
        fill(staging)
        if target.exists():
            os.replace(target, old)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LoraclsError(f"{path} not found") from None
    except json.JSONDecodeError as exc:
        raise LoraclsError(f"{path} is not valid JSON ({exc})") from None


def read_config(run: Path):
    """The Config a run was made with (its config.yaml), checked like any other config."""
    from loracls.config import from_dict

    return from_dict(yaml.safe_load((run / CONFIG).read_text()) or {})


def check_resumable(path: str) -> Path:
    run = Path(path)
    for name in (CONFIG, LABELS, CHECKPOINT):
        if not (run / name).exists():
            raise LoraclsError(f"cannot resume {path}: {name} missing (a run is resumable after its first validation)")
    if (run / METRICS).exists():
        raise LoraclsError(f"{path} already finished ({METRICS} exists); nothing to resume")
    return run


def check_run_dir(path: str) -> Path:
    run = Path(path)
    for name in (CONFIG, LABELS, ADAPTER):
        if not (run / name).exists():
            raise LoraclsError(f"{path} is not a finished loracls run directory ({name} missing)")
    return run
