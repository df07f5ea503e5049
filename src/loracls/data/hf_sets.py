"""`data:` as a Hugging Face `datasets` set: a folder written by `save_to_disk` (a DatasetDict or one Dataset),
or `hf:NAME[:CONFIG]` read from the local `datasets` cache only (offline: nothing is downloaded). Optional: the
`datasets` extra (`pip install 'loracls[datasets]'`).

A set with train, validation and test splits (validation also as `valid`, `dev` or `val`) gives the three
splits as they are (as `validation_data` / `test_data` would); a set with a train split alone (or one Dataset)
is split by loracls. A split is named `SPEC::SPLIT` wherever loracls shows where a text came from. Class-label
columns are read as their names (a Sequence of class labels as a list of names: multi_label)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from loracls.errors import LoraclsError, first_line

__all__ = ["SPLIT_SEP", "is_hf_set", "split_specs", "read_split"]

SPLIT_SEP = "::"
SPLIT_NAMES = {"train": ("train",), "validation": ("validation", "valid", "dev", "val"), "test": ("test",)}
CACHE_ONLY = "hf:"


def is_hf_set(spec: str) -> bool:
    """A `datasets` folder or an `hf:` name (with or without a `::split`)."""
    base = spec.split(SPLIT_SEP)[0]
    if base.startswith(CACHE_ONLY):
        return True
    folder = Path(base)
    return folder.is_dir() and any((folder / name).is_file() for name in ("dataset_dict.json", "state.json"))


def _load(base: str):
    try:
        import datasets
    except ImportError:
        raise LoraclsError(f"data: {base} is a `datasets` set; it needs: pip install 'loracls[datasets]'") from None
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    if not base.startswith(CACHE_ONLY):
        try:
            return datasets.load_from_disk(base)
        except Exception as exc:
            raise LoraclsError(f"data: cannot read the `datasets` folder {base}: {first_line(exc, 200)}") from None
    name, _, config = base[len(CACHE_ONLY) :].partition(":")
    try:
        with _offline():
            return datasets.load_dataset(name, config or None)
    except Exception as exc:
        raise LoraclsError(
            f"data: {base} is not in the local datasets cache ({first_line(exc, 120)}); loracls reads hub sets "
            f"offline: run datasets.load_dataset({name!r}) once where the hub is reachable, or give a folder "
            f"written with save_to_disk"
        ) from None


@contextmanager
def _offline():
    """The local cache only: a run never downloads. The libraries read HF_HUB_OFFLINE when imported (before
    this), so their switches are set for the call and put back after."""
    import datasets
    import huggingface_hub

    switches = [(datasets.config, "HF_HUB_OFFLINE"), (huggingface_hub.constants, "HF_HUB_OFFLINE")]
    switches += [(datasets.config, "HF_DATASETS_OFFLINE")] if hasattr(datasets.config, "HF_DATASETS_OFFLINE") else []
    before = [getattr(module, name) for module, name in switches]
    for module, name in switches:
        setattr(module, name, True)
    try:
        yield
    finally:
        for (module, name), value in zip(switches, before):
            setattr(module, name, value)


def _splits(loaded) -> dict:
    import datasets

    return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}


def split_specs(spec: str) -> tuple[str, str | None, str | None]:
    """`SPEC::train` and, where the set has them, its validation and test splits' names; a spec that names its
    split (`FOLDER::name`) is that split alone, checked to exist (splits are then made from it)."""
    base, _, chosen = spec.partition(SPLIT_SEP)
    names = list(_splits(_load(base)))
    if chosen:
        if chosen not in names:
            raise LoraclsError(f"data: {base} has no split {chosen!r} (its splits: {', '.join(names)})")
        return spec, None, None
    found = {role: next((n for n in names if n.lower() in aliases), None) for role, aliases in SPLIT_NAMES.items()}
    if found["train"] is None:
        if len(names) != 1:
            raise LoraclsError(f"data: {spec} has no train split (its splits: {', '.join(names)})")
        found["train"] = names[0]
    return tuple(None if found[role] is None else f"{spec}{SPLIT_SEP}{found[role]}" for role in SPLIT_NAMES)


def read_split(spec: str) -> pd.DataFrame:
    """One split as a table, class labels as their names."""
    base, _, split = spec.partition(SPLIT_SEP)
    splits = _splits(_load(base))
    split = split or next(iter(splits))
    if split not in splits:
        raise LoraclsError(f"data: {base} has no split {split!r} (its splits: {', '.join(splits)})")
    part = splits[split]
    frame = part.to_pandas()
    for column, feature in part.features.items():
        names = _class_names(feature)
        if names is not None and column in frame:
            frame[column] = [_named(value, names, f"{spec}: column {column!r}") for value in frame[column]]
    return frame


def _class_names(feature) -> list[str] | None:
    import datasets

    if isinstance(feature, datasets.ClassLabel):
        return feature.names
    inner = getattr(feature, "feature", None)  # Sequence(ClassLabel) / List(ClassLabel): label sets
    return inner.names if isinstance(inner, datasets.ClassLabel) else None


def _named(value, names: list[str], where: str):
    """Class ids as their names. A single label of -1 is `datasets`' mark of a missing label (None: the row is
    dropped as unlabelled); inside a label set, or beyond the names, an id is refused: Python's negative
    indexing once read [-1] as the last class, silently."""
    if isinstance(value, list | tuple) or hasattr(value, "tolist"):
        return [_name_of(v, names, where) for v in list(value)]
    if value is None or int(value) == -1:
        return None
    return _name_of(value, names, where)


def _name_of(value, names: list[str], where: str) -> str:
    index = int(value)
    if not 0 <= index < len(names):
        raise LoraclsError(
            f"data: {where} holds class id {index}, not one of its ClassLabel's 0..{len(names) - 1} "
            f"({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}); -1 marks a missing label in `datasets`: "
            f"drop or fill those rows"
        )
    return names[index]
