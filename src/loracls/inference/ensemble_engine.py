"""The verdict's ensemble row as an engine: a run's LoRA classifier and the encoder it was compared with (saved
in RUN/encoder/), their calibrated probabilities averaged with LoRA's weight from ensemble.json (chosen on
validation), a label set's thresholds the ones refitted on the blend. `predict` and `evaluate` run it with
`--engine ensemble`; each text passes through both models (the verdict's cost is the sum)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loracls import runs
from loracls.errors import Log, LoraclsError
from loracls.inference.engine import Classifier
from loracls.problems import Decision

__all__ = ["Ensemble"]


class Ensemble:
    """Both members of a run's ensemble row, one interface with Classifier's `probabilities`."""

    writes_comments = False

    def __init__(self, run_path: str, log: Log = print, batch_size: int | None = None, device=None, precision=None):
        run = runs.check_run_dir(run_path)
        if not (run / runs.ENSEMBLE).is_file():
            raise LoraclsError(
                f"--engine ensemble: {run_path} has no ensemble row ({runs.ENSEMBLE} missing: no encoder was "
                f"trained, or no blend beat its members on validation)"
            )
        record = runs.read_ensemble(run)
        encoders = runs.read_encoders(run)
        index = next((i for i, enc in enumerate(encoders) if enc.model == record.encoder and enc.saved), None)
        if index is None:
            raise LoraclsError(f"--engine ensemble: the encoder {record.encoder} of {run_path} was not kept")
        folder = run / runs.encoder_folder(index)
        self.lora = Classifier(str(run), log, batch_size, device, precision)
        self.encoder = Classifier(str(folder), log, batch_size, device, precision)
        if self.encoder.id2label != self.lora.id2label:
            raise LoraclsError(f"--engine ensemble: {folder} has other labels than the run")
        self.weight, self.id2label, self.labels = record.weight, self.lora.id2label, self.lora.labels
        self.decision = Decision(self.lora.decision.problem, thresholds=record.thresholds)
        self.name, self.source = Path(run).name, f"{self.lora.source} x {record.weight:g} + {folder}"

    def probabilities(self, texts: list[str], progress: bool = False) -> np.ndarray:
        """LoRA's and the encoder's calibrated probabilities, blended at the weight chosen on validation."""
        lora = self.lora.probabilities(texts, progress)
        other = self.encoder.probabilities(texts, progress)
        return self.weight * lora + (1.0 - self.weight) * other
