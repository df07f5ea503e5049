"""Data stage: check labelled tables, map labels to ids, make seeded splits (balanced or stratified).

What is silently wrong in real data is found here and said in the data summary (`Dataset.notes`), or
refused when it cannot be right: labels that differ only in case, texts with conflicting labels, the same
texts in the given train and evaluation files.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pandas as pd

from loracls.data.spec import DataSpec
from loracls.data.tables import read_table
from loracls.errors import LoraclsError, hidden_character
from loracls.problems import Problem, problem_for

OVERLAP_LIMIT = 0.01  # given splits may share at most this share of an evaluation split's texts with train


@dataclass
class Split:
    texts: list[str]
    labels: list  # a label per text, as its problem type stores it (`Problem.label_ids`)
    comments: list[str] | None = None  # label_and_comment: each text's reference comment

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class Dataset:
    train: Split
    validation: Split
    test: Split
    id2label: dict[int, str]
    notes: list[str] = field(default_factory=list)  # what the checks found and did, for the data summary
    problem: str = "single_label"  # a registered problem type's name

    @property
    def kind(self) -> Problem:
        return problem_for(self.problem)

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in self.id2label.items()}

    def texts(self) -> set[str]:
        """Every text of the three splits."""
        return set(self.train.texts) | set(self.validation.texts) | set(self.test.texts)

    def class_counts(self) -> dict[str, dict[str, int]]:
        out = {}
        for split_name in ("train", "validation", "test"):
            labels = getattr(self, split_name).labels
            out[split_name] = {
                name: sum(self.kind.carries(label, i) for label in labels) for i, name in self.id2label.items()
            }
        return out


def _clean(frame: pd.DataFrame, spec: DataSpec, source: str, notes: list[str]) -> pd.DataFrame:
    """Columns present, no empty text or missing label, labels without surrounding spaces, no case-only twins."""
    if len(frame) == 0:
        raise LoraclsError(f"{source} has no rows")
    for column in (spec.text_column, spec.label_column):
        if column not in frame.columns:
            raise LoraclsError(f"{source}: column {column!r} not found (columns: {', '.join(map(str, frame.columns))})")
    texts = frame[spec.text_column]
    empty = texts.isna() | (texts.astype(str).str.strip() == "")
    if empty.any():
        row = int(empty.to_numpy().nonzero()[0][0])
        raise LoraclsError(
            f"{source}: {int(empty.sum())} empty text(s) in column {spec.text_column!r}, first at row {row}"
        )
    labels = frame[spec.label_column]
    missing = labels.map(lambda v: v is None or (isinstance(v, float) and math.isnan(v)))
    kind = problem_for(spec.problem)
    cells = kind.clean_cells(labels, missing, spec, source, notes)
    _refuse_case_twins({name for cell in cells for name in kind.names_in(cell)}, source)
    carried = {
        name: pd.Series(values, dtype=object).values for name, values in kind.carried(frame, spec, source).items()
    }
    return pd.DataFrame({"text": texts.astype(str).values, "label": pd.Series(cells, dtype=object).values, **carried})


def _names_in(frame: pd.DataFrame, kind: Problem) -> set[str]:
    """Every label name a cleaned table uses."""
    return {name for cell in frame["label"] for name in kind.names_in(cell)}


MAX_CLASS_SHARE = 0.5  # classes per row at most: each class must reach the training, validation and test splits


def _refuse_too_many_classes(names: list[str], rows: int, source: str) -> None:
    """A label column that is an id or free text (as many classes as rows) is refused before any work: every
    class needs examples in each split, and a 10,000-class confusion matrix is not a report."""
    if len(names) > max(2, int(MAX_CLASS_SHARE * rows)):
        raise LoraclsError(
            f"{source}: {len(names):,} distinct labels in {rows:,} rows (at most {MAX_CLASS_SHARE:g} a row): is "
            f"the label column an id or free text? set label_column to the column of classes"
        )


def check_label_characters(names, source: str) -> None:
    """Label names are printed in tables, cards and served JSON: a control character (a newline, NUL) or an
    invisible formatting one (a bidi override like U+202E, a zero-width space) would break or disguise them."""
    for name in names:
        if hidden := hidden_character(str(name)):
            raise LoraclsError(f"{source}: label {str(name)[:40]!r} holds {hidden}; labels must be printable text")


def _refuse_case_twins(names: set[str], source: str) -> None:
    by_fold: dict[str, list[str]] = {}
    for name in sorted(names):
        by_fold.setdefault(name.casefold(), []).append(name)
    twins = [group for group in by_fold.values() if len(group) > 1]
    if twins:
        shown = ", ".join(" / ".join(map(repr, group)) for group in twins[:3])
        raise LoraclsError(
            f"{source}: labels that differ only in case would become separate classes: {shown}; "
            f"spell each label one way"
        )


def _drop_conflicts(frame: pd.DataFrame, source: str, notes: list[str]) -> pd.DataFrame:
    """Texts that appear with more than one label have no right answer: every copy is dropped (and counted)."""
    labels_per_text = frame.groupby("text")["label"].nunique()
    conflicting = labels_per_text.index[labels_per_text > 1]
    if len(conflicting) == 0:
        return frame
    mask = frame["text"].isin(set(conflicting))
    notes.append(
        f"{source}: {len(conflicting)} text(s) appear with conflicting labels; dropped all "
        f"{int(mask.sum())} of their rows (e.g. {str(conflicting[0])[:60]!r})"
    )
    return frame[~mask]


def _check_overlap(dataset: Dataset, spec: DataSpec, notes: list[str]) -> None:
    """Given splits must not share texts (leakage): a small share is said, more is refused."""
    texts = {name: {t.strip() for t in getattr(dataset, name).texts} for name in ("train", "validation", "test")}
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        shared = texts[a] & texts[b]
        if not shared:
            continue
        share = len(shared) / max(len(texts[b]), 1)
        message = (
            f"data: {len(shared)} of the {len(texts[b])} {b} texts ({100 * share:.1f}%) are also in the "
            f"{a} split (e.g. {sorted(shared)[0][:60]!r})"
        )
        if share > OVERLAP_LIMIT and not spec.allow_overlap:
            raise LoraclsError(f"{message}: its metrics would be inflated; remove them, or set allow_overlap: true")
        notes.append(message)


def _label_names(spec: DataSpec, frame: pd.DataFrame, source: str) -> list[str]:
    found = sorted(_names_in(frame, problem_for(spec.problem)))
    if spec.labels is None:
        return found
    unknown = [name for name in found if name not in spec.labels]
    if unknown:
        raise LoraclsError(
            f"{source}: unknown label(s) {', '.join(map(repr, unknown))} (config labels: {', '.join(spec.labels)})"
        )
    return list(spec.labels)


def _to_split(frame: pd.DataFrame, label2id: dict[str, int], source: str, kind: Problem) -> Split:
    unknown = sorted(_names_in(frame, kind) - set(label2id))
    if unknown:
        raise LoraclsError(
            f"{source}: unknown label(s) {', '.join(map(repr, unknown))} not in training labels {', '.join(label2id)}"
        )
    comments = list(frame["comment"]) if "comment" in frame.columns else None
    return Split(list(frame["text"]), [kind.label_ids(cell, label2id) for cell in frame["label"]], comments)


def labelled_split(frame: pd.DataFrame, spec: DataSpec, label2id: dict[str, int], source: str) -> Split:
    """A user's labelled table checked like training data (columns, empty texts, known labels)."""
    return _to_split(_clean(frame, spec, source, []), label2id, source, problem_for(spec.problem))


def _made_splits(frame: pd.DataFrame, spec: DataSpec, names: list[str]) -> tuple[pd.DataFrame, ...]:
    """Seeded train / validation / test splits: balanced (equal counts per class) or stratified (each split
    keeps the data's class proportions)."""
    rng = random.Random(spec.seed)
    grouped: dict[object, list] = {}
    for index, cell in zip(frame.index, frame["label"]):  # one pass, not one scan per stratum
        grouped.setdefault(cell, []).append(index)
    strata = problem_for(spec.problem).strata(list(grouped), names)
    by_class = {key: grouped.get(key, []) for key in strata}
    for rows in by_class.values():
        rng.shuffle(rows)
    parts = _balanced(by_class, spec) if spec.balanced else _stratified(by_class, spec, len(frame))
    for rows in parts.values():
        rng.shuffle(rows)
    return frame.loc[parts["train"]], frame.loc[parts["validation"]], frame.loc[parts["test"]]


def _balanced(by_class: dict[str, list], spec: DataSpec) -> dict[str, list]:
    k = len(by_class)
    per_val, per_test = math.ceil(spec.validation_size / k), math.ceil(spec.test_size / k)
    smallest = min(len(rows) for rows in by_class.values())
    per_train = smallest - per_val - per_test if spec.train_size is None else math.ceil(spec.train_size / k)
    need = per_val + per_test + per_train
    if per_train <= 0 or need > smallest:
        poorest = min(by_class, key=lambda n: len(by_class[n]))
        raise LoraclsError(
            f"data: class {poorest!r} has {smallest} examples, a balanced split needs {need} per class "
            f"(lower train_size / validation_size / test_size or set balance: false)"
        )
    parts = {"validation": [], "test": [], "train": []}
    for rows in by_class.values():
        parts["validation"] += rows[:per_val]
        parts["test"] += rows[per_val : per_val + per_test]
        parts["train"] += rows[per_val + per_test : need]
    return parts


def _shares(total: int, sizes: dict[str, int]) -> dict[str, int]:
    """`total` split over classes in proportion to `sizes` (largest remainders get the leftover units)."""
    whole = sum(sizes.values())
    exact = {name: total * size / whole for name, size in sizes.items()}
    out = {name: math.floor(value) for name, value in exact.items()}
    for name in sorted(exact, key=lambda n: out[n] - exact[n])[: total - sum(out.values())]:
        out[name] += 1
    return out


def _stratified(by_class: dict[str, list], spec: DataSpec, available: int) -> dict[str, list]:
    v, t = spec.validation_size, spec.test_size
    train = available - v - t if spec.train_size is None else spec.train_size
    if train <= 0 or v + t + train > available:
        raise LoraclsError(f"data: {available} examples, fewer than the splits ask for ({spec.train_size} + {v} + {t})")
    # each split's share of a class is taken from what the splits before it left: with rare classes (or rare
    # label sets) shares of the whole could add up to more rows than the class has
    remaining = {name: len(rows) for name, rows in by_class.items()}
    counts = {}
    for split, n in (("validation", v), ("test", t), ("train", train)):
        counts[split] = _shares(n, remaining)
        remaining = {name: remaining[name] - counts[split][name] for name in remaining}
    parts = {"validation": [], "test": [], "train": []}
    for name, rows in by_class.items():
        start = 0
        for split in ("validation", "test", "train"):
            parts[split] += rows[start : start + counts[split][name]]
            start += counts[split][name]
    return parts


def _read_checked(path: str, spec: DataSpec, notes: list[str]) -> pd.DataFrame:
    return _drop_conflicts(_clean(read_table(path), spec.columns_of(path), path, notes), path, notes)


def load_dataset(spec: DataSpec) -> Dataset:
    """Read the spec's data and return the three splits with label ids. Raises LoraclsError on bad input."""
    notes: list[str] = []
    kind = problem_for(spec.problem)
    train_frame = _read_checked(spec.data, spec, notes)
    names = _label_names(spec, train_frame, spec.data)
    check_label_characters(names, spec.data)
    _refuse_too_many_classes(names, len(train_frame), spec.data)
    _refuse_case_twins(set(names), "config labels")
    given = spec.given_splits
    if given and (spec.validation_data is None or spec.test_data is None):
        raise LoraclsError("config: give both validation_data and test_data, or neither (splits are then made)")
    if given:
        validation_frame = _read_checked(spec.validation_data, spec, notes)
        test_frame = _read_checked(spec.test_data, spec, notes)
    else:
        before = len(train_frame)
        train_frame = train_frame.drop_duplicates("text").reset_index(drop=True)
        if len(train_frame) < before:
            notes.append(f"data: dropped {before - len(train_frame)} duplicate texts before splitting")
        train_frame, validation_frame, test_frame = _made_splits(train_frame, spec, names)
    present = sorted(_names_in(train_frame, kind))
    if len(present) < 2:
        raise LoraclsError(
            f"{spec.data}: the training split has only one class ({', '.join(present) or 'none'}); need at least two"
        )
    label2id = {name: i for i, name in enumerate(names)}
    dataset = Dataset(
        train=_to_split(train_frame, label2id, spec.data, kind),
        validation=_to_split(validation_frame, label2id, spec.validation_data or spec.data, kind),
        test=_to_split(test_frame, label2id, spec.test_data or spec.data, kind),
        id2label={i: name for name, i in label2id.items()},
        notes=notes,
        problem=spec.problem,
    )
    if len(dataset.validation) == 0 or len(dataset.test) == 0:
        raise LoraclsError("data: the validation and test splits must not be empty")
    if given:
        _check_overlap(dataset, spec, notes)
    return dataset


def format_counts(dataset: Dataset) -> str:
    lines = []
    for split_name, counts in dataset.class_counts().items():
        total = len(getattr(dataset, split_name))  # texts (a text with a label set counts once per label)
        lines.append(f"  {split_name:<10} {total:>6}  " + "  ".join(f"{n}={c}" for n, c in counts.items()))
    lines += [f"  note: {note}" for note in dataset.notes]
    return "\n".join(lines)


def class_weight_vector(weights: str | dict[str, float], dataset: Dataset) -> list[float] | None:
    """Loss weights per label id from `class_weights`: none, balanced (n / (classes x n_class), as sklearn's
    compute_class_weight; multi_label: each label's negatives / positives, BCE's pos_weight), or
    {label: weight} (labels not named keep 1; multi_label: the weight of a label's positives)."""
    if weights == "none":
        return None
    names = dataset.id2label
    if weights == "balanced":
        return dataset.kind.balanced_weights(dataset.train.labels, len(names))
    unknown = sorted(set(weights) - set(names.values()))
    if unknown:
        raise LoraclsError(
            f"config: class_weights names unknown label(s) {', '.join(map(repr, unknown))} "
            f"(labels: {', '.join(names.values())})"
        )
    return [float(weights.get(names[i], 1.0)) for i in sorted(names)]


def left_out_texts(spec: DataSpec, dataset: Dataset) -> list[str]:
    """The data file's texts that are in none of the splits, in file order (made splits only: a train_size
    below what the file holds leaves the rest out; given splits leave none). Their labels are not read: these
    are the unlabeled texts `distill` scores with the teacher by default."""
    if spec.validation_data is not None:
        return []
    used = dataset.texts()
    frame = _read_checked(spec.data, spec, [])
    return [text for text in dict.fromkeys(frame["text"]) if text not in used]
