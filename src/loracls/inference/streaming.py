"""`predict --file IN --out OUT` on a file of any length: the texts are read, scored through the one engine
and written `chunk_rows` at a time, so memory stays flat and a crash loses at most the chunk in flight.

OUT is JSONL (one line a row, appended chunk by chunk, flushed to disk) or Parquet (a directory of part
files, one a chunk, each written whole and then renamed into place; `pandas.read_parquet(OUT)` reads them as
one table, in order). Beside the output a progress record says what it holds so far. `--resume` checks that
the run, the input file and the chunk size are the ones the record names, drops what a killed writer left
past the last completed chunk, skips the chunks done and goes on: no row lost or written twice, rows in
input order. The record is removed when the output is complete.

Bad input (a missing column, an empty text, an output that already exists) is refused before anything is
written: the input's text column is read through once first, which also gives the progress bar its ETA."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from loracls import files, runs
from loracls.data.text_chunks import TextColumn, check_texts, text_chunks
from loracls.errors import Log, LoraclsError

__all__ = ["OUTPUTS", "StreamProgress", "predict_file", "stream_to_stdout"]


@dataclass
class StreamProgress:
    """The progress record: what the output holds, and what it was made from."""

    run: str
    input: str
    input_bytes: int
    input_mtime_ns: int
    text_column: str | None
    chunk_rows: int
    total_rows: int
    rows_done: int = 0
    output_bytes: int = 0  # JSONL: the length of the completed chunks' lines


class JsonlOutput:
    """One JSONL file, appended a chunk at a time; a resume truncates it to the completed chunks."""

    def __init__(self, path: Path):
        self.path, self.progress_path = path, path.with_name(path.name + ".progress.json")
        self.lock_path = path.with_name(path.name + ".lock")

    def exists(self) -> bool:
        return self.path.exists()

    def begin(self, progress: StreamProgress) -> None:
        with files.writing(self.path, "the predictions"), open(self.path, "ab") as out:
            out.truncate(progress.output_bytes)

    def append(self, rows: list[dict], progress: StreamProgress) -> None:
        data = "".join(files.json_line(row) + "\n" for row in rows).encode("utf-8")
        with files.writing(self.path, "the predictions"), open(self.path, "ab") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        progress.output_bytes += len(data)


class ParquetOutput:
    """A directory of Parquet parts, `part-000000.parquet` for the first chunk and so on."""

    def __init__(self, path: Path):
        self.path, self.progress_path = path, path / "_progress.json"
        self.lock_path = path.with_name(path.name + ".lock")

    def exists(self) -> bool:
        return self.path.exists()

    def begin(self, progress: StreamProgress) -> None:
        with files.writing(self.path, "the predictions"):
            self.path.mkdir(parents=True, exist_ok=True)
        done = progress.rows_done // progress.chunk_rows
        for part in self.path.glob("part-*.parquet"):
            if int(part.name[5:11]) >= done:
                part.unlink()  # written after the last progress record: the chunk is scored again
        files.remove_leftovers(self.path)

    def append(self, rows: list[dict], progress: StreamProgress) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        part = self.path / f"part-{progress.rows_done // progress.chunk_rows:06d}.parquet"
        table = pa.Table.from_pylist(rows)
        files.write_file_atomically(part, lambda tmp: pq.write_table(table, tmp), "the predictions")


OUTPUTS = {".jsonl": JsonlOutput, ".parquet": ParquetOutput}


def output_for(out: str) -> JsonlOutput | ParquetOutput:
    kind = OUTPUTS.get(Path(out).suffix.lower())
    if kind is None:
        raise LoraclsError(f"predict: --out must end in {' or '.join(OUTPUTS)} (got {out})")
    return kind(Path(out))


@dataclass(frozen=True)
class FileJob:
    """What `predict --file` scores: the texts in `file`'s `text_column`, by the run `run`, into `out`."""

    run: str
    file: str
    out: str
    text_column: str = "text"


def predict_file(
    make_score: Callable[[], Callable[[list[str]], list[dict]]],
    job: FileJob,
    chunk_rows: int,
    resume: bool,
    log: Log = print,
) -> int:
    """Scores every text of the job's file into its `out`; the number of rows written by this call.
    `make_score()` loads the model once the input and output are checked (a bad file costs no model load)."""
    run, out = job.run, job.out
    output, source = output_for(out), TextColumn(job.file, job.text_column)
    progress = _resumed(output, source, run, chunk_rows) if resume else _fresh(output, source, run, chunk_rows)
    score = make_score()
    with files.writing(output.lock_path, "the output's folder"):  # missing folders are made, as plain --out does
        output.lock_path.parent.mkdir(parents=True, exist_ok=True)
    with files.exclusive(output.lock_path, wait=False, what=f"the output {out}"):
        try:
            if not resume:
                _refuse_existing(output)  # made by another call since the check above
                _start(output, progress)
            else:
                output.begin(progress)
            written = _score_chunks(score, source, output, progress, log)
            output.progress_path.unlink(missing_ok=True)
        finally:
            output.lock_path.unlink(missing_ok=True)  # ours while held
    log(f"predict: {progress.total_rows} rows in {out}" + (f" ({written} in this call)" if resume else ""))
    return written


def stream_to_stdout(
    make_score: Callable[[], Callable[[list[str]], list[dict]]], file: str, text_column: str, chunk_rows: int
) -> None:
    """JSONL on stdout, a chunk at a time (checked first: bad input prints nothing and loads no model)."""
    source = TextColumn(file, text_column)
    total = check_texts(source, chunk_rows)
    score = make_score()
    with tqdm(total=total, unit="row", desc="predict", smoothing=0.1) as bar:
        for texts in text_chunks(source, chunk_rows):
            sys.stdout.write("".join(files.json_line(row) + "\n" for row in score(texts)))
            sys.stdout.flush()
            bar.update(len(texts))


def _score_chunks(score, source: TextColumn, output, progress: StreamProgress, log) -> int:
    written = 0
    bar = tqdm(total=progress.total_rows, initial=progress.rows_done, unit="row", desc="predict", smoothing=0.1)
    with bar:
        for texts in text_chunks(source, progress.chunk_rows, skip=progress.rows_done):
            rows = score(texts)
            output.append(rows, progress)
            progress.rows_done += len(texts)
            runs.write_record(output.progress_path, progress)  # after the rows: the record never runs ahead
            written += len(texts)
            bar.update(len(texts))
    if progress.rows_done != progress.total_rows:
        raise LoraclsError(
            f"{source.file} changed while it was read: {progress.rows_done} rows, not {progress.total_rows}"
        )
    return written


def _fingerprint(source: TextColumn, run: str, chunk_rows: int) -> dict:
    stat = source.path.stat()
    return {
        "run": str(Path(run).resolve()),
        "input": str(source.path.resolve()),
        "input_bytes": stat.st_size,
        "input_mtime_ns": stat.st_mtime_ns,
        "text_column": source.column,
        "chunk_rows": chunk_rows,
    }


def _start(output, progress: StreamProgress) -> None:
    """A fresh output and its progress record, made together: the output never exists without the record
    until it is complete (a disk that fills in the first chunk once left a cut file that --resume took for a
    finished one). If the record cannot be written, the empty output is removed again."""
    output.begin(progress)
    try:
        runs.write_record(output.progress_path, progress)
    except BaseException:
        if output.path.is_dir():
            shutil.rmtree(output.path, ignore_errors=True)
        else:
            output.path.unlink(missing_ok=True)
        raise


def _refuse_existing(output) -> None:
    if output.exists():
        raise LoraclsError(f"predict: {output.path} exists; --resume continues it, or remove it first")


def _fresh(output, source: TextColumn, run: str, chunk_rows: int) -> StreamProgress:
    _refuse_existing(output)
    total = check_texts(source, chunk_rows)  # every text checked before the output is made
    return StreamProgress(**_fingerprint(source, run, chunk_rows), total_rows=total)


def _resumed(output, source: TextColumn, run: str, chunk_rows: int) -> StreamProgress:
    if not output.progress_path.is_file():
        state = "is complete" if output.exists() else "does not exist"
        raise LoraclsError(f"predict --resume: {output.path} {state} (no progress record); nothing to resume")
    progress = runs.read_record(output.progress_path, StreamProgress)
    expected = _fingerprint(source, run, chunk_rows)
    for key, value in expected.items():
        if getattr(progress, key) != value:
            raise LoraclsError(
                f"predict --resume: {key} differs from the interrupted call's ({getattr(progress, key)} there, "
                f"{value} now); resume with the same run, input file and --chunk-rows"
            )
    return progress
