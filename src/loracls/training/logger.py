"""The one logger of a training run: messages to the console, typed lines to train_log.jsonl, the validation
prediction files and the progress bar. Rank 0 writes; every rank counts the lines (a resume rewinds to them)."""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from loracls import files, runs
from loracls.training import distributed
from loracls.training.stopping import EarlyStopping
from loracls.training.tracking import Tracking


class RunLogger:
    def __init__(self, run: Path, say=print, tracking: Tracking | None = None):
        self.run, self._say, self.lines = run, say, 0
        self.tracking = tracking or Tracking([])  # report_to: every line also goes to the run's trackers
        self.main = distributed.is_main()
        self.bar: tqdm | None = None

    def say(self, message: str) -> None:
        if self.main:
            self._say(message)

    def line(self, record: runs.TrainLogLine | runs.ValidationLogLine) -> None:
        if self.main:
            values = runs.to_dict(record)
            files.append_jsonl(self.run / runs.TRAIN_LOG, values)
            self.tracking.metrics({k: v for k, v in values.items() if k not in ("step", "epoch")}, record.step)
        self.lines += 1

    def rewind(self, lines: int) -> None:
        """Back to the lines a checkpoint covers: what an interrupted process wrote after it goes."""
        if self.main:
            files.truncate_lines(self.run / runs.TRAIN_LOG, lines)
        self.lines = lines

    def resumed(self, step: int, epoch: int, stopping: EarlyStopping) -> None:
        if self.main:
            self.tracking.rewind(step)
        self.say(
            f"resume: from step {step} (epoch {epoch}), best validation accuracy {stopping.best_accuracy:.4f} "
            f"at step {stopping.best_step}"
        )

    def predictions(self, name: str, rows: list) -> None:
        if self.main:
            files.write_jsonl(self.run / runs.PREDICTIONS / f"{name}.jsonl", [row.to_json() for row in rows])

    def start(self, total: int, initial: int) -> None:
        shown = dict(desc="train", unit="step", dynamic_ncols=True, mininterval=2.0, disable=not self.main)
        self.bar = tqdm(total=total, initial=initial, **shown)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def extended(self, total: int, message: str) -> None:
        """The plan grew by an epoch (validation still improved at its end)."""
        if self.bar is not None:
            self.bar.total = total
            self.bar.refresh()
        self.say(message)

    def stepped(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def train_window(self, record: runs.TrainLogLine, total_steps: int) -> None:
        self.line(record)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record.loss:.4f}", tok_s=f"{record.tokens_per_second:.0f}")
        self.say(
            f"step {record.step}/{total_steps} loss {record.loss:.4f} lr {record.lr:.2e} "
            f"mem {record.memory_mb:.0f}MB {record.tokens_per_second:.0f} tok/s"
            + (f" MFU {100 * record.mfu:.1f}%" if record.mfu is not None else "")
        )

    def validation(self, record: runs.ValidationLogLine, stopping: EarlyStopping, patience: int) -> None:
        self.line(record)
        self.say(
            f"step {record.step}: validation accuracy {record.validation_accuracy:.4f}, macro F1 "
            f"{record.validation_macro_f1:.4f}, loss {record.validation_loss:.4f} (best by {stopping.select_by}: "
            f"step {stopping.best_step}, accuracy {stopping.best_accuracy:.4f})"
        )
        if stopping.stopped:
            self.say(f"early stop: {patience} validations without a better {stopping.select_by} or a lower loss")
