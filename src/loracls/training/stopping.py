"""The stopping rule, a pure state machine: which validation is the best so far, and when to stop.

The best checkpoint has the highest validation accuracy (ties go to the lower validation loss). `patience`
validations in a row that improve neither the best accuracy nor the lowest validation loss (by
LOSS_MIN_GAIN) stop the run. Accuracy on a few hundred examples moves in steps of 1/n and plateaus early;
the loss keeps showing whether training still helps (measured on the embedded job: accuracy alone stopped
it at step 350 of 471 with the best checkpoint at step 100, while the validation loss was still falling
until step 250). A non-finite validation is never the best and never a gain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOSS_MIN_GAIN = 1e-3  # a validation loss counts as lower when it is below the lowest so far by this fraction


@dataclass
class EarlyStopping:
    patience: int | None  # None: never stop early
    best_accuracy: float = -1.0
    best_loss: float = math.inf  # validation loss of the best checkpoint (breaks accuracy ties)
    best_step: int = 0
    lowest_loss: float = math.inf
    evals_without_gain: int = 0
    stopped: bool = False

    def update(self, step: int, accuracy: float, loss: float) -> bool:
        """Take one validation; True when it is the new best checkpoint."""
        finite = math.isfinite(accuracy) and math.isfinite(loss)
        improved = finite and (accuracy > self.best_accuracy
                               or (accuracy == self.best_accuracy and loss < self.best_loss))
        loss_fell = finite and loss < self.lowest_loss * (1 - LOSS_MIN_GAIN)
        if finite:
            self.lowest_loss = min(self.lowest_loss, loss)
        self.evals_without_gain = 0 if improved or loss_fell else self.evals_without_gain + 1
        if improved:
            self.best_accuracy, self.best_loss, self.best_step = accuracy, loss, step
        if self.patience is not None and self.evals_without_gain >= self.patience:
            self.stopped = True
        return improved
