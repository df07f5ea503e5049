"""`loracls tune`: the Optuna search on the tiny model, judged on validation only, over several data sets."""

import csv

import pytest
import yaml

from conftest import synthetic_frame, tiny_overrides
from loracls.cli import main
from loracls.errors import LoraclsError
from loracls.jobs.tune import DEFAULT_SPACE, parse_space


def _config_file(path, gemma3_dir, data, out):
    args = tiny_overrides(gemma3_dir, data, out, epochs=1, train_size=120, validation_size=40, test_size=40)
    values = {
        args[i + 1].split("=", 1)[0]: yaml.safe_load(args[i + 1].split("=", 1)[1]) for i in range(0, len(args), 2)
    }
    values.pop("run_name")
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.mark.slow
def test_tune_searches_two_data_sets_on_validation_and_continues(tmp_path, gemma3_dir, data_csv, capsys):
    other = tmp_path / "three.csv"
    synthetic_frame(300, seed=5, classes={"a": ["good", "great"], "b": ["bad", "awful"], "c": ["ok", "meh"]}).to_csv(
        other, index=False
    )
    first = _config_file(tmp_path / "two.yaml", gemma3_dir, data_csv, tmp_path / "out")
    second = _config_file(tmp_path / "three.yaml", gemma3_dir, other, tmp_path / "out")
    space = [
        "--space",
        "learning_rate=log:1e-3:1e-2",
        "r=2,4",
        "target_modules=[q_proj,v_proj],[q_proj,k_proj,v_proj,o_proj]",
    ]
    assert main(["tune", str(first), str(second), "--trials", "2", *space, "--set", "run_name=study"]) == 0
    study = tmp_path / "out" / "study"
    rows = list(csv.DictReader((study / "results.csv").open()))
    assert len(rows) == 2
    for row in rows:
        scores = [float(row["validation_two"]), float(row["validation_three"])]
        assert float(row["mean_validation"]) == pytest.approx(sum(scores) / 2)
        assert row["r"] in ("2", "4") and 1e-3 <= float(row["learning_rate"]) <= 1e-2
        assert "test" not in " ".join(row)  # the search reads validation only
    first_trial = next(row for row in rows if row["trial"] == "0")  # the config's own settings come first
    assert first_trial["r"] == "4" and float(first_trial["learning_rate"]) == pytest.approx(5e-3)
    assert first_trial["target_modules"] == "q_proj,v_proj"
    trial_runs = sorted(p.name for p in study.iterdir() if p.name.startswith("trial"))
    assert trial_runs == ["trial000-three", "trial000-two", "trial001-three", "trial001-two"]
    for run in trial_runs:  # trials skip baselines and the merge
        assert not (study / run / "merged").exists() and not (study / run / "tfidf.json").exists()
    best = yaml.safe_load((study / "best.yaml").read_text())
    assert set(best) == {"learning_rate", "r", "target_modules"} and isinstance(best["target_modules"], list)
    best_row = max(rows, key=lambda r: float(r["mean_validation"]))
    assert best["r"] == int(best_row["r"])
    assert (
        main(
            [
                "train",
                str(first),
                "--set",
                f"output_dir={tmp_path / 'again'}",
                "--set",
                "run_name=best",
                *[arg for key, value in best.items() for arg in ("--set", f"{key}={value}")],
            ]
        )
        == 0
    )
    # a second call continues the same study up to the new total
    assert main(["tune", str(first), str(second), "--trials", "3", *space, "--set", "run_name=study"]) == 0
    assert len(list(csv.DictReader((study / "results.csv").open()))) == 3
    assert "2 done before" in capsys.readouterr().err


def test_space_parsing_and_refusals(tmp_path, gemma3_dir, data_csv, capsys):
    dims = {d.key: d for d in parse_space(None)}
    assert set(dims) == set(DEFAULT_SPACE) and dims["learning_rate"].kind == "log"
    assert dims["target_modules"].choices[0] == ["q_proj", "v_proj"] and len(dims["target_modules"].choices) == 3
    assert dims["epochs"].kind == "int"
    for bad, message in (
        ("learnin_rate=1,2", "did you mean 'learning_rate'"),
        ("r=log:0:4", "LOW > 0"),
        ("r=int:5:2", "LOW < HIGH"),
        ("r", "key=spec"),
    ):
        with pytest.raises(LoraclsError, match=message):
            parse_space([bad])
    config = _config_file(tmp_path / "c.yaml", gemma3_dir, data_csv, tmp_path / "out")
    assert main(["tune", str(config), "--trials", "1", "--space", "r=0,4"]) == 2  # r=0 is out of range
    err = capsys.readouterr().err
    assert err.startswith("loracls: config: r must be >= 1") and not (tmp_path / "out").exists()


def test_a_trial_left_running_by_a_killed_driver_is_marked_failed(tmp_path):
    import optuna

    from loracls.jobs.tune import _fail_cut_off, _open_study

    study = _open_study(tmp_path, 0)
    finished = study.ask()
    study.tell(finished, 0.5)
    left = study.ask()
    said = []
    _fail_cut_off(_open_study(tmp_path, 0), said.append)
    states = {t.number: t.state for t in _open_study(tmp_path, 0).trials}
    assert states == {finished.number: optuna.trial.TrialState.COMPLETE, left.number: optuna.trial.TrialState.FAIL}
    assert said == [f"tune: trial {left.number} was cut off before it finished (its driver stopped); marked failed"]


def test_a_continued_study_draws_new_points(tmp_path):
    """The sampler is seeded with the seed plus the trials the study holds: a rerun does not replay the first
    run's random start-up trials."""
    from loracls.jobs.tune import _open_study

    drawn = []
    for _ in range(2):  # two drivers, one after the other, on the same study.db
        study = _open_study(tmp_path, 0)
        for _ in range(2):
            trial = study.ask()
            drawn.append(trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True))
            study.tell(trial, 0.5)
    assert len(set(drawn)) == 4
