"""The stopping rule, a pure state machine: which validation is the best so far, and when to stop.

The best checkpoint has the best validation score (`select_by`: accuracy, macro-F1, or loss; ties go to the
lower validation loss). `patience` validations in a row that improve neither the best score nor the lowest
validation loss (by LOSS_MIN_GAIN) stop the run. Accuracy on a few hundred examples moves in steps of 1/n and
plateaus early; the loss keeps showing whether training still helps (measured on the embedded job: accuracy
alone stopped it at step 350 of 471 with the best checkpoint at step 100, while the validation loss was still
falling until step 250). A non-finite validation is never the best and never a gain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOSS_MIN_GAIN = 1e-3  # a validation loss counts as lower when it is below the lowest so far by this fraction


@dataclass
class EarlyStopping:
    patience: int | None  # None: never stop early
    select_by: str = "accuracy"  # accuracy | macro_f1 | loss
    best_score: float = -math.inf  # of select_by, higher is better (the loss enters negated)
    best_loss: float = math.inf  # validation loss of the best checkpoint (breaks score ties)
    best_step: int = 0
    best_accuracy: float = -1.0  # validation accuracy of the best checkpoint
    lowest_loss: float = math.inf
    evals_without_gain: int = 0
    stopped: bool = False

    def update(self, step: int, accuracy: float, loss: float, macro_f1: float | None = None) -> bool:
        """Take one validation; True when it is the new best checkpoint."""
        score = {"accuracy": accuracy, "macro_f1": macro_f1, "loss": -loss}[self.select_by]
        finite = all(value is not None and math.isfinite(value) for value in (accuracy, loss, score))
        improved = finite and (score > self.best_score or (score == self.best_score and loss < self.best_loss))
        loss_fell = finite and loss < self.lowest_loss * (1 - LOSS_MIN_GAIN)
        if finite:
            self.lowest_loss = min(self.lowest_loss, loss)
        self.evals_without_gain = 0 if improved or loss_fell else self.evals_without_gain + 1
        if improved:
            self.best_score, self.best_loss, self.best_step, self.best_accuracy = score, loss, step, accuracy
        if self.patience is not None and self.evals_without_gain >= self.patience:
            self.stopped = True
        return improved
