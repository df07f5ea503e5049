"""Property tests (hypothesis, bounded) over the readers that take a user's bytes: the config reader and the
table readers. Any YAML text, any CSV / JSONL bytes give a result or one `LoraclsError`, never another
exception (the CLI would show it as an internal error) and never a message that grows with the input."""

import string
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loracls.config_reader import from_dict, read_mapping
from loracls.data.spec import DataSpec
from loracls.data.splits import load_dataset
from loracls.data.tables import read_table
from loracls.errors import LoraclsError

BUDGET = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MESSAGE_LIMIT = 1000  # characters: the CLI's cap (errors.MESSAGE_CHARACTERS)

yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=30))
yaml_values = st.recursive(
    yaml_scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
known_keys = st.sampled_from(["r", "labels", "data", "learning_rate", "class_weights", "max_length", "epochs"])
configs = st.dictionaries(known_keys | st.text(max_size=12), yaml_values, max_size=6)
yaml_noise = st.text(alphabet=string.printable + "&*<!|>{}[]:-#", max_size=300)


def _read_config(text: str):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        return from_dict(read_mapping(path, "config file"))


def _refusal_or_value(read, *args):
    try:
        return read(*args)
    except LoraclsError as exc:
        assert "\n" not in str(exc).strip() and len(str(exc)) < MESSAGE_LIMIT, str(exc)[:300]
        return None


@BUDGET
@given(configs)
def test_any_yaml_mapping_is_a_config_or_one_line(values):
    _refusal_or_value(_read_config, yaml.safe_dump(values, allow_unicode=True))


@BUDGET
@given(yaml_noise)
def test_any_text_as_a_config_file_is_a_config_or_one_line(text):
    _refusal_or_value(_read_config, text)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".tsv"])
@BUDGET
@given(data=st.binary(max_size=400))
def test_any_bytes_as_a_table_are_a_table_or_one_line(suffix, data):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"data{suffix}"
        path.write_bytes(data)
        _refusal_or_value(read_table, str(path))


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
@BUDGET
@given(rows=st.lists(st.dictionaries(st.sampled_from(["text", "label", "x"]), yaml_values, max_size=3), max_size=8))
def test_any_rows_as_a_table_are_data_or_one_line(suffix, rows):
    import json

    import pandas as pd

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"data{suffix}"
        if suffix == ".jsonl":
            path.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
        else:
            pd.DataFrame(rows).to_csv(path, index=False)
        _refusal_or_value(read_table, str(path))
        for problem in ("single_label", "multi_label"):  # then as data: columns, labels, splits
            sizes = {"train_size": 2, "validation_size": 1, "test_size": 1, "problem": problem}
            _refusal_or_value(lambda values: load_dataset(DataSpec.of(from_dict(values))), {"data": str(path), **sizes})
