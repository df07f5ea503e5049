"""Many runs, one base model: `loracls serve RUN1 RUN2 ...` loads the base decoder once and each run's LoRA
unmerged beside it (PEFT adapters named after the runs), with each run's own classification head.

A batch may mix runs: PEFT's mixed-adapter forward (`adapter_names`, one name per row) runs the shared
decoder once with each row's LoRA, the pooled hidden state (transformers' last-non-pad-token pooling: the
base's head is swapped for an identity) then goes through its run's head. Each run answers as its own
single-run server does, within floating-point tolerance (a merged weight vs base + LoRA; tested)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from loracls import runs
from loracls.data.batching import collate, sorted_batches
from loracls.errors import Log, LoraclsError, first_line
from loracls.hardware import setup_runtime
from loracls.inference.engine import RunFormat
from loracls.model.classifier import HeadSpec, load_classifier
from loracls.model.lora import head_name
from loracls.model.source import resolve_model_dir
from loracls.model.speedups import store_frozen_linears_in
from loracls.problems import problem_for

__all__ = ["AdapterSet", "AdapterRun"]

ADAPTER_WEIGHTS = "adapter_model.safetensors"


class AdapterRun(RunFormat):
    """One run of an AdapterSet, with what the server needs of a classifier (labels, input format,
    decision); its logits come from the set's shared model."""

    def __init__(self, run: Path, config, adapters: AdapterSet):
        self.name, self.id2label, self.decision = run.name, runs.read_labels(run), runs.read_decision(run)
        self.max_length, self.input_template = config.max_length, config.input_template
        self.long_text, self.chunk_stride = config.long_text, config.chunk_stride
        self.tokenizer, self.runtime, self._adapters = adapters.tokenizer, adapters.runtime, adapters
        self.source = f"{config.model} + {run / runs.ADAPTER} (unmerged, one of {len(adapters.paths)} runs)"
        self._setup_format(run)

    def logits(self, ids: list[list[int]], progress: bool = False, max_tokens: int | None = None) -> np.ndarray:
        rows = self._adapters.logits(ids, [self.name] * len(ids), max_tokens)
        return np.stack(rows) if rows else np.zeros((0, len(self.labels)), dtype=np.float32)


def _checked_runs(paths: list[str], log) -> list[tuple[Path, object]]:
    """(run, config) for each path: finished classification runs with an adapter, distinct names, one base."""
    found = []
    for path in paths:
        run = runs.check_run_dir(path)
        config = runs.read_config(run)
        if problem_for(config.problem).scorer != "head":
            raise LoraclsError(f"serve: {run} is a {config.problem} run; such runs are served alone")
        if not (run / runs.ADAPTER / ADAPTER_WEIGHTS).is_file():
            raise LoraclsError(
                f"serve: {run} has no {runs.ADAPTER}/{ADAPTER_WEIGHTS}; several runs are served unmerged"
            )
        found.append((run, config))
    names = [run.name for run, _ in found]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise LoraclsError(f"serve: two runs are named {repeated[0]!r}; the `model` field picks a run by its name")
    bases = {run.name: resolve_model_dir(config.model, log).resolve() for run, config in found}
    if len(set(bases.values())) > 1:
        shown = ", ".join(f"{name}: {base}" for name, base in bases.items())
        raise LoraclsError(f"serve: the runs do not share one base model ({shown}); serve them separately")
    heads = {run.name: (HeadSpec.of(config).pooling, HeadSpec.of(config).bidirectional) for run, config in found}
    if len(set(heads.values())) > 1:
        shown = ", ".join(f"{name}: pooling {pool}, bidirectional {both}" for name, (pool, both) in heads.items())
        raise LoraclsError(f"serve: the runs do not read the decoder the same way ({shown}); serve them separately")
    return found


def _split_head(state: dict[str, torch.Tensor], head: str) -> tuple[dict, dict]:
    """(LoRA weights, head weights) of a saved classifier adapter; the head's saved under modules_to_save."""
    marker = f".{head}."
    lora = {key: value for key, value in state.items() if marker not in f".{key}"}
    head_state = {key.split(marker)[-1]: value for key, value in state.items() if marker in f".{key}"}
    return lora, head_state


def _head_module(head_state: dict[str, torch.Tensor], run: Path, hidden: int) -> nn.Linear:
    weight = head_state.get("weight")
    if weight is None or weight.ndim != 2 or weight.shape[1] != hidden:
        raise LoraclsError(f"serve: {run / runs.ADAPTER} holds no classification head for hidden size {hidden}")
    linear = nn.Linear(hidden, weight.shape[0], bias="bias" in head_state)
    linear.load_state_dict(head_state)
    return linear.requires_grad_(False)


class AdapterSet:
    """The runs of `paths` on their shared base: `runs` maps each run's name to its AdapterRun."""

    def __init__(
        self,
        paths: list[str],
        log: Log = print,
        batch_size: int | None = None,
        device: str | None = None,
        precision: str | None = None,
    ):
        found = _checked_runs(paths, log)
        first = found[0][1]
        self.paths = [str(run) for run, _ in found]
        self.runtime = setup_runtime(device or first.device, precision or first.precision, first.threads)
        self.batch_size = batch_size or first.eval_batch_size
        loaded = load_classifier(
            resolve_model_dir(first.model, log), {0: "a", 1: "b"}, log=log, head=HeadSpec.of(first)
        )
        self.tokenizer, self.pad_id = loaded.tokenizer, loaded.tokenizer.pad_token_id
        head = head_name(loaded.model)
        setattr(loaded.model, head, nn.Identity())  # the model's "logits" are then the pooled hidden states
        self.model, self.heads = self._load_adapters(loaded.model, found, head, loaded.hidden_size)
        self.model.requires_grad_(False)
        store_frozen_linears_in(self.model, self.runtime.dtype)
        for linear in self.heads.values():
            store_frozen_linears_in(linear, self.runtime.dtype)
        self.model.to(self.runtime.device).eval()
        self.heads = nn.ModuleDict(self.heads).to(self.runtime.device)
        self.runs = {run.name: AdapterRun(run, config, self) for run, config in found}
        log(f"serve: {len(self.runs)} runs on one {first.model}: {', '.join(self.runs)} (LoRA unmerged)")

    @staticmethod
    def _load_adapters(model, found, head: str, hidden: int):
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
        from safetensors.torch import load_file

        peft_model, heads = None, {}
        for run, _ in found:
            directory = run / runs.ADAPTER
            try:
                config = LoraConfig.from_pretrained(str(directory))
                lora, head_state = _split_head(load_file(str(directory / ADAPTER_WEIGHTS)), head)
            except Exception as exc:  # a damaged or foreign adapter directory
                raise LoraclsError(f"serve: cannot read the adapter in {directory}: {first_line(exc, 200)}") from None
            config.modules_to_save, config.task_type, config.inference_mode = None, None, True
            if peft_model is None:
                peft_model = get_peft_model(model, config, adapter_name=run.name)
            else:
                peft_model.add_adapter(run.name, config)
            result = set_peft_model_state_dict(peft_model, lora, adapter_name=run.name)
            if result.unexpected_keys:
                raise LoraclsError(
                    f"serve: the adapter in {directory} does not fit the base model "
                    f"({len(result.unexpected_keys)} weights unused, e.g. {result.unexpected_keys[0]})"
                )
            heads[run.name] = _head_module(head_state, run, hidden)
        return peft_model, heads

    writes_comments = False

    def served_runs(self) -> dict:
        return dict(self.runs)

    def score(self, ids: list[list[int]], models: list[str], max_tokens: int | None = None) -> list[np.ndarray]:
        return self.logits(ids, models, max_tokens)

    @torch.inference_mode()
    def logits(self, ids: list[list[int]], models: list[str], max_tokens: int | None = None) -> list[np.ndarray]:
        """One logits row per input row, computed by the run named beside it; runs mix in length-sorted
        batches (PEFT's adapter_names), each row then through its run's head."""
        out: list[np.ndarray] = [np.zeros(0)] * len(ids)
        for batch in sorted_batches([len(x) for x in ids], self.batch_size, max_tokens):
            padded = collate([ids[i] for i in batch], self.pad_id)
            names = [models[i] for i in batch]
            with self.runtime.autocast:
                pooled = self.model(
                    input_ids=padded["input_ids"].to(self.runtime.device),
                    attention_mask=padded["attention_mask"].to(self.runtime.device),
                    adapter_names=names,
                ).logits
                for name in dict.fromkeys(names):
                    rows = [k for k, row_name in enumerate(names) if row_name == name]
                    scores = self.heads[name](pooled[rows]).float().cpu().numpy()
                    for k, row in zip(rows, scores):
                        out[batch[k]] = row
        return out
