"""Training stage: an explicit torch loop (AdamW, warmup + cosine, accumulation, clipping, validation).

Every `log_every` optimizer steps one JSON line (loss, lr, memory, tokens/s); every `eval_every` steps a
validation pass writes its predictions JSONL and keeps the best adapter by validation accuracy; `patience`
validations without improvement stop the run.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import get_scheduler

from loracls import rundir
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


def plan_steps(num_examples: int, config: Config) -> tuple[int, int]:
    """(optimizer steps per epoch, total optimizer steps)."""
    batches = math.ceil(num_examples / config.batch_size)
    per_epoch = math.ceil(batches / config.gradient_accumulation)
    total = per_epoch * config.epochs
    return per_epoch, min(total, config.max_steps) if config.max_steps else total


class Trainer:
    def __init__(self, model, tokenizer, dataset: Dataset, config: Config, runtime, run: Path, log=print):
        self.model, self.tokenizer, self.dataset = model, tokenizer, dataset
        self.config, self.runtime, self.run, self.log = config, runtime, run, log
        self.pad_id = tokenizer.pad_token_id
        self.train_ids = self._encode(dataset.train.texts)
        self.validation_ids = self._encode(dataset.validation.texts)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.params, config)
        self.steps_per_epoch, self.total_steps = plan_steps(len(dataset.train), config)
        self.scheduler = get_scheduler(config.scheduler if config.scheduler != "constant" else "constant_with_warmup",
                                       self.optimizer, num_warmup_steps=config.warmup_steps,
                                       num_training_steps=self.total_steps)
        self.best_accuracy, self.best_step, self.best_state = -1.0, 0, None
        self.evals_without_gain = 0

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return encode(self.tokenizer, texts, self.config.max_length)

    def _micro_batches(self, epoch: int) -> list[list[int]]:
        lengths = [len(x) for x in self.train_ids]
        return length_grouped_batches(lengths, self.config.batch_size, self.config.seed + epoch)

    def _accumulate(self, group: list[list[int]]) -> tuple[float, int]:
        """Forward/backward over one accumulation group; loss weighted per example. Returns (loss, tokens)."""
        examples = sum(len(b) for b in group)
        total_loss, tokens = 0.0, 0
        for indices in group:
            batch = collate([self.train_ids[i] for i in indices], self.pad_id)
            labels = torch.tensor([self.dataset.train.labels[i] for i in indices], device=self.runtime.device)
            with self.runtime.autocast:
                logits = self.model(input_ids=batch["input_ids"].to(self.runtime.device),
                                    attention_mask=batch["attention_mask"].to(self.runtime.device)).logits
            loss = F.cross_entropy(logits.float(), labels, reduction="sum") / examples
            loss.backward()
            total_loss += loss.item()
            tokens += int(batch["attention_mask"].sum())
        return total_loss, tokens

    def validate(self, step: int) -> float:
        probs = predict_probabilities(self.model, self.validation_ids, self.pad_id, self.config.eval_batch_size, self.runtime)
        labels = self.dataset.validation.labels
        accuracy = float((probs.argmax(axis=1) == torch.tensor(labels).numpy()).mean())
        rows = prediction_rows(self.dataset.validation.texts, labels, probs, self.dataset.id2label)
        rundir.write_jsonl(self.run / rundir.PREDICTIONS / f"validation_step{step:05d}.jsonl", rows)
        improved = accuracy > self.best_accuracy
        if improved:
            self.best_accuracy, self.best_step = accuracy, step
            self.best_state = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
            rundir.replace_dir(self.run / rundir.ADAPTER, self.model.save_pretrained)
            self.evals_without_gain = 0
        else:
            self.evals_without_gain += 1
        rundir.append_jsonl(self.run / rundir.TRAIN_LOG, {"step": step, "validation_accuracy": accuracy,
                                                          "best": self.best_accuracy, "improved": improved})
        self.log(f"step {step}: validation accuracy {accuracy:.4f} (best {self.best_accuracy:.4f} at step {self.best_step})")
        return accuracy

    def restore_best(self) -> None:
        if self.best_state is not None:
            named = dict(self.model.named_parameters())
            with torch.no_grad():
                for name, value in self.best_state.items():
                    named[name].copy_(value)

    def fit(self) -> TrainResult:
        config, device = self.config, self.runtime.device
        self.log(f"train: {len(self.dataset.train)} examples, {self.steps_per_epoch} optimizer steps/epoch, "
                 f"{self.total_steps} steps (batch {config.batch_size} x accumulation {config.gradient_accumulation})")
        self.model.train()
        step, evaluated_at, stopped_early = 0, -1, False
        window_loss, window_tokens, window_steps, window_seconds = 0.0, 0, 0, 0.0
        all_tokens, train_seconds, start = 0, 0.0, time.perf_counter()
        progress = tqdm(total=self.total_steps, desc="train", unit="step", dynamic_ncols=True, mininterval=2.0)
        epoch = 0
        while step < self.total_steps and not stopped_early:
            batches = self._micro_batches(epoch)
            for g in range(0, len(batches), config.gradient_accumulation):
                step_start = time.perf_counter()
                loss, tokens = self._accumulate(batches[g:g + config.gradient_accumulation])
                if not math.isfinite(loss):
                    progress.close()
                    raise LoraclsError(f"loss is {loss} at step {step + 1}: training stopped "
                                       f"(best adapter so far kept in {self.run / rundir.ADAPTER}); lower learning_rate")
                if config.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.params, config.max_grad_norm)
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
                step += 1
                step_seconds = time.perf_counter() - step_start
                train_seconds += step_seconds
                window_seconds += step_seconds
                window_loss, window_tokens, window_steps = window_loss + loss, window_tokens + tokens, window_steps + 1
                all_tokens += tokens
                progress.update(1)
                if step % config.log_every == 0 or step == self.total_steps:
                    record = {"step": step, "epoch": round(step / self.steps_per_epoch, 3),
                              "loss": round(window_loss / window_steps, 5),
                              "lr": self.scheduler.get_last_lr()[0], "memory_mb": round(memory_mb(device), 1),
                              "tokens_per_second": round(window_tokens / max(window_seconds, 1e-9), 1)}
                    rundir.append_jsonl(self.run / rundir.TRAIN_LOG, record)
                    progress.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_second']:.0f}")
                    self.log(f"step {step}/{self.total_steps} loss {record['loss']:.4f} lr {record['lr']:.2e} "
                                   f"mem {record['memory_mb']:.0f}MB {record['tokens_per_second']:.0f} tok/s")
                    window_loss, window_tokens, window_steps, window_seconds = 0.0, 0, 0, 0.0
                if step % config.eval_every == 0 or step == self.total_steps:
                    self.validate(step)
                    evaluated_at = step
                    if config.patience is not None and self.evals_without_gain >= config.patience:
                        self.log(f"early stop: {config.patience} validations without improvement")
                        stopped_early = True
                if step >= self.total_steps or stopped_early:
                    break
            epoch += 1
        progress.close()
        if evaluated_at != step:
            self.validate(step)
        seconds = time.perf_counter() - start
        self.restore_best()
        return TrainResult(step, self.best_step, self.best_accuracy, stopped_early, seconds, all_tokens,
                           all_tokens / max(train_seconds, 1e-9))
