"""Training stage: an explicit torch loop (AdamW, warmup + cosine, accumulation, clipping, validation).

Every `log_every` optimizer steps one JSON line (loss, lr, memory, tokens/s); every `eval_every` steps a
validation pass writes its predictions JSONL, keeps the best adapter by validation accuracy (ties go to the
lower validation loss), and writes a resumable checkpoint (atomically); `patience` validations in a row
that improve neither the best accuracy nor the lowest validation loss (by LOSS_MIN_GAIN) stop the run.
Accuracy on a few hundred examples moves in steps of 1/n and plateaus early; the loss keeps showing
whether training still helps (measured on the embedded job: accuracy alone stopped it at step 350 of 471
with the best checkpoint at step 100, while the validation loss was still falling until step 250).
A resumed run replays the same batches, RNG and optimizer state, so it ends where an uninterrupted one would.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import PreTrainedModel, get_scheduler

from loracls import distributed, rundir
from loracls.config import Config
from loracls.data import Dataset, collate, encode, length_grouped_batches
from loracls.errors import LoraclsError
from loracls.evaluate import predict_probabilities, prediction_rows


@dataclass
class TrainResult:
    steps: int
    best_step: int
    best_validation_accuracy: float
    stopped_early: bool
    seconds: float  # wall time of the loop, validation included
    train_tokens: int
    tokens_per_second: float  # train steps only


@dataclass
class LoopState:
    """Everything a resumed run needs to continue exactly where the checkpoint was written."""
    step: int = 0
    epoch: int = 0
    group: int = 0  # next accumulation group within the epoch
    best_accuracy: float = -1.0
    best_step: int = 0
    best_loss: float = math.inf  # validation loss of the best checkpoint (breaks accuracy ties)
    lowest_loss: float = math.inf
    evals_without_gain: int = 0
    stopped_early: bool = False
    train_tokens: int = 0
    train_seconds: float = 0.0
    log_lines: int = 0  # train_log.jsonl lines covered by this state
    window: dict = field(default_factory=lambda: {"loss": 0.0, "tokens": 0, "steps": 0, "seconds": 0.0})  # since last log
    best_state: dict = field(default_factory=dict)


LOSS_MIN_GAIN = 1e-3  # a validation loss counts as lower when it is below the lowest so far by this fraction


def memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * 4096 / 2**20
    except OSError:
        return float("nan")


def make_optimizer(params, config: Config) -> torch.optim.Optimizer:
    if config.optimizer == "adamw_8bit":  # availability checked before the run starts
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)


def micro_batch_size(config: Config, device: torch.device) -> int:
    """Examples per forward/backward. On CPU memory is plentiful and bigger matmuls run faster, so the
    accumulation steps run as one micro-batch (same gradient: the loss is a mean over the whole step)."""
    if config.micro_batch_size is not None:
        return config.micro_batch_size
    return config.batch_size * config.gradient_accumulation if device.type == "cpu" else config.batch_size


def store_frozen_linears_in(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Keep frozen Linear weights in the autocast compute dtype (bf16/fp16) instead of fp32.

    Autocast casts every fp32 weight to that dtype in every forward pass; a weight already in it is used as
    is, so the results are the same bit for bit while the per-step cast of all frozen weights (and half
    their memory) goes away. Trainable weights (LoRA, head) stay fp32 for the optimizer. Returns the count."""
    if dtype == torch.float32:
        return 0
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and not module.weight.requires_grad:
            module.to(dtype)
            count += 1
    return count


def pick_attention(model: torch.nn.Module, device: torch.device) -> str | None:
    """On CPU, use transformers' eager attention (matmul, softmax, matmul) instead of SDPA.

    torch's CPU SDPA (flash kernel) has a slow backward for the short, padded sequences of classification
    data: on the embedded job it took 13% of a train step, 4x its own forward. Measured on Gemma 3 270M
    (2 cores, bf16 autocast), a forward+backward with eager attention is faster at every length tried:
    0.69 vs 0.74 s (32 x 24 tokens), 1.02 vs 1.16 s (8 x 128), 1.20 vs 1.49 s (2 x 512), 1.58 vs 1.92 s
    (1 x 1024). On GPUs SDPA's fused kernels are kept. Returns the implementation set, or None."""
    if device.type != "cpu":
        return None
    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            if getattr(module.config, "_attn_implementation", None) in (None, "sdpa"):
                module.set_attn_implementation("eager")
            return module.config._attn_implementation
    return None


def plan_steps(num_examples: int, config: Config, world: int = 1) -> tuple[int, int]:
    """(optimizer steps per epoch, total optimizer steps)."""
    per_epoch = math.ceil(num_examples / (config.batch_size * config.gradient_accumulation * world))
    total = per_epoch * config.epochs
    return per_epoch, min(total, config.max_steps) if config.max_steps else total


class Trainer:
    def __init__(self, model, tokenizer, dataset: Dataset, config: Config, runtime, run: Path, log=print):
        self.model, self.tokenizer, self.dataset = model, tokenizer, dataset
        self.config, self.runtime, self.run, self.log = config, runtime, run, log
        self.world, self.rank = distributed.world_size(), distributed.rank()
        self.pad_id = tokenizer.pad_token_id
        self.train_ids = encode(tokenizer, dataset.train.texts, config.max_length, config.input_template)
        self.validation_ids = encode(tokenizer, dataset.validation.texts, config.max_length, config.input_template)
        self.sharded = distributed.is_sharded(model)
        if config.quantization == "none" and not self.sharded:  # FSDP units keep one dtype per unit
            store_frozen_linears_in(model, runtime.dtype)
        self.attention = pick_attention(model, runtime.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params, config)
        self.steps_per_epoch, self.total_steps = plan_steps(len(dataset.train), config, self.world)
        self.scheduler = get_scheduler(config.scheduler if config.scheduler != "constant" else "constant_with_warmup",
                                       self.optimizer, num_warmup_steps=config.warmup_steps,
                                       num_training_steps=self.total_steps)
        self.micro_batch_size = micro_batch_size(config, runtime.device)
        self.state = LoopState()

    # --- checkpoints ------------------------------------------------------------------------------

    def _trainable(self) -> dict[str, torch.Tensor]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def save_checkpoint(self) -> None:
        """Every process calls (each one's RNG state is kept; a sharded model's state is gathered); rank 0 writes."""
        rng = distributed.gather_object(torch.get_rng_state())  # ranks draw different amounts (dropout)
        if not (self.sharded or distributed.is_main()):
            return
        trainable = distributed.full_copy(self._trainable())
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            optimizer = get_optimizer_state_dict(self.model, self.optimizer,
                                                 options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        else:
            optimizer = self.optimizer.state_dict()
        if not distributed.is_main():
            return
        payload = {"loop": self.state.__dict__, "optimizer": optimizer, "scheduler": self.scheduler.state_dict(),
                   "rng": rng, "trainable": trainable}
        target = self.run / rundir.CHECKPOINT
        tmp = target.with_name(target.name + ".tmp")
        torch.save(payload, tmp)
        tmp.replace(target)

    def load_checkpoint(self) -> None:
        path = self.run / rundir.CHECKPOINT
        if not path.is_file():
            raise LoraclsError(f"{self.run} has no {rundir.CHECKPOINT} to resume from")
        payload = torch.load(path, map_location="cpu", weights_only=False)
        self.state = LoopState(**payload["loop"])
        self._set_trainable(payload["trainable"])
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(self.model, self.optimizer, payload["optimizer"],
                                     options=StateDictOptions(full_state_dict=True))
        else:
            self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        rng = payload["rng"] if isinstance(payload["rng"], list) else [payload["rng"]]  # older checkpoints: one state
        torch.set_rng_state(rng[distributed.rank()] if len(rng) == self.world else rng[0])
        if distributed.is_main():
            rundir.truncate_lines(self.run / rundir.TRAIN_LOG, self.state.log_lines)
        self.log(f"resume: from step {self.state.step} (epoch {self.state.epoch}), "
                 f"best validation accuracy {self.state.best_accuracy:.4f} at step {self.state.best_step}")

    def _log_line(self, record: dict) -> None:
        if distributed.is_main():
            rundir.append_jsonl(self.run / rundir.TRAIN_LOG, record)
        self.state.log_lines += 1

    # --- one optimizer step -----------------------------------------------------------------------

    def _step_groups(self, epoch: int) -> list[list[int]]:
        """One list of example indices per optimizer step (all processes together), grouped by length."""
        lengths = [len(x) for x in self.train_ids]
        size = self.config.batch_size * self.config.gradient_accumulation * self.world
        return length_grouped_batches(lengths, size, self.config.seed + epoch)

    def _accumulate(self, group: list[int]) -> tuple[float, int]:
        """Forward/backward over this process's slice of one optimizer step, in micro-batches; the loss is
        the mean over the whole group (all processes), so summed gradients equal one big batch whatever the
        micro-batch size or process count. Returns (loss, tokens of the whole group)."""
        share = math.ceil(len(group) / self.world)
        mine = group[self.rank * share:(self.rank + 1) * share]
        total_loss = 0.0
        for start in range(0, len(mine), self.micro_batch_size):
            indices = mine[start:start + self.micro_batch_size]
            batch = collate([self.train_ids[i] for i in indices], self.pad_id)
            labels = torch.tensor([self.dataset.train.labels[i] for i in indices], device=self.runtime.device)
            with self.runtime.autocast:
                logits = self.model(input_ids=batch["input_ids"].to(self.runtime.device),
                                    attention_mask=batch["attention_mask"].to(self.runtime.device)).logits
            loss = F.cross_entropy(logits.float(), labels, reduction="sum") / len(group)
            loss.backward()
            total_loss += loss.item()
        if not self.sharded:  # FSDP has reduce-scattered them already
            distributed.sum_gradients(self.params)
        return total_loss, sum(len(self.train_ids[i]) for i in group)

    def train_step(self, group: list[int]) -> tuple[float, int]:
        """One optimizer step over one group of example indices: (loss, tokens)."""
        loss, tokens = self._accumulate(group)
        if not math.isfinite(loss):
            raise LoraclsError(f"loss is {loss} at step {self.state.step + 1}: training stopped "
                               f"(best adapter so far kept in {self.run / rundir.ADAPTER}); lower learning_rate")
        if self.config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.config.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, tokens

    # --- validation -------------------------------------------------------------------------------

    def validate(self, step: int) -> None:
        """Rank 0 scores the validation split (every rank runs the forward passes of a sharded model), saves the
        best adapter and a checkpoint; all ranks learn the verdict."""
        state = self.state
        if distributed.is_main() or self.sharded:
            probs = predict_probabilities(self.model, self.validation_ids, self.pad_id, self.config.eval_batch_size, self.runtime)
        if distributed.is_main():
            labels = np.asarray(self.dataset.validation.labels)
            accuracy = float((probs.argmax(axis=1) == labels).mean())
            loss = float(-np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, None)).mean())
            rows = prediction_rows(self.dataset.validation.texts, labels.tolist(), probs, self.dataset.id2label)
            rundir.write_jsonl(self.run / rundir.PREDICTIONS / f"validation_step{step:05d}.jsonl", rows)
        else:
            accuracy, loss = 0.0, 0.0
        accuracy, loss = distributed.broadcast_object((accuracy, loss))
        improved = accuracy > state.best_accuracy or (accuracy == state.best_accuracy and loss < state.best_loss)
        loss_fell = loss < state.lowest_loss * (1 - LOSS_MIN_GAIN)
        state.lowest_loss = min(state.lowest_loss, loss)
        state.evals_without_gain = 0 if improved or loss_fell else state.evals_without_gain + 1
        if improved:
            state.best_accuracy, state.best_loss, state.best_step = accuracy, loss, step
            state.best_state = distributed.full_copy(self._trainable())
            if distributed.is_main():
                rundir.replace_dir(self.run / rundir.ADAPTER,
                                   lambda directory: self.model.save_pretrained(directory, state_dict=state.best_state))
        self._log_line({"step": step, "validation_accuracy": accuracy, "validation_loss": round(loss, 5),
                        "best": state.best_accuracy, "improved": improved})
        self.log(f"step {step}: validation accuracy {accuracy:.4f}, loss {loss:.4f} "
                 f"(best {state.best_accuracy:.4f} at step {state.best_step})")
        if self.config.patience is not None and state.evals_without_gain >= self.config.patience:
            self.log(f"early stop: {self.config.patience} validations without a better accuracy or a lower loss")
            state.stopped_early = True

    def restore_best(self) -> None:
        self._set_trainable(self.state.best_state)

    def _set_trainable(self, values: dict[str, torch.Tensor]) -> None:
        named = dict(self.model.named_parameters())
        for name, value in values.items():
            distributed.copy_into(named[name], value)

    # --- the loop ---------------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        config, state, device = self.config, self.state, self.runtime.device
        self.log(f"train: {len(self.dataset.train)} examples, {self.steps_per_epoch} optimizer steps/epoch, "
                 f"{self.total_steps} steps (batch {config.batch_size} x accumulation {config.gradient_accumulation}"
                 + (f" x {self.world} processes" if self.world > 1 else "")
                 + f"; micro-batches of {self.micro_batch_size}"
                 + (f"; {self.attention} attention" if self.attention else "") + ")")
        self.model.train()
        window = state.window
        start = time.perf_counter()
        progress = tqdm(total=self.total_steps, initial=state.step, desc="train", unit="step", dynamic_ncols=True,
                        mininterval=2.0, disable=not distributed.is_main())
        while state.step < self.total_steps and not state.stopped_early:
            groups = self._step_groups(state.epoch)
            while state.group < len(groups) and state.step < self.total_steps and not state.stopped_early:
                step_start = time.perf_counter()
                try:
                    loss, tokens = self.train_step(groups[state.group])
                except LoraclsError:
                    progress.close()
                    raise
                state.group += 1
                state.step += 1
                seconds = time.perf_counter() - step_start
                state.train_seconds += seconds
                state.train_tokens += tokens
                for key, value in (("loss", loss), ("tokens", tokens), ("steps", 1), ("seconds", seconds)):
                    window[key] += value
                progress.update(1)
                if state.step % config.log_every == 0 or state.step == self.total_steps:
                    self._log_window(window, device, progress)
                if state.step % config.eval_every == 0 or state.step == self.total_steps:
                    self.validate(state.step)
                    self.save_checkpoint()
            if state.group >= len(groups):
                state.epoch, state.group = state.epoch + 1, 0
        progress.close()
        distributed.barrier()
        self.restore_best()
        return TrainResult(state.step, state.best_step, state.best_accuracy, state.stopped_early,
                           time.perf_counter() - start, state.train_tokens,
                           state.train_tokens / max(state.train_seconds, 1e-9))

    def _log_window(self, window: dict, device, progress) -> None:
        loss_total = distributed.sum_scalar(window["loss"])  # each process holds its slice's share
        record = {"step": self.state.step, "epoch": round(self.state.step / self.steps_per_epoch, 3),
                  "loss": round(loss_total / window["steps"], 5),
                  "lr": self.scheduler.get_last_lr()[0], "memory_mb": round(memory_mb(device), 1),
                  "tokens_per_second": round(window["tokens"] / max(window["seconds"], 1e-9), 1)}
        self._log_line(record)
        progress.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_second']:.0f}")
        self.log(f"step {record['step']}/{self.total_steps} loss {record['loss']:.4f} lr {record['lr']:.2e} "
                 f"mem {record['memory_mb']:.0f}MB {record['tokens_per_second']:.0f} tok/s")
        window.update(loss=0.0, tokens=0, steps=0, seconds=0.0)
