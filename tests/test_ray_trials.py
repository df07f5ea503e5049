"""`tune --engine ray` and `sweep --engine ray`: trials as Ray Tune trials on a local Ray started and
stopped inside the test (no network), 1 CPU a trial; the same run directories and results tables as the
local engine, and a tune study that continues. Skipped only where Ray cannot import."""

from __future__ import annotations

import csv

import pytest
import yaml

from loracls.cli import main
from test_bad_input import one_line_error
from test_tune import _config_file

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'loracls[ray]'")
pytest.importorskip("ray.tune", reason="Ray Tune is not installed: pip install 'loracls[ray]'")


@pytest.mark.slow
def test_tune_on_ray_runs_optuna_trials_and_continues(tmp_path, gemma3_dir, data_csv, capsys):
    config = _config_file(tmp_path / "two.yaml", gemma3_dir, data_csv, tmp_path / "out")
    space = ["--space", "learning_rate=log:1e-3:1e-2", "r=2,4"]
    args = ["tune", str(config), *space, "--set", "run_name=study", "--engine", "ray", "--cpus-per-trial", "1"]
    assert main([*args, "--trials", "2"]) == 0
    assert not ray.is_initialized()  # the local Ray it started is stopped
    study = tmp_path / "out" / "study"
    rows = list(csv.DictReader((study / "results.csv").open()))
    assert sorted(int(row["trial"]) for row in rows) == [0, 1]
    for row in rows:  # each trial's score is its run's best validation, as in a local search
        assert float(row["mean_validation"]) == pytest.approx(float(row["validation_two"]))
        assert row["r"] in ("2", "4") and 1e-3 <= float(row["learning_rate"]) <= 1e-2
        trained = yaml.safe_load((study / f"trial{int(row['trial']):03d}-two" / "config.yaml").read_text())
        assert trained["r"] == int(row["r"]) and trained["learning_rate"] == pytest.approx(float(row["learning_rate"]))
        assert trained["threads"] == 1
    assert set(yaml.safe_load((study / "best.yaml").read_text())) == {"learning_rate", "r"}
    assert main([*args, "--trials", "3"]) == 0  # the same Optuna study, one trial more
    assert len(list(csv.DictReader((study / "results.csv").open()))) == 3
    assert "2 done before" in capsys.readouterr().err


@pytest.mark.slow
def test_sweep_on_ray_gives_the_grid_table(tmp_path, gemma3_dir, data_csv):
    config = _config_file(tmp_path / "c.yaml", gemma3_dir, data_csv, tmp_path / "out")
    args = ["sweep", str(config), "--grid", "r=2,4", "--set", "run_name=grid", "--engine", "ray"]
    assert main(args) == 0
    sweep = tmp_path / "out" / "grid"
    rows = list(csv.DictReader((sweep / "results.csv").open()))
    assert [row["run"] for row in rows] == ["r=2", "r=4"]  # grid order, whatever order Ray ran them in
    for row in rows:
        assert 0 <= float(row["test_accuracy"]) <= 1 and float(row["seconds"]) > 0
        assert yaml.safe_load((sweep / row["run"] / "config.yaml").read_text())["r"] == int(row["run"][2:])


def test_trial_engine_refusals(tmp_path, gemma3_dir, data_csv, capsys):
    config = str(_config_file(tmp_path / "c.yaml", gemma3_dir, data_csv, tmp_path / "out"))
    cases = [
        (["tune", config, "--cpus-per-trial", "2"], "go with --engine ray"),
        (["sweep", config, "--grid", "r=2,4", "--address", "auto"], "go with --engine ray"),
        (["tune", config, "--engine", "ray", "--gpus-per-trial", "-1"], "must be between 0 and 64"),
        (["tune", config, "--engine", "ray", "--space", "r=0,4"], "r must be >= 1"),
    ]
    for argv, message in cases:
        assert message in one_line_error(argv, capsys)
    assert not ray.is_initialized() and not (tmp_path / "out").exists()


def test_a_trial_killed_for_memory_is_one_line_and_the_study_continues_later(tmp_path, gemma3_dir, data_csv, capsys):
    """Ray's memory monitor kills a trial's worker and Tuner.fit raises: one line that says what to change, and
    the trial the killed driver left RUNNING in study.db is marked failed when the same command runs again."""
    import optuna

    from loracls.jobs.tune import _open_study

    config = str(_config_file(tmp_path / "c.yaml", gemma3_dir, data_csv, tmp_path / "out"))
    study_dir = tmp_path / "out" / "study"
    study_dir.mkdir(parents=True)
    left = _open_study(study_dir, 0).ask()  # what a killed driver leaves: a trial RUNNING forever

    def killed(self):
        raise RuntimeError(
            "Caught unexpected exception: 1 worker(s) were killed due to the node running low on memory. "
            "Memory on the node (IP: 10.0.0.1) was 22.38GB"
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("ray.tune.Tuner.fit", killed)
        argv = ["tune", config, "--trials", "1", "--space", "r=2,4", "--set", "run_name=study", "--engine", "ray"]
        message = one_line_error(argv, capsys)
    assert "the node ran low on memory" in message and "--cpus-per-trial" in message and "continues" in message
    assert not ray.is_initialized()
    states = {t.number: t.state for t in _open_study(study_dir, 0).trials}
    assert states[left.number] == optuna.trial.TrialState.FAIL
