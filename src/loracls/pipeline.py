"""The main job, stage by stage: config -> data -> model -> lora -> train -> evaluate -> export -> metrics.

Every input check (config, data, model, LoRA targets) runs before the run directory is created, so bad
input leaves nothing behind.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from peft import PeftModel

from loracls import distributed, rundir
from loracls.config import Config
from loracls.data import Dataset, encode, format_counts, labelled_split, load_dataset, read_table
from loracls.baseline import prompt_setup, run_baseline
from loracls.doctor import FAIL, check_arch, gather_facts, require_bitsandbytes
from loracls.env import backend_name, environment_record, precision_reason, setup_runtime
from loracls.errors import LoraclsError
from loracls.evaluate import classification_metrics, format_metrics, predict_probabilities, prediction_rows
from loracls.export import export_merged
from loracls.lora import apply_lora
from loracls.model import load_classifier, load_tokenizer, resolve_model_dir
from loracls.train import Trainer


def check_memory_savers(config: Config, runtime) -> None:
    """8-bit optimizers and QLoRA need bitsandbytes on a GPU: refuse them clearly anywhere else."""
    backend = backend_name() if runtime.device.type == "cuda" else runtime.device.type
    if config.optimizer == "adamw_8bit":
        require_bitsandbytes("optimizer adamw_8bit", backend)
    if config.quantization != "none":
        require_bitsandbytes(f"quantization {config.quantization} (QLoRA)", backend)


def check_gpu_arch(runtime) -> None:
    """A torch build without kernels for this GPU fails late and obscurely: refuse up front with the fix."""
    if runtime.device.type != "cuda":
        return
    check = check_arch(gather_facts())
    if check.status == FAIL:
        raise LoraclsError(f"GPU arch: {check.detail}")


def _quiet(*_args, **_kwargs) -> None:
    pass


def _prepare_run(config: Config, runtime, dataset: Dataset, resume: Path | None) -> Path:
    """A new run directory with its config, env and labels (rank 0 writes; all ranks get the path)."""
    if resume is not None:
        return resume
    run = None
    if distributed.is_main():
        run = rundir.new_run_dir(config.output_dir, config.run_name)
        rundir.write_yaml(run / rundir.CONFIG, config.to_dict())
        rundir.write_json(run / rundir.ENV, environment_record(runtime))
        rundir.write_json(run / rundir.LABELS, {str(i): name for i, name in dataset.id2label.items()})
    return distributed.broadcast_object(run)


def train(config: Config | None, log=print, resume: str | None = None) -> Path:
    """The main job. With `resume`, the run directory's own config and checkpoint are used."""
    started = time.perf_counter()
    distributed.init_from_environment()
    log = log if distributed.is_main() else _quiet
    resume_dir = rundir.check_resumable(resume) if resume else None
    if resume_dir is not None:
        config = rundir.read_config(resume_dir)
    runtime = setup_runtime(config.device, config.precision, config.threads)
    runtime.device = distributed.local_device(runtime.device)
    check_memory_savers(config, runtime)
    check_gpu_arch(runtime)
    dataset = load_dataset(config)
    log("data: class counts\n" + format_counts(dataset))
    if config.baseline:
        prompt_setup(config, dataset.id2label)  # refuse a bad prompt before anything is written
    model_dir = resolve_model_dir(config.model, log)
    torch.manual_seed(config.seed)  # head init, LoRA init and dropout follow the seed
    loaded = load_classifier(model_dir, dataset.id2label, log=log, quantization=config.quantization)
    peft_model, lora_report = apply_lora(loaded.model, config.r, config.lora_alpha, config.lora_dropout,
                                         config.target_modules, log)
    if config.quantization == "none":
        peft_model.to(runtime.device)
    if config.data_parallel == "fsdp" and distributed.world_size() > 1:
        units = distributed.shard_model(peft_model)
        log(f"fsdp: weights sharded over {distributed.world_size()} processes in {units} units")
    log(f"runtime: device {runtime.device}, precision {precision_reason(runtime, config.precision)}")

    run = _prepare_run(config, runtime, dataset, resume_dir)
    log(f"run directory: {run}")
    baseline = None
    if config.baseline and distributed.is_main():
        if (run / rundir.BASELINE).is_file():
            baseline = rundir.read_json(run / rundir.BASELINE)
        else:
            baseline, plain, _ = run_baseline(model_dir, loaded.tokenizer, dataset.test.texts, dataset.test.labels,
                                              dataset.id2label, config, runtime, log)
            rundir.write_jsonl(run / rundir.PREDICTIONS / "baseline_test.jsonl",
                               prediction_rows(dataset.test.texts, dataset.test.labels, plain, dataset.id2label))
            rundir.write_json(run / rundir.BASELINE, baseline)
    distributed.barrier()

    trainer = Trainer(peft_model, loaded.tokenizer, dataset, config, runtime, run, log)
    if resume_dir is not None:
        trainer.load_checkpoint()
    result = trainer.fit()
    test_ids = encode(loaded.tokenizer, dataset.test.texts, config.max_length, config.input_template)
    if distributed.is_sharded(peft_model) or distributed.is_main():  # a sharded forward needs every process
        probs = predict_probabilities(peft_model, test_ids, loaded.tokenizer.pad_token_id, config.eval_batch_size, runtime)
    if not distributed.is_main():
        return run
    log(f"train: {result.steps} steps in {result.seconds:.0f}s, {result.tokens_per_second:.0f} train tokens/s; "
        f"best validation accuracy {result.best_validation_accuracy:.4f} at step {result.best_step}")

    test_metrics = classification_metrics(dataset.test.labels, probs, dataset.id2label)
    rundir.write_jsonl(run / rundir.PREDICTIONS / "test.jsonl",
                       prediction_rows(dataset.test.texts, dataset.test.labels, probs, dataset.id2label))
    log("test:\n" + format_metrics(test_metrics))
    hidden_size, parameters = loaded.hidden_size, loaded.parameters
    del peft_model, loaded  # the export starts from the saved adapter

    export_check = None
    if config.merge:
        export_check = export_merged(run, model_dir, dataset.id2label, test_ids, config.eval_batch_size, runtime, log,
                                     config.input_template)
    metrics = {
        "test": test_metrics,
        "baseline": None if baseline is None else {"zero_shot_accuracy": baseline["zero_shot"]["accuracy"],
                                                   "calibrated_accuracy": baseline["calibrated"]["accuracy"]},
        "validation": {"best_accuracy": result.best_validation_accuracy, "best_step": result.best_step},
        "train": {"steps": result.steps, "stopped_early": result.stopped_early, "seconds": round(result.seconds, 1),
                  "train_tokens": result.train_tokens, "tokens_per_second": round(result.tokens_per_second, 1)},
        "model": {"source": config.model, "directory": str(model_dir), "hidden_size": hidden_size,
                  "parameters": parameters, "trainable_parameters": lora_report.trainable,
                  "lora_modules": len(lora_report.matched)},
        "data": dataset.class_counts(),
        "export": export_check,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    rundir.write_json(run / rundir.METRICS, metrics)
    (run / rundir.CHECKPOINT).unlink(missing_ok=True)  # finished: nothing left to resume
    if baseline is not None:
        log(f"side by side on the test split: zero-shot {baseline['zero_shot']['accuracy']:.4f}, "
            f"calibrated {baseline['calibrated']['accuracy']:.4f} -> LoRA {test_metrics['accuracy']:.4f}")
    log(f"done in {metrics['wall_seconds']:.0f}s: test accuracy {test_metrics['accuracy']:.4f}; metrics in {run / rundir.METRICS}")
    return run


def baseline(config: Config, log=print) -> dict:
    """`loracls baseline`: the zero-shot baseline alone, on the same test split `train` would use."""
    runtime = setup_runtime(config.device, config.precision, config.threads)
    dataset = load_dataset(config)
    prompt_setup(config, dataset.id2label)
    model_dir = resolve_model_dir(config.model, log)
    result, _, _ = run_baseline(model_dir, load_tokenizer(model_dir, log), dataset.test.texts, dataset.test.labels,
                                dataset.id2label, config, runtime, log)
    return result


# --- using a finished run -------------------------------------------------------------------------


class LoadedRun:
    """A run directory reloaded: base model + saved adapter (and head), ready to predict."""

    def __init__(self, path: str, log=print):
        self.path = rundir.check_run_dir(path)
        self.config = rundir.read_config(self.path)
        self.id2label = {int(i): name for i, name in rundir.read_json(self.path / rundir.LABELS).items()}
        self.runtime = setup_runtime(self.config.device, self.config.precision, self.config.threads)
        loaded = load_classifier(resolve_model_dir(self.config.model, log), self.id2label, log=log)
        self.tokenizer = loaded.tokenizer
        self.model = PeftModel.from_pretrained(loaded.model, str(self.path / rundir.ADAPTER)).to(self.runtime.device)
        self.model.eval()

    def probabilities(self, texts: list[str]) -> np.ndarray:
        ids = encode(self.tokenizer, texts, self.config.max_length, self.config.input_template)
        return predict_probabilities(self.model, ids, self.tokenizer.pad_token_id, self.config.eval_batch_size, self.runtime)


def evaluate(run_path: str, data: str | None = None, log=print) -> dict:
    """Metrics of a run on its own test split, or on another labelled file with the run's columns."""
    run = LoadedRun(run_path, log)
    if data is None:
        split = load_dataset(run.config).test
        texts, labels = split.texts, split.labels
    else:
        label2id = {name: i for i, name in run.id2label.items()}
        split = labelled_split(read_table(data), run.config, label2id, data)
        texts, labels = split.texts, split.labels
    probs = run.probabilities(texts)
    metrics = classification_metrics(labels, probs, run.id2label)
    log(format_metrics(metrics))
    return metrics


def read_texts(file: str, text_column: str) -> list[str]:
    path = Path(file)
    if path.suffix.lower() == ".txt":
        if not path.is_file():
            raise LoraclsError(f"file not found: {file}")
        return [line for line in path.read_text().splitlines() if line.strip()]
    frame = read_table(file)
    column = text_column if text_column in frame.columns else "text"
    if column not in frame.columns:
        raise LoraclsError(f"{file}: no column {text_column!r} or 'text'")
    return frame[column].astype(str).tolist()


def predict(run_path: str, texts: list[str], log=print) -> list[dict]:
    if not texts:
        raise LoraclsError("predict: no texts given")
    if any(not t.strip() for t in texts):
        raise LoraclsError("predict: empty text given")
    run = LoadedRun(run_path, log)
    return prediction_rows(texts, None, run.probabilities(texts), run.id2label)
