"""A full or read-only disk anywhere is one line naming the path and what was being written, exit 2, and a
train run stays resumable from its last good checkpoint."""

import errno
import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import tiny_overrides
from loracls import files
from loracls.cli import main
from loracls.errors import LoraclsError


@pytest.mark.parametrize(
    "raised, expected",
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "no space left on"),
        (
            RuntimeError(
                'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left '
                'on device" })'
            ),
            "no space left on",
        ),  # safetensors
        (
            RuntimeError(
                "[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                "data/0: file write failed"
            ),
            "no space left on",
        ),  # torch.save
        (OSError(errno.EROFS, "Read-only file system"), "read-only file system at"),
        (OSError(errno.EACCES, "Permission denied"), "cannot write the checkpoint"),
    ],
)
def test_writers_failures_become_one_line_naming_the_path(tmp_path, raised, expected):
    target = tmp_path / "run" / "checkpoint.pt"

    def fill(tmp):
        Path(tmp).write_bytes(b"partial")
        raise raised

    with pytest.raises(LoraclsError) as caught:
        files.write_file_atomically(target, fill, "the checkpoint")
    message = str(caught.value)
    assert message.startswith(expected) and str(target) in message and "\n" not in message
    assert ".checkpoint.pt." not in message  # never the hidden temp file
    assert [p.name for p in target.parent.iterdir()] == []  # the temp file is gone


def test_other_errors_are_not_taken_for_a_full_disk(tmp_path):
    with pytest.raises(ValueError, match="a defect"):
        files.write_file_atomically(tmp_path / "x.json", lambda tmp: (_ for _ in ()).throw(ValueError("a defect")))


def test_predict_out_errors_name_the_path_given(trained_runs, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    out = blocker / "rows.jsonl"  # its folder is a file: no user, root included, can write there
    assert main(["predict", str(trained_runs["gemma3"]), "--text", "good", "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("loracls: cannot write ") and str(out) in line and ".rows.jsonl." not in line


@pytest.fixture
def small_tmpfs(tmp_path):
    """A tmpfs of a chosen size, mounted for the test (root on Linux); skipped with the reason elsewhere."""
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    mounted = []

    def make(size_bytes: int) -> Path:
        command = ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount)]
        if mounted:
            command[4] = f"remount,size={size_bytes}"
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip() or result.returncode})")
        mounted.append(mount)
        return mount

    yield make
    if mounted:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _disk_usage(folder: Path, block: int = 4096) -> int:
    return sum(-(-p.stat().st_size // block) * block for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_a_full_disk_mid_run_is_one_line_and_the_run_resumes(trained_runs, gemma3_dir, data_csv, small_tmpfs, capsys):
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    finished = trained_runs["gemma3"]
    merged = _disk_usage(finished / "merged")
    disk = small_tmpfs(_disk_usage(finished) - merged + merged // 3)  # room for all but the merged model
    args = tiny_overrides(gemma3_dir, data_csv, disk)
    assert main(["train", *args]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"loracls: no space left on {disk} while writing the merged model"), line
    run = disk / "run"
    assert (run / "checkpoint.pt").is_file() and not (run / "metrics.json").exists()
    assert not [p.name for p in run.glob(".*") if p.name != ".loracls.lock"]
    small_tmpfs(64 * 2**20)  # space freed
    assert main(["train", "--resume", str(run)]) == 0
    again = json.loads((run / "metrics.json").read_text())
    first = json.loads((finished / "metrics.json").read_text())
    assert again["test"] == first["test"] and again["export"]["predictions_equal"]


def test_a_writer_librarys_own_words_on_a_full_disk_are_read_as_a_full_disk(tmp_path, monkeypatch):
    from loracls import files as module

    monkeypatch.setattr(module, "_nearly_full", lambda path: True)

    def fill(tmp):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . some words of its own")

    with pytest.raises(LoraclsError, match="no space left on .* while writing the checkpoint"):
        files.write_file_atomically(tmp_path / "checkpoint.pt", fill, "the checkpoint")
    monkeypatch.setattr(module, "_nearly_full", lambda path: False)
    with pytest.raises(RuntimeError, match="some words of its own"):  # a defect elsewhere stays a defect
        files.write_file_atomically(tmp_path / "checkpoint.pt", fill, "the checkpoint")


def test_a_disk_full_in_the_first_chunk_of_a_streamed_predict_is_resumable(trained_runs, tmp_path, small_tmpfs, capsys):
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    big = tmp_path / "big.csv"
    big.write_text("text\n" + "".join(f"good film number {i} of the week\n" for i in range(3000)))
    disk = small_tmpfs(16 * 1024)
    out = disk / "p.jsonl"
    run = str(trained_runs["gemma3"])
    assert main(["predict", run, "--file", str(big), "--out", str(out), "--chunk-rows", "1000"]) == 2
    assert "no space left" in capsys.readouterr().err
    assert not out.exists() or out.with_name("p.jsonl.progress.json").is_file()  # never a cut file alone
    small_tmpfs(16 * 2**20)
    if out.exists():
        assert main(["predict", run, "--file", str(big), "--out", str(out), "--resume", "--chunk-rows", "1000"]) == 0
    else:
        assert main(["predict", run, "--file", str(big), "--out", str(out), "--chunk-rows", "1000"]) == 0
    rows = out.read_text().splitlines()
    assert len(rows) == 3000 and json.loads(rows[-1])["text"] == "good film number 2999 of the week"
