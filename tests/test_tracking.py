"""report_to: MLflow and TensorBoard fed with the settings, every train_log line, the test metrics and the
records, read back with each library's own reader (skipped where the extra is not installed)."""

import json
import sys

import pytest

from conftest import tiny_overrides
from loracls.cli import main
from loracls.runs import TrainLogLine, ValidationLogLine
from loracls.training.logger import RunLogger
from loracls.training.tracking import local_store, tracking

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed (pip install 'loracls[mlflow]')")
pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install 'loracls[tensorboard]')")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def _mlflow_run(root):
    client = mlflow.MlflowClient(tracking_uri=local_store(root))
    (found,) = client.search_runs([client.get_experiment_by_name("loracls").experiment_id])
    return client, found


def _scalars(run):
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _line(step, loss):
    return TrainLogLine(step=step, epoch=step / 10, loss=loss, lr=1e-3, memory_mb=10.0, tokens_per_second=100.0)


def test_each_line_reaches_both_trackers_and_a_resume_drops_what_followed_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with tracking(["mlflow", "tensorboard"], run) as tracked:
        tracked.params({"learning_rate": 1e-3, "r": 8})
        logger = RunLogger(run, lambda *_: None, tracked)
        for step, loss in ((1, 0.9), (2, 0.8), (3, 0.7)):
            logger.line(_line(step, loss))
        logger.line(
            ValidationLogLine(
                3, validation_accuracy=0.75, validation_loss=0.5, validation_macro_f1=0.7, best=0.75, improved=True
            )
        )
    with tracking(["mlflow", "tensorboard"], run, resumed=True) as tracked:  # killed after step 3, resumed at 2
        logger = RunLogger(run, lambda *_: None, tracked)
        logger.tracking.rewind(2)
        logger.line(_line(3, 0.65))
        tracked.artifacts([run / "train_log.jsonl"])
    client, found = _mlflow_run(tmp_path)
    assert found.data.params == {"learning_rate": "0.001", "r": "8"} and found.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(found.info.run_id, "loss")] == [1, 2, 3, 3]
    assert found.data.metrics["validation_accuracy"] == 0.75
    assert [a.path for a in client.list_artifacts(found.info.run_id)] == ["train_log.jsonl"]
    scalars = _scalars(run)
    assert scalars["loss"] == [(1, pytest.approx(0.9)), (2, pytest.approx(0.8)), (3, pytest.approx(0.65))]
    assert not scalars.get("validation_accuracy")  # its step-3 event came after the checkpoint: dropped


def test_a_failed_job_marks_its_mlflow_run_failed(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(RuntimeError), tracking(["mlflow"], run):
        raise RuntimeError("the job stopped")
    assert _mlflow_run(tmp_path)[1].info.status == "FAILED"


def test_a_run_with_report_to_is_tracked_end_to_end(gemma3_dir, data_csv, tmp_path):
    extra = dict(report_to=["mlflow", "tensorboard"], baseline=False, merge=False, epochs=1, train_size=48)
    assert main(["train", *tiny_overrides(gemma3_dir, data_csv, tmp_path, **extra)]) == 0
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    client, found = _mlflow_run(tmp_path)
    assert found.info.run_name == "run" and found.data.params["learning_rate"] == "0.005"
    assert found.data.metrics["test_accuracy"] == pytest.approx(metrics["test"]["accuracy"])
    logged = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert len(client.get_metric_history(found.info.run_id, "loss")) == sum("loss" in line for line in logged)
    assert main(["report", str(run)]) == 0
    names = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert {"metrics.json", "config.yaml", "report.html"} <= names
    assert _scalars(run)["test_accuracy"][0][1] == pytest.approx(metrics["test"]["accuracy"])
    # one HParams entry: the settings beside the test metrics (the HParams tab compares runs by them)
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    assert session.session_start_info.hparams["learning_rate"].number_value == pytest.approx(0.005)
    assert _scalars(run)["hparam/test_accuracy"][0][1] == pytest.approx(metrics["test"]["accuracy"])


def test_a_tracker_without_its_extra_is_one_line_and_nothing_is_written(
    gemma3_dir, data_csv, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    assert main(["train", *tiny_overrides(gemma3_dir, data_csv, tmp_path, report_to=["mlflow"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["loracls: report_to: mlflow needs its extra: pip install 'loracls[mlflow]'"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "uri, message",
    [
        ("http://127.0.0.1:9", "cannot use the tracking store http://127.0.0.1:9: MlflowException"),
        ("foo://x", "cannot use the tracking store foo://x"),
        ("sqlite:////no/such/folder/mlflow.db", "the tracking store sqlite:////no/such/folder/mlflow.db cannot be"),
    ],
)
def test_an_unusable_mlflow_store_is_one_line_before_the_run_dir(
    uri, message, monkeypatch, tmp_path, capsys, gemma3_dir, data_csv
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = tmp_path / "runs"
    assert main(["train", *tiny_overrides(gemma3_dir, data_csv, out), "--set", "report_to=[mlflow]"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("loracls: ")]
    assert len(err) == 1 and message in err[0], err
    assert not out.exists()


def test_mlflow_keeps_the_merged_classifier_as_a_loadable_model(gemma3_dir, data_csv, tmp_path, capsys):
    import mlflow.pyfunc

    extra = dict(report_to=["mlflow"], baseline=False, epochs=1, train_size=48)
    assert main(["train", *tiny_overrides(gemma3_dir, data_csv, tmp_path, **extra)]) == 0
    client, found = _mlflow_run(tmp_path)
    assert "model" in {a.path for a in client.list_artifacts(found.info.run_id)}
    local = client.download_artifacts(found.info.run_id, "model", str(tmp_path / "downloaded"))
    predicted = mlflow.pyfunc.load_model(local).predict(["good good film", "bad film"])
    out = tmp_path / "p.jsonl"
    assert (
        main(["predict", str(tmp_path / "run"), "--text", "good good film", "--text", "bad film", "--out", str(out)])
        == 0
    )
    ours = [json.loads(line) for line in out.read_text().splitlines()]
    assert list(predicted["label"]) == [row["prediction"] for row in ours]
    for row, score in zip(ours, predicted["score"]):
        assert abs(row["probabilities"][row["prediction"]] - score) < 1e-3
