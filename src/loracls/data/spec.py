"""The data stage's own record: what it reads of the config, built once where a job prepares (`DataSpec.of`).

The splits, the label checks and the problem types' cell readers take this record, not the whole Config, so
what the data stage depends on is listed here and nowhere else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from loracls.config import EMBEDDED_DATA, Config
from loracls.data.hf_sets import is_hf_set, split_specs
from loracls.problems import problem_for

__all__ = ["DataSpec"]


@dataclass(frozen=True)
class DataSpec:
    data: str  # the labelled table (or the train split of a `datasets` set)
    validation_data: str | None  # given evaluation splits (both or neither); None: splits are made from `data`
    test_data: str | None
    problem: str  # a registered problem type's name
    text_column: str
    label_column: str
    comment_column: str | None  # label_and_comment: the reference comments
    label_separator: str | None  # multi_label: the separator of a label set written as one string
    labels: tuple[str, ...] | None  # the label names in id order; None: the sorted names found in `data`
    seed: int  # the made splits' shuffle
    balanced: bool  # made splits: the same count a class (else stratified by the data's shares)
    train_size: int | None  # made splits' sizes; train None: what is left
    validation_size: int
    test_size: int
    allow_overlap: bool  # given splits may share more than 1% of an evaluation split's texts with train

    @classmethod
    def of(cls, config: Config) -> DataSpec:
        """The config's data settings, refused where the problem type cannot use them (`Problem.check_config`);
        a `datasets` set given as `data` brings its own validation and test splits where it has both."""
        problem_for(config.problem).check_config(config)
        derived = {
            "labels": None if config.labels is None else tuple(config.labels),
            "balanced": config.balanced_splits,
        }
        same_names = {f.name: getattr(config, f.name) for f in dataclasses.fields(cls) if f.name not in derived}
        spec = cls(**same_names, **derived)  # every other field is the config's field of the same name
        return spec._with_hf_splits()

    @property
    def given_splits(self) -> bool:
        return self.validation_data is not None or self.test_data is not None

    def columns_of(self, path: str) -> DataSpec:
        """The spec to read `path` with: the embedded table always has columns text/label."""
        return dataclasses.replace(self, text_column="text", label_column="label") if path == EMBEDDED_DATA else self

    def _with_hf_splits(self) -> DataSpec:
        if self.given_splits or not is_hf_set(self.data):
            return self
        train, validation, test = split_specs(self.data)
        given = {"validation_data": validation, "test_data": test} if validation and test else {}
        return dataclasses.replace(self, data=train, **given)
