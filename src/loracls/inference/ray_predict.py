"""`loracls predict RUN --file IN --out DIR --engine ray [--address A] [--workers N]`: Ray Data reads IN (a
local file, or any path Ray reads), a pool of actors loads the run's engine once each and scores batches of
texts (`map_batches`), and the rows are written as Parquet files into DIR, in input order. Optional: the
`ray` extra (`pip install 'loracls[ray]'`); without it the command says so in one line.

With no `--address` a local Ray starts for the call and stops after it; `--address auto` (or
`ray://host:10001`) joins a cluster started with `ray start --head` (docs/scale.md)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from loracls.data.text_chunks import CHUNK_ROWS, TextColumn, check_texts
from loracls.errors import Log, LoraclsError, quiet
from loracls.hardware import ray_session
from loracls.inference.streaming import FileJob

__all__ = ["predict_with_ray"]

READERS = {".csv": "read_csv", ".jsonl": "read_json", ".ndjson": "read_json", ".parquet": "read_parquet"}


class _Scorer:
    """One Ray actor: the run's engine, loaded once, scoring one batch of texts at a time."""

    def __init__(self, run: str, batch_size: int | None, engine: str):
        from loracls.inference.loaded import EngineOptions, predictor

        self.score = predictor(run, EngineOptions(batch_size, engine=engine), quiet)

    def __call__(self, batch):
        texts = [str(text) for text in batch["text"]]
        rows = self.score(texts)
        return {key: [row[key] for row in rows] for key in rows[0]} if rows else {}


def predict_with_ray(
    job: FileJob, address: str | None, workers: int, batch_rows: int, batch_size: int | None = None, log: Log = print
) -> int:
    """Scores every text of the job's file into the Parquet folder `out` with `workers` Ray Data actors,
    `batch_rows` rows a task; the number of rows written."""
    run, file, out, text_column = job.run, job.file, job.out, job.text_column
    try:
        import pyarrow.dataset
        import ray
        import ray.data
    except ImportError:
        raise LoraclsError("--engine ray needs the ray extra: pip install 'loracls[ray]'") from None
    path, column = file, text_column
    if "://" not in file:  # a local file is checked before Ray starts: type, text column, no empty text
        source = TextColumn(file, text_column)
        check_texts(source, CHUNK_ROWS)
        path, column = str(source.path.resolve()), source.column
    reader = READERS.get(Path(file.split("://")[-1]).suffix.lower())
    if reader is None:
        raise LoraclsError(f"--engine ray reads {', '.join(READERS)} files, not {file}")
    if Path(out).exists():
        raise LoraclsError(f"predict: {out} exists; remove it first (Ray writes a new folder)")
    # a local Ray gets a logical CPU beyond the actors' own, for the read and write tasks
    with ray_session(address, max(os.cpu_count() or 1, workers + 1)):
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True  # the output's rows in the input's order
        context.enable_progress_bars = False
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        dataset = getattr(ray.data, reader)(path)
        dataset = dataset.select_columns([column]).rename_columns({column: "text"})
        scored = dataset.map_batches(
            _Scorer,
            fn_constructor_args=(str(Path(run).resolve()), batch_size, "torch"),
            batch_size=batch_rows,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=workers),
            num_cpus=1,
        )
        scored.write_parquet(str(Path(out).resolve()))
        rows = pyarrow.dataset.dataset(str(Path(out).resolve()), format="parquet").count_rows()
    log(f"predict: {rows} rows in {out} (Ray Data, {workers} worker(s))")
    return rows
