"""`predict --file IN --out OUT`: chunk by chunk into JSONL or Parquet parts, in input order, resumable after a
crash or kill -9 with no row lost or written twice; bad input refused before anything is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from loracls.cli import main
from loracls.inference.loaded import predictor
from loracls.inference.streaming import FileJob, predict_file
from test_bad_input import one_line_error


def _texts(n: int) -> list[str]:
    words = ["good", "bad", "film", "plot", "dull", "great", "acting", "slow", "fun", "weak"]
    return [" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(2 + i % 9)) + f" {i}" for i in range(n)]


def _write(path, texts, column="text"):
    suffix = path.suffix
    frame = pd.DataFrame({column: texts, "id": range(len(texts))})
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    elif suffix == ".parquet":
        frame.to_parquet(path, row_group_size=11)
    else:
        path.write_text("".join(t + "\n\n" for t in texts))  # blank lines are skipped
    return path


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _predicted(run, texts, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["predict", str(run), *[a for t in texts for a in ("--text", t)]]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet", ".txt"])
def test_chunks_of_any_input_give_the_rows_of_one_call_in_order(suffix, trained_runs, tmp_path, capsys):
    run, texts = trained_runs["gemma3"], _texts(30)
    source = _write(tmp_path / f"in{suffix}", texts)
    out = tmp_path / "made" / "here" / "out.jsonl"  # missing folders are made, as the non-streaming --out does
    assert main(["predict", str(run), "--file", str(source), "--out", str(out), "--chunk-rows", "7"]) == 0
    rows, whole = _jsonl(out), _predicted(run, texts, capsys)
    assert [row["text"] for row in rows] == texts
    assert [row["prediction"] for row in rows] == [row["prediction"] for row in whole]
    for row, again in zip(rows, whole):
        assert row["probabilities"] == pytest.approx(again["probabilities"], abs=1e-5)
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.jsonl"]  # no record, no lock


def test_parquet_output_is_a_directory_of_parts_read_as_one_table(trained_runs, tmp_path, capsys):
    run, texts = trained_runs["gemma3"], _texts(25)
    source = _write(tmp_path / "in.csv", texts)
    out = tmp_path / "out.parquet"
    assert main(["predict", str(run), "--file", str(source), "--out", str(out), "--chunk-rows", "10"]) == 0
    assert sorted(p.name for p in out.iterdir()) == [f"part-00000{i}.parquet" for i in range(3)]
    table = pd.read_parquet(out)
    whole = _predicted(run, texts, capsys)
    assert list(table["text"]) == texts and list(table["prediction"]) == [r["prediction"] for r in whole]


class Crash(Exception):
    pass


def _crashing_after(score, chunks: int):
    calls = []

    def crashing(texts):
        if len(calls) == chunks:
            raise Crash
        calls.append(len(texts))
        return score(texts)

    return crashing


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_crashed_call_resumes_with_no_row_lost_or_written_twice(suffix, trained_runs, tmp_path):
    run, texts = str(trained_runs["gemma3"]), _texts(40)
    source, score = _write(tmp_path / "in.csv", texts), predictor(str(trained_runs["gemma3"]), log=lambda *a: None)
    straight, crashed = tmp_path / f"straight{suffix}", tmp_path / f"crashed{suffix}"
    assert predict_file(lambda: score, FileJob(run, str(source), str(straight)), 6, False, lambda *a: None) == 40
    with pytest.raises(Crash):
        crashing = _crashing_after(score, 3)
        predict_file(lambda: crashing, FileJob(run, str(source), str(crashed)), 6, False, lambda *a: None)
    if suffix == ".jsonl":  # a killed writer's half line past the last completed chunk
        with open(crashed, "a") as out:
            out.write('{"text": "half')
        record = crashed.with_name(crashed.name + ".progress.json")
    else:  # a part written after the last progress record
        (crashed / "part-000003.parquet").write_bytes((straight / "part-000003.parquet").read_bytes())
        record = crashed / "_progress.json"
    assert json.loads(record.read_text())["rows_done"] == 18
    assert predict_file(lambda: score, FileJob(run, str(source), str(crashed)), 6, True, lambda *a: None) == 22
    read = _jsonl if suffix == ".jsonl" else lambda path: pd.read_parquet(path).to_dict("records")
    assert [r["text"] for r in read(crashed)] == texts and not record.exists()
    assert [r["prediction"] for r in read(crashed)] == [r["prediction"] for r in read(straight)]


@pytest.mark.slow
def test_kill_9_mid_file_then_resume_gives_every_row_once(trained_runs, tmp_path):
    run, texts = str(trained_runs["gemma3"]), _texts(6000)
    source, out = _write(tmp_path / "in.csv", texts), tmp_path / "out.jsonl"
    args = [sys.executable, "-m", "loracls", "predict", run, "--file", str(source), "--out", str(out)]
    record = out.with_name(out.name + ".progress.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([*args, "--chunk-rows", "20"], env=env, stderr=subprocess.DEVNULL)
    while not (record.exists() and json.loads(record.read_text() or "{}").get("rows_done", 0) >= 60):
        assert process.poll() is None, "the call ended before it could be killed"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done = json.loads(record.read_text())["rows_done"]
    assert 60 <= done < 6000
    resumed = subprocess.run([*args, "--chunk-rows", "20", "--resume"], env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert [row["text"] for row in _jsonl(out)] == texts and not record.exists()


def test_bad_streaming_input_is_one_line_and_writes_nothing(trained_runs, tmp_path, capsys, monkeypatch):
    run = str(trained_runs["gemma3"])
    texts = _texts(30)
    texts[23] = "   "
    bad = _write(tmp_path / "bad.csv", texts)
    out = tmp_path / "out.jsonl"
    with monkeypatch.context() as patched:  # a bad file is refused before the model is loaded
        patched.setattr("loracls.inference.loaded.predictor", lambda *a: pytest.fail("the model was loaded"))
        for extra in (["--out", str(out)], []):
            assert "1 empty text(s) in column 'text', first at row 23" in one_line_error(
                ["predict", run, "--file", str(bad), *extra, "--chunk-rows", "5"], capsys
            )
        assert "no column 'text' (columns: words, id)" in one_line_error(
            ["predict", run, "--file", str(_write(tmp_path / "words.csv", texts[:3], column="words"))], capsys
        )
        (tmp_path / "words.csv").unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]  # not even a lock
    good = _write(tmp_path / "good.csv", _texts(12))
    cases = [
        (["--out", str(tmp_path / "out.csv")], "--out must end in .jsonl or .parquet"),
        (["--out", str(out), "--resume"], "does not exist (no progress record)"),
        (["--resume"], "--resume continues an interrupted --file IN --out OUT call"),
    ]
    for extra, message in cases:
        assert message in one_line_error(["predict", run, "--file", str(good), *extra], capsys)
    assert main(["predict", run, "--file", str(good), "--out", str(out), "--chunk-rows", "5"]) == 0
    before = out.read_bytes()
    assert "exists; --resume continues it" in one_line_error(
        ["predict", run, "--file", str(good), "--out", str(out)], capsys
    )
    assert "is complete" in one_line_error(["predict", run, "--file", str(good), "--out", str(out), "--resume"], capsys)
    assert out.read_bytes() == before


def test_a_resume_with_another_chunk_size_or_input_is_refused(trained_runs, tmp_path, capsys):
    run, texts = str(trained_runs["gemma3"]), _texts(20)
    source, out = _write(tmp_path / "in.csv", texts), tmp_path / "out.jsonl"
    score = predictor(run, log=lambda *a: None)
    with pytest.raises(Crash):
        predict_file(lambda: _crashing_after(score, 1), FileJob(run, str(source), str(out)), 5, False, lambda *a: None)
    line = one_line_error(
        ["predict", run, "--file", str(source), "--out", str(out), "--chunk-rows", "4", "--resume"], capsys
    )
    assert "chunk_rows differs" in line
    _write(source, texts + ["one more"])
    line = one_line_error(
        ["predict", run, "--file", str(source), "--out", str(out), "--chunk-rows", "5", "--resume"], capsys
    )
    assert "input_bytes differs" in line
    assert len(_jsonl(out)) == 5  # untouched by the refusals
