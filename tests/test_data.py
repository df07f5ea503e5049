import pandas as pd
import pytest
import torch

from conftest import synthetic_frame
from loracls.config_reader import load_config
from loracls.data.batching import collate, length_grouped_batches
from loracls.data.spec import DataSpec
from loracls.data.splits import load_dataset
from loracls.data.tables import read_table
from loracls.errors import LoraclsError


def config_for(path, **values):
    return load_config(
        None,
        [
            f"{k}={v}"
            for k, v in {"data": path, "train_size": 40, "validation_size": 10, "test_size": 10, **values}.items()
        ],
    )


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "parquet", "tsv"])
def test_reads_every_format(tmp_path, suffix):
    frame = synthetic_frame(80)
    path = tmp_path / f"d.{suffix}"
    {
        "csv": lambda: frame.to_csv(path, index=False),
        "tsv": lambda: frame.to_csv(path, sep="\t", index=False),
        "jsonl": lambda: frame.to_json(path, orient="records", lines=True),
        "parquet": lambda: frame.to_parquet(path),
    }[suffix]()
    assert read_table(str(path)).equals(frame)
    dataset = load_dataset(DataSpec.of(config_for(path)))
    assert dataset.id2label == {0: "neg", 1: "pos"}
    assert len(dataset.train) == 40 and len(dataset.validation) == 10 and len(dataset.test) == 10


def test_splits_are_seeded_balanced_and_disjoint(tmp_path):
    path = tmp_path / "d.csv"
    synthetic_frame(200).to_csv(path, index=False)
    a, b = load_dataset(DataSpec.of(config_for(path))), load_dataset(DataSpec.of(config_for(path)))
    c = load_dataset(DataSpec.of(config_for(path, seed=7)))
    assert a.train.texts == b.train.texts and a.test.texts == b.test.texts
    assert a.train.texts != c.train.texts
    counts = a.class_counts()
    assert counts["train"] == {"neg": 20, "pos": 20} and counts["test"] == {"neg": 5, "pos": 5}
    assert not set(a.train.texts) & set(a.test.texts)
    assert not set(a.validation.texts) & set(a.test.texts)


def test_label_order_from_config_and_given_splits(tmp_path):
    frame = synthetic_frame(120)
    for name, part in {"train": frame[:80], "val": frame[80:100], "test": frame[100:]}.items():
        part.rename(columns={"text": "review", "label": "sentiment"}).to_csv(tmp_path / f"{name}.csv", index=False)
    config = load_config(
        None,
        [
            f"data={tmp_path / 'train.csv'}",
            f"validation_data={tmp_path / 'val.csv'}",
            f"test_data={tmp_path / 'test.csv'}",
            "text_column=review",
            "label_column=sentiment",
            "labels=[pos, neg]",
        ],
    )
    dataset = load_dataset(DataSpec.of(config))
    assert dataset.id2label == {0: "pos", 1: "neg"}
    assert (len(dataset.train), len(dataset.validation), len(dataset.test)) == (80, 20, 20)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda f: f.drop(columns=["label"]), "column 'label' not found"),
        (lambda f: f.assign(text=["" if i == 3 else t for i, t in enumerate(f.text)]), "empty text.*row 3"),
        (lambda f: f.assign(label="pos"), "only one class"),
        (lambda f: f.assign(label=[None if i == 5 else y for i, y in enumerate(f.label)]), "missing label"),
    ],
)
def test_bad_data_is_refused_in_one_line(tmp_path, mutate, message):
    path = tmp_path / "d.csv"
    mutate(synthetic_frame(80)).to_csv(path, index=False)
    with pytest.raises(LoraclsError, match=message) as info:
        load_dataset(DataSpec.of(config_for(path, balance="false")))
    assert "\n" not in str(info.value)


def test_unknown_labels_are_refused(tmp_path):
    frame = synthetic_frame(80)
    path = tmp_path / "d.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(LoraclsError, match="unknown label.*'pos'"):
        load_dataset(DataSpec.of(config_for(path, labels="[neg, other]")))
    test = frame[:10].assign(label="surprise")
    test.to_csv(tmp_path / "t.csv", index=False)
    config = load_config(
        None, [f"data={path}", f"validation_data={path}", f"test_data={tmp_path / 't.csv'}", "allow_overlap=true"]
    )
    with pytest.raises(LoraclsError, match="unknown label.*'surprise'"):
        load_dataset(DataSpec.of(config))


def test_missing_file_and_too_small_data(tmp_path):
    with pytest.raises(LoraclsError, match="not found"):
        load_dataset(DataSpec.of(config_for(tmp_path / "nope.csv")))
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(LoraclsError, match="unsupported"):
        load_dataset(DataSpec.of(config_for(tmp_path / "d.txt")))
    path = tmp_path / "d.csv"
    synthetic_frame(30).to_csv(path, index=False)
    with pytest.raises(LoraclsError, match="balanced split needs"):
        load_dataset(DataSpec.of(config_for(path, balance="true")))
    with pytest.raises(LoraclsError, match=r"30 examples, fewer than the splits ask for \(40 \+ 10 \+ 10\)"):
        load_dataset(DataSpec.of(config_for(path)))


def test_user_data_is_split_stratified_and_the_embedded_data_balanced(tmp_path):
    frame = synthetic_frame(600)
    frame = pd.concat([frame[frame.label == "neg"][: 500 // 6], frame[frame.label == "pos"]], ignore_index=True)
    path = tmp_path / "imbalanced.csv"
    frame.to_csv(path, index=False)  # 83 neg : 300 pos
    dataset = load_dataset(DataSpec.of(config_for(path, train_size=200, validation_size=60, test_size=60)))
    counts = dataset.class_counts()
    assert counts == {
        "train": {"neg": 43, "pos": 157},
        "validation": {"neg": 13, "pos": 47},
        "test": {"neg": 13, "pos": 47},
    }
    every = dataset.train.texts + dataset.validation.texts + dataset.test.texts
    assert len(set(every)) == len(every) == 320
    rest = load_dataset(DataSpec.of(config_for(path, train_size="null", validation_size=60, test_size=60)))
    assert sum(rest.class_counts()["train"].values()) == len(frame.drop_duplicates("text")) - 120
    balanced = load_dataset(
        DataSpec.of(config_for(path, train_size=100, validation_size=20, test_size=20, balance="true"))
    )
    assert balanced.class_counts()["train"] == {"neg": 50, "pos": 50}
    assert load_config().balanced_splits and not config_for(path).balanced_splits


def test_length_grouped_batches_cover_everything_and_cut_padding():
    lengths = [((i * 37) % 50) + 1 for i in range(400)]
    batches = length_grouped_batches(lengths, 16, seed=1)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(400))
    assert batches == length_grouped_batches(lengths, 16, seed=1)
    assert batches != length_grouped_batches(lengths, 16, seed=2)
    assert max(lengths[i] for i in batches[0]) == max(lengths)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    naive = sum(len(lengths[s : s + 16]) * max(lengths[s : s + 16]) for s in range(0, 400, 16))
    assert padded < 0.8 * naive


def test_collate_pads_to_the_longest_in_the_batch():
    batch = collate([[5, 6, 7], [8]], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["input_ids"].dtype == torch.long


def test_input_template_wraps_and_truncates_only_the_text():
    from conftest import make_tokenizer
    from loracls.data.batching import encode

    tokenizer = make_tokenizer()
    plain = encode(tokenizer, ["good film"], 32)[0]
    wrapped = encode(tokenizer, ["good film"], 32, "the {text} was")[0]
    assert wrapped == tokenizer("the good film was")["input_ids"] and len(wrapped) == len(plain) + 2
    long_text = " ".join(["film"] * 100)
    ids = encode(tokenizer, [long_text], 16, "{text} was")[0]
    assert len(ids) <= 16 and ids[-1] == tokenizer.convert_tokens_to_ids("was")


def test_data_spec_is_the_data_stage_s_only_view_of_the_config(tmp_path):
    """The data stage takes a frozen DataSpec built once from the config; building it refuses settings the
    problem type cannot use, and the splits module never reads the Config."""
    import ast
    import dataclasses

    import loracls.data.splits as splits_module

    path = tmp_path / "d.csv"
    synthetic_frame(200).to_csv(path, index=False)
    spec = DataSpec.of(config_for(path, labels="[neg, pos]"))
    assert spec.labels == ("neg", "pos") and spec.data == str(path) and not spec.given_splits
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 1  # type: ignore[misc]
    with pytest.raises(LoraclsError, match="label_separator"):
        DataSpec.of(config_for(path, label_separator="'|'"))
    tree = ast.parse(open(splits_module.__file__).read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert "Config" not in imported


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".csv.gz"])
def test_a_header_of_a_million_columns_is_refused_before_it_is_parsed(tmp_path, suffix):
    import gzip

    from loracls.data.tables import read_table

    sep = "\t" if suffix == ".tsv" else ","
    text = sep.join(f"c{i}" for i in range(1_000_000)) + "\n" + sep.join("x" for _ in range(1_000_000)) + "\n"
    path = tmp_path / f"wide{suffix}"
    if suffix.endswith(".gz"):
        with gzip.open(path, "wt") as out:
            out.write(text)
    else:
        path.write_text(text)
    with pytest.raises(LoraclsError, match=r"its header has over [\d,]+ columns \(at most 10,000\)"):
        read_table(str(path))
