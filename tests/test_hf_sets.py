"""`data:` as a Hugging Face `datasets` set: a save_to_disk folder (a DatasetDict with its own splits, or one
Dataset that loracls splits), class labels as names, label sets, and the offline `hf:` refusal."""

import sys

import pytest

from conftest import synthetic_frame
from loracls.cli import main
from loracls.config_reader import from_dict
from loracls.data.spec import DataSpec
from loracls.data.splits import load_dataset
from loracls.errors import LoraclsError

datasets = pytest.importorskip(
    "datasets", reason="the datasets extra is not installed (pip install 'loracls[datasets]')"
)


def _part(frame, features):
    return datasets.Dataset.from_pandas(frame.reset_index(drop=True), features=features)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    frame = synthetic_frame(300)
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    dev = {"train": _part(frame[:200], features), "dev": _part(frame[200:250], features)}
    datasets.DatasetDict({**dev, "test": _part(frame[250:], features)}).save_to_disk(root / "dict")
    _part(frame, features).save_to_disk(root / "one")
    sets_features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.Sequence(datasets.ClassLabel(names=["a", "b", "c"]))}
    )
    rows = [
        {"text": f"text {i} " + "word " * (i % 4), "label": [k for k in range(3) if (i >> k) & 1]} for i in range(200)
    ]
    datasets.Dataset.from_list(rows, features=sets_features).save_to_disk(root / "multi")
    return root, frame


def test_a_dataset_dict_gives_its_own_splits_with_label_names(sets):
    root, frame = sets
    data = load_dataset(DataSpec.of(from_dict({"data": str(root / "dict")})))
    assert (len(data.train), len(data.validation), len(data.test)) == (200, 50, 50)  # `dev` is the validation split
    assert data.id2label == {0: "neg", 1: "pos"}
    assert data.train.texts[0] == frame.text[0] and data.id2label[data.train.labels[0]] == frame.label[0]


def test_one_dataset_is_split_by_loracls_and_label_sets_are_names(sets):
    root, _ = sets
    data = load_dataset(
        DataSpec.of(from_dict({"data": str(root / "one"), "train_size": 100, "validation_size": 50, "test_size": 50}))
    )
    assert (len(data.train), len(data.validation), len(data.test)) == (100, 50, 50)
    multi = {"data": str(root / "multi"), "problem": "multi_label", "validation_size": 40, "test_size": 40}
    multi = from_dict({**multi, "train_size": 120})
    data = load_dataset(DataSpec.of(multi))
    assert data.id2label == {0: "a", 1: "b", 2: "c"} and len(data.train) == 120


def test_a_train_run_reads_a_datasets_folder(sets, gemma3_dir, tmp_path):
    from conftest import tiny_overrides

    root, _ = sets
    extra = dict(baseline=False, merge=False, epochs=1, train_size=None)
    args = tiny_overrides(gemma3_dir, root / "dict", tmp_path, **extra)
    assert main(["train", *args]) == 0
    assert (tmp_path / "run" / "metrics.json").is_file()


def test_an_hf_name_missing_from_the_local_cache_is_one_line(tmp_path, capsys):
    with pytest.raises(LoraclsError, match="not in the local datasets cache"):
        load_dataset(DataSpec.of(from_dict({"data": "hf:someone/never_downloaded"})))


def test_without_the_extra_a_datasets_folder_is_one_line(sets, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(LoraclsError, match=r"pip install 'loracls\[datasets\]'"):
        load_dataset(DataSpec.of(from_dict({"data": str(sets[0] / "dict")})))


@pytest.mark.parametrize("ids", [[-1], [0, -1]])
def test_a_label_set_with_a_sentinel_or_unknown_id_is_refused(tmp_path, ids):
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.Sequence(datasets.ClassLabel(names=["a", "b", "c"]))}
    )
    rows = [{"text": f"text {i}", "label": [i % 3]} for i in range(30)] + [{"text": "odd one", "label": [0]}]
    folder = tmp_path / "sentinel"
    dataset = datasets.Dataset.from_list(rows, features=features)
    dataset = dataset.map(lambda row: {"label": ids if row["text"] == "odd one" else row["label"]}, features=features)
    dataset.save_to_disk(folder)
    config = from_dict({"data": str(folder), "problem": "multi_label", "validation_size": 5, "test_size": 5})
    with pytest.raises(LoraclsError, match=rf"holds class id {ids[-1]}, not one of its ClassLabel's 0..2"):
        load_dataset(DataSpec.of(config))


def test_a_named_split_that_does_not_exist_is_named(sets):
    root, _ = sets
    config = from_dict({"data": f"{root / 'dict'}::nosplit", "validation_size": 5, "test_size": 5})
    with pytest.raises(LoraclsError, match=r"has no split 'nosplit' \(its splits: train, dev, test\)"):
        load_dataset(DataSpec.of(config))
