"""Texts to classify, read in chunks of rows so that a file of any length is scored in constant memory: a
.txt file (one text a line, blank lines skipped) or a table's text column (CSV / TSV / JSONL / Parquet,
compressed CSV / JSONL too; a .json array is read whole). The text column is the run's `text_column`, else
`text`.

`check_texts` reads the column once, chunk by chunk, before anything is scored or written: a missing column or
an empty text is refused in one line, and the row count it returns gives the progress bar its ETA.
`text_chunks` then yields the same rows, in file order, `rows` at a time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pandas as pd

from loracls.data.tables import COMPRESSIONS, read_table
from loracls.errors import LoraclsError, first_line

__all__ = ["CHUNK_ROWS", "TextColumn", "check_texts", "text_chunks"]


CHUNK_ROWS = 10_000  # rows read (and, streaming, scored and written) at a time


class TextColumn:
    """One file's text column: where it is and how it is read."""

    def __init__(self, file: str, text_column: str):
        path = Path(file)
        if not path.is_file():
            raise LoraclsError(f"data file not found: {file}")
        suffixes = [s.lower() for s in path.suffixes if s.lower() not in COMPRESSIONS]
        self.file, self.path, self.kind = file, path, suffixes[-1] if suffixes else ""
        if self.kind not in _READERS:
            raise LoraclsError(
                f"unsupported file type {path.suffix!r} for {file} (use .txt, .csv, .tsv, .jsonl, .json or .parquet)"
            )
        self.column = None if self.kind == ".txt" else self._column(text_column)

    def _column(self, wanted: str) -> str:
        with _reading(self.file):
            columns = [str(c) for c in _COLUMNS.get(self.kind, _first_chunk_columns)(self.path, self.kind)]
        for name in (wanted, "text"):
            if name in columns:
                return name
        tried = repr(wanted) if wanted == "text" else f"{wanted!r} or 'text'"
        raise LoraclsError(f"{self.file}: no column {tried} (columns: {', '.join(columns)})")

    def raw_chunks(self, rows: int) -> Iterator[list]:
        """The column's cells (None for a missing one), `rows` at a time."""
        with _reading(self.file):
            yield from _READERS[self.kind](self.path, self.column, rows)


def check_texts(source: TextColumn, rows: int) -> int:
    """The number of texts; refuses an empty text (naming how many and the first row) or a file with none."""
    total, empty, first_empty = 0, 0, None
    for cells in source.raw_chunks(rows):
        for i, cell in enumerate(cells):
            if _is_empty(cell):
                empty += 1
                first_empty = total + i if first_empty is None else first_empty
        total += len(cells)
    if empty:
        where = f" in column {source.column!r}" if source.column else ""
        raise LoraclsError(f"{source.file}: {empty} empty text(s){where}, first at row {first_empty}")
    if total == 0:
        raise LoraclsError(f"{source.file} holds no text (no rows)")
    return total


def text_chunks(source: TextColumn, rows: int, skip: int = 0) -> Iterator[list[str]]:
    """The texts, in file order, `rows` at a time, after the first `skip` (whole chunks: a resume)."""
    seen = 0
    for cells in source.raw_chunks(rows):
        seen += len(cells)
        if seen <= skip:
            continue
        if any(_is_empty(cell) for cell in cells):
            raise LoraclsError(f"{source.file} changed while it was read: an empty text near row {seen}")
        yield [str(cell) for cell in cells]


def _is_empty(cell) -> bool:
    return cell is None or (isinstance(cell, float) and cell != cell) or not str(cell).strip()


@contextmanager
def _reading(file: str) -> Iterator[None]:
    """pandas and pyarrow raise many types while reading; the user gets one line."""
    try:
        yield
    except LoraclsError:
        raise
    except UnicodeDecodeError as exc:
        raise LoraclsError(
            f"cannot read {file}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); save it as UTF-8"
        ) from None
    except Exception as exc:
        raise LoraclsError(f"cannot read {file}: {first_line(exc)}") from None


# --- one reader a file type: the cells of one column, `rows` at a time -----------------------------------


def _txt(path: Path, column, rows: int) -> Iterator[list]:
    chunk = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            text = line.rstrip("\r\n")
            if text.strip():
                chunk.append(text)
            if len(chunk) == rows:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _csv(path: Path, column: str, rows: int, sep: str = ",") -> Iterator[list]:
    for frame in pd.read_csv(path, sep=sep, usecols=[column], dtype={column: str}, chunksize=rows, encoding="utf-8"):
        yield [None if pd.isna(v) else v for v in frame[column]]


def _jsonl(path: Path, column: str, rows: int) -> Iterator[list]:
    with pd.read_json(path, lines=True, chunksize=rows, encoding="utf-8", dtype=False) as reader:
        for frame in reader:
            if column not in frame.columns:
                yield [None] * len(frame)
                continue
            yield [None if _missing(v) else v for v in frame[column]]


def _parquet(path: Path, column: str, rows: int) -> Iterator[list]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=rows, columns=[column]):
        yield batch.column(0).to_pylist()


def _json(path: Path, column: str, rows: int) -> Iterator[list]:
    frame = read_table(str(path))  # a JSON array cannot be read in parts
    cells = [None if _missing(v) else v for v in frame[column]]
    for start in range(0, len(cells), rows):
        yield cells[start : start + rows]


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _first_chunk_columns(path: Path, kind: str) -> list:
    if kind in (".jsonl", ".ndjson"):
        with pd.read_json(path, lines=True, chunksize=1, encoding="utf-8") as reader:
            return list(next(iter(reader), pd.DataFrame()).columns)
    return list(read_table(str(path)).columns)


def _csv_columns(path: Path, kind: str) -> list:
    return list(pd.read_csv(path, sep="\t" if kind == ".tsv" else ",", nrows=0, encoding="utf-8").columns)


def _parquet_columns(path: Path, kind: str) -> list:
    import pyarrow.parquet as pq

    return list(pq.ParquetFile(path).schema_arrow.names)


_READERS = {
    ".txt": _txt,
    ".csv": _csv,
    ".tsv": partial(_csv, sep="\t"),
    ".jsonl": _jsonl,
    ".ndjson": _jsonl,
    ".json": _json,
    ".parquet": _parquet,
    ".pq": _parquet,
}
_COLUMNS = {".csv": _csv_columns, ".tsv": _csv_columns, ".parquet": _parquet_columns, ".pq": _parquet_columns}
