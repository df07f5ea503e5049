"""Experiment tracking (`report_to: [mlflow, tensorboard]`): the run's settings, every train_log line as metrics
at its step, the final test metrics and the run's records as artifacts, in the tools a team already compares
its runs in. Trackers are registered by name; each is an optional extra (`pip install 'loracls[mlflow]'`,
`'loracls[tensorboard]'`), refused in one line where it is not installed. Rank 0 tracks.

- mlflow: a run in the experiment `loracls` of `MLFLOW_TRACKING_URI`, else a local store: `OUTPUT_DIR/mlflow.db`
  (SQLite) with the files in `OUTPUT_DIR/mlartifacts` (`mlflow ui --backend-store-uri sqlite:///...`); a
  resumed run continues the same MLflow run (its id is kept in `RUN/mlflow_run.json`).
- tensorboard: event files in `RUN/tensorboard/` (torch's SummaryWriter); a resumed run drops the events after
  the checkpoint's step, as train_log.jsonl does.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Protocol

from loracls import files
from loracls.errors import LoraclsError, first_line

__all__ = ["Tracker", "TRACKERS", "Tracking", "tracking", "check_installed", "check_usable", "local_store"]


class Tracker(Protocol):
    name: ClassVar[str]

    def __init__(self, run: Path, resumed: bool): ...

    def rewind(self, step: int) -> None:
        """A resumed run goes on from its checkpoint's `step`: what was tracked after it is dropped where the
        tool can (TensorBoard), else shown again (MLflow's history keeps both)."""

    def params(self, values: dict) -> None: ...

    def metrics(self, values: dict[str, float], step: int) -> None: ...

    def artifacts(self, paths: list[Path]) -> None: ...

    def close(self, failed: bool) -> None: ...


TRACKERS: dict[str, type[Tracker]] = {}


def register(cls):
    TRACKERS[cls.name] = cls
    return cls


def _needs(module: str, name: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise LoraclsError(f"report_to: {name} needs its extra: pip install 'loracls[{name}]'") from None


MODULES = {"mlflow": "mlflow", "tensorboard": "tensorboard"}  # what each tracker imports


def check_installed(names: list[str]) -> None:
    """Refuse a tracker whose extra is missing before anything is written."""
    for name in names:
        _needs(MODULES[name], name)


def check_usable(names: list[str]) -> None:
    """Refuse, before the run directory is made, a tracker whose store cannot be used: its extra missing, or
    (mlflow) a MLFLOW_TRACKING_URI that is unreachable, read-only or of an unknown scheme. One line, asked
    without retries (mlflow's own would retry an unreachable server for minutes)."""
    check_installed(names)
    for name in names:
        check = getattr(TRACKERS[name], "check", None)
        if check is not None:
            check()


def local_store(output_dir: Path) -> str:
    """MLflow's store where no MLFLOW_TRACKING_URI is set: SQLite in the output directory (MLflow's file store
    is in maintenance mode and refuses new runs unless told otherwise)."""
    return f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"


@register
class MlflowTracker:
    name = "mlflow"
    ID_FILE = "mlflow_run.json"

    @classmethod
    def check(cls) -> None:
        """The tracking store named by MLFLOW_TRACKING_URI answers and can be written (the local store, used
        where none is set, is made inside the output directory with the run)."""
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            return
        mlflow = _needs("mlflow", cls.name)
        if uri.startswith("sqlite:///"):
            path = Path(uri.removeprefix("sqlite:///"))
            target = path if path.exists() else path.parent
            if not os.access(target, os.W_OK):
                raise LoraclsError(f"report_to: mlflow: the tracking store {uri} cannot be written")
        retries = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
        kept = {key: os.environ.get(key) for key in retries}
        os.environ.update(retries)
        try:
            mlflow.MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
        except Exception as exc:  # unreachable, refused, an unknown scheme: whatever the store says, one line
            raise LoraclsError(
                f"report_to: mlflow: cannot use the tracking store {uri}: {type(exc).__name__}: {first_line(exc, 160)}"
            ) from None
        finally:
            for key, value in kept.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def __init__(self, run: Path, resumed: bool):
        mlflow = _needs("mlflow", self.name)
        from mlflow.entities import Metric, Param

        self._metric, self._param = Metric, Param
        uri = os.environ.get("MLFLOW_TRACKING_URI") or local_store(run.parent)
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        kept = run / self.ID_FILE
        if resumed and kept.is_file():
            self.run_id = json.loads(kept.read_text())["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = self.client.get_experiment_by_name("loracls")
            artifacts = (run.parent / "mlartifacts").resolve().as_uri()  # a local store keeps files beside it
            experiment_id = (
                experiment.experiment_id
                if experiment
                else self.client.create_experiment(
                    "loracls", artifact_location=None if "MLFLOW_TRACKING_URI" in os.environ else artifacts
                )
            )
            created = self.client.create_run(experiment_id, run_name=run.name, tags={"loracls.run_dir": str(run)})
            self.run_id = created.info.run_id
            files.write_json(kept, {"run_id": self.run_id, "tracking_uri": uri})
        self.resumed = resumed

    def rewind(self, step: int) -> None:
        return None

    def params(self, values: dict) -> None:
        if not self.resumed:  # MLflow refuses a parameter logged twice
            self.client.log_batch(self.run_id, params=[self._param(k, str(v)[:6000]) for k, v in values.items()])

    def metrics(self, values: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self._metric(k, float(v), now, step) for k, v in values.items()])

    def artifacts(self, paths: list[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path))

    def model(self, folder: Path) -> None:
        """The merged classifier as an MLflow model (the transformers flavor, a text-classification pipeline)
        under the run's `model` artifact: `mlflow.pyfunc.load_model("runs:/<id>/model")` reads it, and the
        registry can take it (`mlflow.register_model`)."""
        import tempfile

        import mlflow.transformers
        from transformers import pipeline

        remote = (folder / "modeling_loracls_generic.py").is_file()
        classify = pipeline("text-classification", model=str(folder), trust_remote_code=remote)
        with tempfile.TemporaryDirectory() as staging:
            saved = Path(staging) / "model"
            # the requirements said, not inferred (MLflow's inference imports torchvision, which a CPU torch lacks)
            mlflow.transformers.save_model(classify, str(saved), pip_requirements=["torch", "transformers"])
            self.client.log_artifacts(self.run_id, str(saved), "model")

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


@register
class TensorboardTracker:
    name = "tensorboard"
    DIR = "tensorboard"

    def __init__(self, run: Path, resumed: bool):
        _needs("tensorboard", self.name)
        from torch.utils.tensorboard import SummaryWriter

        self.directory, self.writer_class = run / self.DIR, SummaryWriter
        self.writer = SummaryWriter(str(self.directory))
        self.hparams: dict = {}
        self.final: dict[str, float] = {}  # the test metrics: the HParams tab's columns

    def rewind(self, step: int) -> None:
        self.writer.close()
        self.writer = self.writer_class(str(self.directory), purge_step=step + 1)  # events after `step` go

    def params(self, values: dict) -> None:
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in values.items()))
        # the HParams tab takes numbers, text and booleans; lists and mappings as their text
        self.hparams = {
            k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in values.items() if v is not None
        }

    def metrics(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.final.update({f"hparam/{k}": v for k, v in values.items() if k.startswith("test_")})

    def artifacts(self, paths: list[Path]) -> None:
        for path in paths:
            if path.suffix == ".json":  # TensorBoard keeps no files: the records as text
                self.writer.add_text(path.name, "    " + path.read_text().replace("\n", "\n    "))

    def close(self, failed: bool) -> None:
        if self.final and not failed:  # one HParams entry a finished run: runs compared on the HParams tab
            self.writer.add_hparams(self.hparams, self.final, run_name=".")
        self.writer.close()


class Tracking:
    """Every tracker of the run, fed together (none: nothing happens)."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def rewind(self, step: int) -> None:
        for tracker in self.trackers:
            tracker.rewind(step)

    def metrics(self, values: dict, step: int) -> None:
        numbers = {k: v for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        for tracker in self.trackers:
            tracker.metrics(numbers, step)

    def params(self, values: dict) -> None:
        for tracker in self.trackers:
            tracker.params(values)

    def artifacts(self, paths: list[Path]) -> None:
        for tracker in self.trackers:
            tracker.artifacts([path for path in paths if path.is_file()])

    def model(self, folder: Path, log) -> None:
        """The exported model, to each tracker that keeps models (MLflow); a failure is said, not raised: the
        run itself is finished and written."""
        for tracker in self.trackers:
            if hasattr(tracker, "model") and folder.is_dir():
                try:
                    tracker.model(folder)
                except Exception as exc:  # the run is done; the tracker's copy is a convenience
                    log(f"{tracker.name}: the model was not logged ({type(exc).__name__}: {first_line(exc, 160)})")


@contextmanager
def tracking(names: list[str], run: Path, resumed: bool = False) -> Iterator[Tracking]:
    """The run's trackers for the life of a `with` block; they are closed however it ends (failed: MLflow's
    run is marked FAILED)."""
    opened: list[Tracker] = []
    try:
        for name in names:
            opened.append(TRACKERS[name](run, resumed))
        yield Tracking(opened)
    except BaseException:
        for tracker in opened:
            tracker.close(failed=True)
        raise
    else:
        for tracker in opened:
            tracker.close(failed=False)
