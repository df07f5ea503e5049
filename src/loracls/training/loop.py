"""The training loop: an explicit torch loop (AdamW, warmup + cosine, accumulation, clipping, validation).

Written by hand rather than with HF Trainer because it measured faster on the same job (bench: 1.6x HF
Trainer's train tokens/s, 1.35x its whole-job time per optimizer step on this CPU; docs/benchmarks.md).

The Trainer holds the step, the loop, the stopping rule and the checkpoints, and nothing else: the job hands
it the encoded training split (`TrainSet`), a pure `evaluate(model) -> Evaluation` for the validation split,
a model already on its device with its speed-ups applied, and the run's one logger. Every `log_every`
optimizer steps it logs a `TrainLogLine` (loss, lr, memory, tokens/s, MFU); every `eval_every` steps it
validates, keeps the best adapter (`EarlyStopping` decides) and writes a resumable checkpoint. A resumed run
replays the same batches, RNG and optimizer state, so it ends where an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from loracls import runs
from loracls.config import Config
from loracls.data.batching import TrainSet, collate, sorted_batches
from loracls.errors import LoraclsError
from loracls.hardware import memory_mb, peak_flops, release_free_memory
from loracls.problems import Evaluation
from loracls.training import checkpoint, distributed
from loracls.training.logger import RunLogger
from loracls.training.mfu import mfu, train_flops_per_token
from loracls.training.plan import Optimization, make_plan
from loracls.training.stopping import EarlyStopping

# an extension epoch restarts at this share of the peak learning rate (the planned cosine has reached zero)
EXTENSION_RESTART = 0.25


@dataclass
class TrainResult:
    steps: int
    best_step: int
    best_validation_accuracy: float
    stopped_early: bool
    seconds: float  # wall time of the loop, validation included
    train_tokens: int
    tokens_per_second: float  # train steps only
    mfu: float | None  # share of the device peak at the precision trained in; None where the peak is unknown
    extensions: int = 0  # epochs added to the plan because the last validation was still the best
    still_improving: bool = False  # the run ended on its best validation: more training may have helped

    def summary(self) -> runs.TrainSummary:
        """metrics.json's `train`."""
        return runs.TrainSummary(
            self.steps, self.stopped_early, self.seconds, self.train_tokens, self.tokens_per_second, self.mfu,
            self.extensions, self.still_improving,
        )  # fmt: skip

    def validation_summary(self, select_by: str) -> runs.ValidationSummary:
        """metrics.json's `validation`: the best checkpoint's step and accuracy."""
        return runs.ValidationSummary(self.best_validation_accuracy, self.best_step, select_by)


@dataclass
class LoopState:
    """Everything a resumed run needs to continue exactly where the checkpoint was written (plain values)."""

    stopping: EarlyStopping
    step: int = 0
    epoch: int = 0
    group: int = 0  # next accumulation group within the epoch
    train_tokens: int = 0
    train_seconds: float = 0.0
    log_lines: int = 0  # train_log.jsonl lines covered by this state
    window: dict = field(default_factory=lambda: {"loss": 0.0, "tokens": 0, "steps": 0, "seconds": 0.0})
    extensions: int = 0  # epochs added while the last validation was still the best (extend_epochs)

    @classmethod
    def from_dict(cls, values: dict) -> LoopState:
        return cls(**{**values, "stopping": EarlyStopping(**values["stopping"])})

    def took(self, loss: float, tokens: int, seconds: float) -> None:
        """One optimizer step done: counted in the run and in the window since the last log line."""
        self.group, self.step = self.group + 1, self.step + 1
        self.train_seconds, self.train_tokens = self.train_seconds + seconds, self.train_tokens + tokens
        for key, value in (("loss", loss), ("tokens", tokens), ("steps", 1), ("seconds", seconds)):
            self.window[key] += value

    def window_line(self, steps_per_epoch: int, lr: float, memory: float, mfu_of) -> runs.TrainLogLine:
        """The log line of the window since the last one (its mean loss over all processes); a new window."""
        speed = self.window["tokens"] / max(self.window["seconds"], 1e-9)
        share = mfu_of(speed)
        line = runs.TrainLogLine(
            step=self.step,
            epoch=round(self.step / steps_per_epoch, 3),
            loss=round(distributed.sum_scalar(self.window["loss"]) / self.window["steps"], 5),  # ranks: shares
            lr=lr,
            memory_mb=round(memory, 1),
            tokens_per_second=round(speed, 1),
            mfu=None if share is None else round(share, 5),
        )
        self.window.update(loss=0.0, tokens=0, steps=0, seconds=0.0)
        return line

    def result(self, seconds: float, mfu_of) -> TrainResult:
        speed, stopping = self.train_tokens / max(self.train_seconds, 1e-9), self.stopping
        return TrainResult(
            self.step, stopping.best_step, stopping.best_accuracy, stopping.stopped,
            seconds, self.train_tokens, speed, mfu_of(speed), self.extensions,
            not stopping.stopped and stopping.best_step == self.step,
        )  # fmt: skip


class Trainer:
    def __init__(
        self, model, train: TrainSet, evaluate: Callable[[torch.nn.Module], Evaluation], config: Config, runtime,
        logger: RunLogger,
    ):  # fmt: skip
        """`logger` writes the run directory's train log; the checkpoint and the best adapter go beside it."""
        self.model, self.train_set, self.evaluate = model, train, evaluate
        self.config, self.runtime, self.run, self.logger = config, runtime, logger.run, logger
        self.world, self.rank = distributed.world_size(), distributed.rank()
        self.sharded = distributed.is_sharded(model)
        self.plan = make_plan(len(train.ids), config, runtime.device, self.world)
        self.opt = Optimization.for_model(model, config, runtime, self.plan.total_steps)
        flops = dict(flops_per_token=train_flops_per_token(model), peak=peak_flops(runtime), devices=self.world)
        self.mfu_of = functools.partial(mfu, **flops)  # tokens/s -> share of the devices' peak (None: unknown)
        self.state = LoopState(EarlyStopping(config.patience, config.select_by))
        self.best_state: dict[str, torch.Tensor] = {}

    # --- checkpoints ------------------------------------------------------------------------------

    def _trainable(self) -> dict[str, torch.Tensor]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def save_checkpoint(self) -> None:
        self.state.log_lines = self.logger.lines
        loop = dataclasses.asdict(self.state)
        checkpoint.save(self.run / runs.CHECKPOINT, self.model, self.opt, loop, self._trainable(), self.best_state)

    def load_checkpoint(self) -> None:
        payload = checkpoint.read(self.run / runs.CHECKPOINT)
        checkpoint.check_fits(payload, self._trainable(), self.run / runs.CHECKPOINT)
        self.state, self.best_state = LoopState.from_dict(payload["loop"]), payload["best_state"]
        self._set_trainable(payload["trainable"])
        checkpoint.restore(payload, self.model, self.opt)
        self.logger.rewind(self.state.log_lines)
        self.logger.resumed(self.state.step, self.state.epoch, self.state.stopping)

    def _set_trainable(self, values: dict[str, torch.Tensor]) -> None:
        named = dict(self.model.named_parameters())
        for name, value in values.items():
            distributed.copy_into(named[name], value)

    # --- one optimizer step -----------------------------------------------------------------------

    def _accumulate(self, group: list[int]) -> tuple[float, int]:
        """Forward/backward over this process's slice of one optimizer step, in micro-batches; the loss is
        the mean over the whole group (all processes), so summed gradients equal one big batch whatever the
        micro-batch size or process count. Returns (loss, tokens of the whole group)."""
        data, runtime = self.train_set, self.runtime
        share = math.ceil(len(group) / self.world)
        mine, total_loss = group[self.rank * share : (self.rank + 1) * share], 0.0
        lengths = [len(data.ids[i]) for i in mine]
        for positions in sorted_batches(lengths, self.plan.micro_batch_size, self.plan.micro_batch_tokens):
            indices = [mine[p] for p in positions]
            batch = {k: v.to(runtime.device) for k, v in collate([data.ids[i] for i in indices], data.pad_id).items()}
            labels = data.problem.targets([data.labels[i] for i in indices], data.num_labels, runtime.device)
            with runtime.autocast:
                logits = self.model(**batch).logits
            loss = data.problem.loss(logits.float(), labels, data.class_weight, len(group))  # a share of the mean
            self.opt.scaler.scale(loss).backward()
            total_loss += loss.item()
        if not self.sharded:  # FSDP has reduce-scattered them already
            distributed.sum_gradients(self.opt.params)
        return total_loss, sum(len(data.ids[i]) for i in group)

    def train_step(self, group: list[int]) -> tuple[float, int]:
        """One optimizer step over one group of example indices: (loss, tokens)."""
        loss, tokens = self._accumulate(group)
        if not math.isfinite(loss):
            raise LoraclsError(
                f"loss is {loss} at step {self.state.step + 1}: training stopped "
                f"(best adapter so far kept in {self.run / runs.ADAPTER}); lower learning_rate"
            )
        opt = self.opt
        opt.scaler.unscale_(opt.optimizer)  # clipping sees true gradients; a no-op unless fp16
        if self.config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(opt.params, self.config.max_grad_norm)
        if self.state.step >= self.plan.total_steps:  # an extension epoch: beyond the planned schedule
            for group in opt.optimizer.param_groups:
                group["lr"] = self._extension_lr()
        opt.scaler.step(opt.optimizer)  # skipped by the scaler when fp16 gradients overflowed
        opt.scaler.update()
        if self.state.step < self.plan.total_steps:
            opt.scheduler.step()
        opt.optimizer.zero_grad(set_to_none=True)
        return loss, tokens

    # --- validation and the loop ------------------------------------------------------------------

    def validate(self, step: int) -> None:
        """Score the validation split; keep the best adapter; stop on a non-finite validation."""
        scored = self.evaluate(self.model) if distributed.is_main() or self.sharded else None  # sharded: all ranks
        scores = (math.nan, math.nan, math.nan)
        if distributed.is_main() and scored.finite:
            scores = (scored.metrics.accuracy, scored.loss, scored.metrics.macro_f1)
            self.logger.predictions(f"validation_step{step:05d}", scored.rows)
        accuracy, loss, macro_f1 = distributed.broadcast_object(scores)
        release_free_memory()  # the allocator otherwise keeps what training and validation batches freed
        stopping = self.state.stopping
        if not (math.isfinite(accuracy) and math.isfinite(loss)):
            raise LoraclsError(
                f"validation at step {step} gave non-finite outputs: training stopped; the best adapter "
                f"so far (step {stopping.best_step}) is kept in {self.run / runs.ADAPTER}; lower learning_rate"
            )
        improved = stopping.update(step, accuracy, loss, macro_f1)
        if improved:
            self.best_state = distributed.full_copy(self._trainable())
            checkpoint.save_adapter(self.run / runs.ADAPTER, self.model, self.best_state)
        best = stopping.best_accuracy
        line = runs.ValidationLogLine(step, accuracy, round(loss, 5), round(macro_f1, 5), best, improved)
        self.logger.validation(line, stopping, self.config.patience)

    @property
    def total_steps(self) -> int:
        """The planned steps, and an epoch more for every extension granted."""
        return self.plan.total_steps + self.state.extensions * self.plan.steps_per_epoch

    def _running(self) -> bool:
        return self.state.step < self.total_steps and not self.state.stopping.stopped

    def _maybe_extend(self) -> None:
        """At the end of the plan: while the last validation is still the best, one more epoch (at most
        extend_epochs), its learning rate a cosine from EXTENSION_RESTART x the peak down to zero."""
        state, stopping = self.state, self.state.stopping
        if state.step != self.total_steps or stopping.stopped or stopping.best_step != state.step:
            return
        if state.extensions >= self.config.extend_epochs or self.config.max_steps is not None:
            return  # the cap reached, or a step count the user fixed
        state.extensions += 1
        self.logger.extended(
            self.total_steps,
            f"train: validation still improved at step {state.step}, the end of the plan: one more epoch "
            f"({state.extensions} of at most {self.config.extend_epochs}, extend_epochs)",
        )

    def _extension_lr(self) -> float:
        """The learning rate of a step beyond the plan: a warm restart at EXTENSION_RESTART x the peak, cosine
        to zero over the extension epoch."""
        into = (self.state.step - self.plan.total_steps) % self.plan.steps_per_epoch
        progress = into / max(self.plan.steps_per_epoch, 1)
        return self.config.peak_learning_rate * EXTENSION_RESTART * 0.5 * (1 + math.cos(math.pi * progress))

    def fit(self) -> TrainResult:
        state, start = self.state, time.perf_counter()
        self.model.train()
        self.logger.start(self.plan.total_steps, state.step)
        try:
            while self._running():
                groups = self.plan.groups([len(x) for x in self.train_set.ids], self.config, state.epoch)
                while state.group < len(groups) and self._running():
                    self._one_step(groups[state.group])
                    if state.step % self.config.eval_every == 0 or state.step == self.total_steps:
                        self.validate(state.step)
                        self._maybe_extend()
                        self.save_checkpoint()
                if state.group >= len(groups):
                    state.epoch, state.group = state.epoch + 1, 0
        finally:
            self.logger.stop()
        distributed.barrier()
        self._set_trainable(self.best_state)
        return state.result(time.perf_counter() - start, self.mfu_of)

    def _one_step(self, group: list[int]) -> None:
        state, started = self.state, time.perf_counter()
        loss, tokens = self.train_step(group)
        state.took(loss, tokens, time.perf_counter() - started)
        self.logger.stepped()
        if state.step % self.config.log_every == 0 or state.step == self.total_steps:
            lr, memory = self.opt.optimizer.param_groups[0]["lr"], memory_mb(self.runtime.device)
            line = state.window_line(self.plan.steps_per_epoch, lr, memory, self.mfu_of)
            self.logger.train_window(line, self.total_steps)
