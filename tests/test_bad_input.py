"""Bad input of every kind ends in one `loracls: ...` line and a non-zero exit, never a traceback, and leaves
nothing half-written: data tables, config files, texts to classify, and every file of a run directory."""

import json
import shutil

import pytest

from conftest import tiny_overrides
from loracls.cli import main


def one_line_error(args, capsys, code=2) -> str:
    assert main(args) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and err[-1].startswith("loracls: ") and not any("Traceback" in line for line in err), err
    assert [line for line in err if line.startswith("loracls: ")] == [err[-1]]
    return err[-1]


@pytest.mark.parametrize(
    "name, content",
    [
        ("header_only.csv", "text,label\n"),
        ("empty.csv", ""),
        ("empty.jsonl", ""),
        ("latin1.csv", "text,label\ncaf\xe9 good,pos\n".encode("latin-1")),
        ("not_a_table.json", "42"),
        ("broken.parquet", b"PAR1 this is no parquet"),
    ],
)
def test_unreadable_training_tables(name, content, tmp_path, gemma3_dir, capsys):
    data = tmp_path / name
    data.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "runs"
    message = one_line_error(["train", *tiny_overrides(gemma3_dir, data, out)], capsys)
    assert str(data) in message
    assert not out.exists()


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("texts.txt", "caf\xe9\n".encode("latin-1"), "not UTF-8 text"),
        ("texts.csv", "text\ncaf\xe9\n".encode("latin-1"), "not UTF-8 text"),
        ("texts.csv", b"text\n", "no rows"),
        ("texts.csv", b'text\nfine\n""\n', "empty text"),
        ("texts.txt", b"\n  \n", "holds no text"),
    ],
)
def test_unreadable_texts_to_predict(name, content, message, tmp_path, trained_runs, capsys):
    texts = tmp_path / name
    texts.write_bytes(content)
    out = tmp_path / "out.jsonl"
    line = one_line_error(["predict", str(trained_runs["gemma3"]), "--file", str(texts), "--out", str(out)], capsys)
    assert message in line
    assert not out.exists()


def _copy_run(trained_runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run)
    return run


RUN_FILE_DAMAGE = [
    ("labels.json", '["neg", "pos"]', "labels.json"),
    ("labels.json", '{"0": "neg"}', "ids must be"),
    ("labels.json", '{"0": "neg", "1": "neg"}', "distinct"),
    ("labels.json", '{"0": "neg", "1": 7}', "labels.json: 1"),
    ("labels.json", "not json", "not valid JSON"),
    ("config.yaml", "- a list\n", "must hold a mapping"),
    ("config.yaml", "r: [unclosed\n", "not valid YAML"),
    ("config.yaml", "learning_rat: 0.1\n", "unknown key 'learning_rat'"),
    ("config.yaml", b"run_name: caf\xe9\n", "not UTF-8 text"),
]


@pytest.mark.parametrize("command", ["evaluate", "predict"])
@pytest.mark.parametrize("name, content, message", RUN_FILE_DAMAGE)
def test_damaged_run_files_for_evaluate_and_predict(command, name, content, message, trained_runs, tmp_path, capsys):
    run = _copy_run(trained_runs, tmp_path)
    (run / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    args = [command, str(run)] + (["--text", "good film"] if command == "predict" else [])
    assert message in one_line_error(args, capsys)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("metrics.json", lambda m: {k: v for k, v in m.items() if k != "test"}, "metrics.json: test: Field required"),
        ("metrics.json", lambda m: {**m, "test": {**m["test"], "accuracy": "high"}}, "test.accuracy"),
        (
            "metrics.json",
            lambda m: {**m, "test": {**m["test"], "confusion_matrix": {"labels": ["a"], "matrix": []}}},
            "confusion matrix must be 1 x 1",
        ),
        ("metrics.json", lambda m: [m], "top level"),
        ("metrics.json", '{"test": NaN}', "NaN is not valid JSON"),
        ("env.json", lambda e: {**e, "torch_threads": "many"}, "env.json: torch_threads"),
        ("baseline.json", lambda b: {**b, "zero_shot": None}, "baseline.json: zero_shot"),
        ("train_log.jsonl", '{"step": 1, "loss": 0.5}\n{broken\n', "train_log.jsonl line 2"),
    ],
)
def test_damaged_run_files_for_report(name, content, message, trained_runs, tmp_path, capsys):
    run = _copy_run(trained_runs, tmp_path)
    path = run / name
    path.write_text(content if isinstance(content, str) else json.dumps(content(json.loads(path.read_text()))))
    assert message in one_line_error(["report", str(run)], capsys)
    assert not (run / "report.html").exists()


def test_report_tolerates_rows_it_cannot_use(trained_runs, tmp_path, capsys):
    """Valid JSON of the wrong shape in the predictions is skipped, not a crash."""
    run = _copy_run(trained_runs, tmp_path)
    with open(run / "predictions" / "test.jsonl", "a") as fh:
        fh.write('[1, 2]\n{"text": "x", "label": "pos", "prediction": "neg", "probabilities": {}}\n')
    assert main(["report", str(run)]) == 0


def test_an_unexpected_defect_is_still_one_line(monkeypatch, capsys):
    from loracls.diagnostics import doctor

    def broken(*args, **kwargs):
        raise RuntimeError("something we did not foresee\nsecond line")

    monkeypatch.setattr(doctor, "gather_facts", broken)
    line = one_line_error(["doctor"], capsys, code=1)
    assert "internal error (RuntimeError: something we did not foresee)" in line and "LORACLS_DEBUG" in line


def test_an_unwritable_output_dir_is_one_line(tmp_path, gemma3_dir, data_csv, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    line = one_line_error(["train", *tiny_overrides(gemma3_dir, data_csv, blocker / "runs")], capsys)
    assert "loracls: " in line


def test_input_template_longer_than_max_length(tmp_path, gemma3_dir, data_csv, capsys):
    template = " ".join(["film"] * 20) + " {text} was"
    out = tmp_path / "runs"
    line = one_line_error(
        ["train", *tiny_overrides(gemma3_dir, data_csv, out, max_length=16, input_template=template)], capsys
    )
    assert "leaves no room for text" in line and not out.exists()


def test_bad_run_names_write_nothing(tmp_path, gemma3_dir, data_csv, capsys):
    out = tmp_path / "runs"
    for name in ("../outside", str(tmp_path / "absolute")):
        line = one_line_error(["train", *tiny_overrides(gemma3_dir, data_csv, out, run_name=name)], capsys)
        assert "must be a plain folder name" in line
    assert not out.exists() and not (tmp_path / "outside").exists() and not (tmp_path / "absolute").exists()


def test_data_with_header_and_no_rows_in_given_splits(tmp_path, gemma3_dir, data_csv, capsys):
    empty = tmp_path / "empty.csv"
    empty.write_text("text,label\n")
    out = tmp_path / "runs"
    args = tiny_overrides(gemma3_dir, data_csv, out, validation_data=str(empty), test_data=str(data_csv))
    assert "has no rows" in one_line_error(["train", *args], capsys)
    assert not out.exists()
