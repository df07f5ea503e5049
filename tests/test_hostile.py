"""The hostile cases kept in tests/hostile/: every refusal the suite knows ends in one `loracls: ...` line,
exit code 2, no traceback, and nothing written (the output folder is not made)."""

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import tiny_overrides
from loracls.cli import main

HOSTILE = Path(__file__).parent / "hostile"
TRAIN_REFUSALS = yaml.safe_load((HOSTILE / "train_refusals.yaml").read_text())
CONFIG_FILES = yaml.safe_load((HOSTILE / "config_files.yaml").read_text())


def _as_set(key, value) -> list[str]:
    return ["--set", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]


@pytest.mark.parametrize("case", TRAIN_REFUSALS, ids=lambda case: case["message"][:40])
def test_train_refusals_write_nothing(case, tmp_path, gemma3_dir, data_csv, capsys):
    data = data_csv
    if "data" in case:
        data = tmp_path / case["data"]["name"]
        data.write_text(case["data"]["content"])
    out = tmp_path / "runs"
    args = ["train", *tiny_overrides(gemma3_dir, data, out, epochs=1)]
    for key, value in case["set"].items():
        args += _as_set(key, value)
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in err), err
    refusals = [line for line in err if line.startswith("loracls: ")]
    assert refusals == [err[-1]], err
    assert re.search(case["message"], err[-1]), err[-1]
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))


@pytest.mark.parametrize("case", CONFIG_FILES, ids=lambda case: case["name"])
def test_hostile_config_files_are_one_short_line(case, tmp_path, capsys):
    """The alias bomb, duplicate keys, merge keys, a huge value, an oversized file: refused before anything is
    built, in one line of under 300 characters that does not grow with the input."""
    config = tmp_path / case["name"]
    content = case.get("content", "")
    if "content_repeat" in case:  # a file too deep to write out here: prefix + open * times + close * times
        r = case["content_repeat"]
        content = r["prefix"] + r["open"] * r["times"] + r["close"] * r["times"] + "\n"
    if "pad_to_bytes" in case:
        content += "#" * (case["pad_to_bytes"] - len(content.encode()) - 1) + "\n"
    config.write_text(content)
    out = tmp_path / "runs"
    assert main(["train", str(config), "--set", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("loracls: ") and len(err[0]) < 300, err
    assert re.search(case["message"], err[0]), err[0]
    assert not out.exists()


HEAVY = ("torch", "transformers", "peft", "sklearn")


@pytest.mark.parametrize(
    "args",
    [
        ["train", "CONFIG"],
        ["baseline", "CONFIG"],
        ["sweep", "CONFIG", "--grid", "r=4,8"],
        ["tune", "CONFIG"],
        ["train", "--set", "epochs=0"],
        ["train", "--resume", "RUN"],
        ["evaluate", "RUN", "--data", "x.csv"],
        ["distill", "RUN"],
    ],
    ids=lambda args: " ".join(args[:2]),
)
def test_a_bad_config_is_refused_before_torch_loads(args, tmp_path):
    """In a fresh process (this one has torch already): the refusal comes with no heavy library imported."""
    import subprocess
    import sys

    config = tmp_path / "c.yaml"
    config.write_text("r: 4\nr: 8\n")  # a key given twice
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("epochs: many\n")  # a run whose own config is damaged
    argv = [str(config) if a == "CONFIG" else str(run) if a == "RUN" else a for a in args]
    probe = (
        "import sys; from loracls.cli import main; code = main(sys.argv[1:]); "
        f"print([m for m in {HEAVY!r} if m in sys.modules]); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    assert done.stderr.startswith("loracls: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
