"""One bench recipe, run in a worker process of its own (so its peak memory is its own): our train step,
the seed's recipe, or HF Trainer + PEFT (steps, or a whole job). `python benchmarks/bench_recipes.py
RECIPE STEPS CONFIG_JSON` prints the result as one JSON line. Uses loracls' public entry points only."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from loracls.config import Config
from loracls.config_reader import from_dict
from loracls.hardware import peak_flops
from loracls.training.mfu import mfu, train_flops_per_token


def _setup(config: Config, ours: bool = True):
    """Model, data and runtime for one recipe; the other recipes get plain PEFT (its own dropout)."""
    from loracls.data.spec import DataSpec
    from loracls.data.splits import load_dataset
    from loracls.hardware import setup_runtime
    from loracls.model.classifier import load_classifier
    from loracls.model.lora import LoraSpec, apply_lora
    from loracls.model.source import resolve_model_dir

    runtime = setup_runtime(config.device, config.precision, config.threads)
    dataset = load_dataset(DataSpec.of(config))
    torch.manual_seed(config.seed)
    loaded = load_classifier(resolve_model_dir(config.model, lambda *a: None), dataset.id2label, log=lambda *a: None)
    peft_model, _ = apply_lora(
        loaded.model,
        LoraSpec.of(config),
        lambda *a: None,
        cheap_dropout=ours,
    )
    return runtime, dataset, loaded, peft_model.to(runtime.device)


def _step_groups(config: Config, lengths: list[int], steps: int, grouped: bool) -> list[list[int]]:
    from loracls.data.batching import length_grouped_batches

    size = config.batch_size * config.gradient_accumulation
    if grouped:
        # the first batch is the longest and the untimed warm-up, as in a real run (and in HF Trainer's
        # sampler): it touches the memory later steps reuse, so timed steps pay no first-touch page faults
        return length_grouped_batches(lengths, size, config.seed)[: steps + 1]
    import random

    order = list(range(len(lengths)))
    random.Random(config.seed).shuffle(order)
    return [order[i * size : (i + 1) * size] for i in range(steps + 1)]


def _our_loop(config, runtime, peft_model, tokenizer, dataset, groups) -> dict:
    """Our real train step (`Trainer.train_step`); the first step is a warm-up and is not timed."""
    import tempfile

    from loracls.data.batching import TextEncoder
    from loracls.model.speedups import apply_speedups
    from loracls.training.logger import RunLogger
    from loracls.training.loop import Trainer, TrainSet

    apply_speedups(peft_model, runtime, config.quantization != "none", False)  # as the job's prepare phase does
    train = TextEncoder.for_config(config, tokenizer).encode(dataset.train.texts)
    labels = [dataset.train.labels[i] for i in train.owner]
    train_set = TrainSet(train.ids, labels, len(dataset.id2label), tokenizer.pad_token_id, dataset.kind)
    with tempfile.TemporaryDirectory() as scratch:
        quiet = RunLogger(Path(scratch), lambda *a: None)
        trainer = Trainer(peft_model, train_set, lambda model: None, config, runtime, quiet)
        peft_model.train()
        seconds, tokens = 0.0, 0
        for n, group in enumerate(groups):
            start = time.perf_counter()
            _, group_tokens = trainer.train_step(group)
            if n > 0:
                seconds += time.perf_counter() - start
                tokens += group_tokens
    return {"seconds": seconds, "tokens": tokens, "steps": len(groups) - 1}


def _seed_loop(config, runtime, peft_model, ids, labels, groups) -> dict:
    """The seed's plain loop: every sequence padded to max_length, accumulation as separate passes of
    batch_size; the first step is a warm-up and is not timed."""
    import torch.nn.functional as F

    from loracls.data.batching import collate

    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    peft_model.train()
    seconds, tokens = 0.0, 0
    for n, group in enumerate(groups):
        start = time.perf_counter()
        for s in range(0, len(group), config.batch_size):
            chunk = group[s : s + config.batch_size]
            batch = collate([ids[i] for i in chunk], peft_model.config.pad_token_id)
            width = config.max_length - batch["input_ids"].shape[1]
            batch = {
                k: F.pad(v, (0, width), value=peft_model.config.pad_token_id if k == "input_ids" else 0)
                for k, v in batch.items()
            }
            with runtime.autocast:
                logits = peft_model(**{k: v.to(runtime.device) for k, v in batch.items()}).logits
            target = torch.tensor([labels[i] for i in chunk], device=runtime.device)
            (F.cross_entropy(logits.float(), target, reduction="sum") / len(group)).backward()
        torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if n > 0:
            seconds += time.perf_counter() - start
            tokens += sum(len(ids[i]) for i in group)
    return {"seconds": seconds, "tokens": tokens, "steps": len(groups) - 1}


def _trainer_examples(ids: list[list[int]], labels: list[int]) -> list[dict]:
    return [{"input_ids": x, "attention_mask": [1] * len(x), "labels": y} for x, y in zip(ids, labels)]


def _trainer_arguments(config: Config, runtime, **job):
    """TrainingArguments for (b): our batch / accumulation / optimizer / precision / seed, group_by_length."""
    from transformers import TrainingArguments

    return TrainingArguments(
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        **_group_by_length(TrainingArguments),
        bf16=runtime.dtype == torch.bfloat16,
        fp16=runtime.dtype == torch.float16,
        use_cpu=runtime.device.type == "cpu",
        report_to=[],
        logging_strategy="no",
        dataloader_num_workers=0,
        seed=config.seed,
        disable_tqdm=True,
        **job,
    )


def _trainer_loop(config, runtime, peft_model, tokenizer, ids, labels, groups) -> dict:
    """HF Trainer + PEFT, group_by_length, same batch / accumulation / lr / precision. A step is timed from
    the end of the one before (so its batch fetching and collation count, as in our loop), the first step
    is a warm-up; tokens are the real tokens of the batches it trained on, counted by its collator."""
    from transformers import DataCollatorWithPadding, Trainer, TrainerCallback

    order = [i for g in groups for i in g]
    examples = _trainer_examples([ids[i] for i in order], [labels[i] for i in order])
    padding = DataCollatorWithPadding(tokenizer)
    batch_tokens: list[int] = []  # in the order the Trainer draws its batches

    def counting_collator(features):
        batch_tokens.append(sum(len(f["input_ids"]) for f in features))
        return padding(features)

    step_ends: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())

    args = _trainer_arguments(
        config,
        runtime,
        output_dir=os.environ.get("LORACLS_BENCH_TMP", "/tmp/loracls-bench-trainer"),
        max_steps=len(groups),
        save_strategy="no",
    )
    trainer = Trainer(
        model=peft_model, args=args, train_dataset=examples, data_collator=counting_collator, callbacks=[StepTimer()]
    )
    trainer.train()
    accumulation = config.gradient_accumulation
    timed_steps = len(step_ends) - 1
    tokens = sum(batch_tokens[accumulation : accumulation * (timed_steps + 1)])
    return {"seconds": step_ends[-1] - step_ends[0], "tokens": tokens, "steps": timed_steps}


def _group_by_length(arguments_class) -> dict:
    """transformers 5 spells it train_sampling_strategy="group_by_length"; 4.x had group_by_length=True."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(arguments_class)}
    return (
        {"train_sampling_strategy": "group_by_length"}
        if "train_sampling_strategy" in names
        else {"group_by_length": True}
    )


@dataclass
class RecipeTiming:
    """One recipe's timed steps: the bench report's row (bench.json `recipes`)."""

    recipe: str
    precision: str
    attention: str
    steps: int
    seconds: float
    tokens: int
    tokens_per_second: float  # real tokens, padding not counted
    seconds_per_step: float
    flops_per_token: int
    mean_tokens_per_example: float
    peak_rss_mb: float
    peak_flops: float | None  # None where the device's peak is not known
    mfu: float | None
    gpu_peak_memory_mb: float | None = None


def run_recipe(recipe: str, config: Config, steps: int) -> dict:
    """Worker: time `steps` optimizer steps of one recipe and return the numbers."""
    from loracls.data.batching import encode

    if recipe == "seed":
        config = from_dict({"precision": "fp32"}, base=config)
    runtime, dataset, loaded, peft_model = _setup(config, ours=recipe == "loracls")
    if recipe == "hf_trainer_eager":
        loaded.model.set_attn_implementation("eager")
    ids = encode(loaded.tokenizer, dataset.train.texts, config.max_length, config.input_template)
    lengths = [len(x) for x in ids]
    groups = _step_groups(config, lengths, steps, grouped=recipe != "seed")
    if recipe == "loracls":
        timing = _our_loop(config, runtime, peft_model, loaded.tokenizer, dataset, groups)
    elif recipe == "seed":
        timing = _seed_loop(config, runtime, peft_model, ids, dataset.train.labels, groups)
    else:
        timing = _trainer_loop(config, runtime, peft_model, loaded.tokenizer, ids, dataset.train.labels, groups)
    per_token = train_flops_per_token(loaded.model)
    tokens_per_second = timing["tokens"] / max(timing["seconds"], 1e-9)
    import resource

    peak = peak_flops(runtime)
    cuda = runtime.device.type == "cuda"
    return asdict(
        RecipeTiming(
            recipe=recipe,
            precision=str(runtime.dtype).replace("torch.", ""),
            attention=loaded.model.config._attn_implementation,
            steps=timing["steps"],
            seconds=timing["seconds"],
            tokens=timing["tokens"],
            tokens_per_second=tokens_per_second,
            seconds_per_step=timing["seconds"] / max(timing["steps"], 1),
            flops_per_token=per_token,
            mean_tokens_per_example=round(sum(lengths) / len(lengths), 2),
            peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            peak_flops=peak,
            mfu=mfu(tokens_per_second, per_token, peak),
            gpu_peak_memory_mb=round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None,
        )
    )


def run_trainer_job(config: Config) -> dict:
    """(b) as a whole job: HF Trainer + PEFT with group_by_length on our splits; validation every
    `eval_every` steps, the best checkpoint by validation accuracy, early stopping after `patience`
    validations without gain, then test accuracy of the best checkpoint."""
    import resource

    from transformers import DataCollatorWithPadding, EarlyStoppingCallback, Trainer

    from loracls.data.batching import encode

    runtime, dataset, loaded, peft_model = _setup(config, ours=False)

    def examples(split):
        return _trainer_examples(
            encode(loaded.tokenizer, split.texts, config.max_length, config.input_template), split.labels
        )

    def accuracy(prediction) -> dict:
        return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}

    started = time.perf_counter()
    args = _trainer_arguments(
        config,
        runtime,
        output_dir=os.environ.get("LORACLS_BENCH_TMP", "/tmp/loracls-bench-trainer-job"),
        per_device_eval_batch_size=config.eval_batch_size,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps or -1,
        warmup_steps=config.warmup_steps,
        lr_scheduler_type="constant_with_warmup" if config.scheduler == "constant" else config.scheduler,
        eval_strategy="steps",
        eval_steps=config.eval_every,
        save_strategy="steps",
        save_steps=config.eval_every,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        greater_is_better=True,
    )
    trainer = Trainer(
        model=peft_model,
        args=args,
        train_dataset=examples(dataset.train),
        eval_dataset=examples(dataset.validation),
        data_collator=DataCollatorWithPadding(loaded.tokenizer),
        compute_metrics=accuracy,
        callbacks=[EarlyStoppingCallback(config.patience)] if config.patience else [],
    )
    trainer.train()
    train_seconds = time.perf_counter() - started
    test = trainer.predict(examples(dataset.test))
    return {
        "recipe": "hf_trainer",
        "train_seconds": train_seconds,
        "wall_seconds": time.perf_counter() - started,
        "steps": trainer.state.global_step,
        "best_validation_accuracy": trainer.state.best_metric,
        "test_accuracy": accuracy(test)["accuracy"],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


if __name__ == "__main__":  # worker entry: python benchmarks/bench_recipes.py RECIPE STEPS CONFIG_JSON
    import warnings

    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    name, count, raw = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    config = from_dict(json.loads(raw))
    print(json.dumps(run_recipe(name, config, count) if count else run_trainer_job(config)))
