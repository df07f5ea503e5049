"""README.md model cards for what a run hands over: `adapter/` (PEFT), `merged/` (transformers), `student/`
(distill) and `onnx/`. YAML metadata by the hub's conventions (library_name, pipeline_tag, base_model as the
model's real id and never a local path, tags, datasets, a model-index with the test metrics), then the labels,
the data and its splits, the side-by-side table and the verdict, the calibration, and how to load the folder
with transformers, PEFT, onnxruntime and `loracls serve`. Written at the end of `train`, `distill` and
`export`; each card describes its own folder."""

from __future__ import annotations

from pathlib import Path

import yaml

from loracls import files, runs
from loracls.config import EMBEDDED_DATA, EMBEDDED_MODEL, Config

__all__ = ["write_cards", "base_model_id"]

EMBEDDED_BASE = "google/gemma-3-270m"  # the embedded GGUF is this model, quantized (Q4_K_M) and converted back
EMBEDDED_DATASET = "cornell-movie-review-data/rotten_tomatoes"  # the embedded snippets (Pang and Lee, 2005)
ENCODERS = {"minilm": "sentence-transformers/all-MiniLM-L6-v2", "mpnet-base": "sentence-transformers/all-mpnet-base-v2"}


GEMMA_TERMS = "https://ai.google.dev/gemma/terms"
LICENSES_BY_OWNER = {  # the license a base's publisher releases it under, where it is one for all its models
    "google/gemma": "gemma",
    "sentence-transformers/": "apache-2.0",
    "qwen/": "apache-2.0",
    "mistralai/": "apache-2.0",
    "microsoft/phi": "mit",
    "meta-llama/": "llama3.2",
}


def _gguf_field(path: Path, key: str) -> str | None:
    """A string field of a GGUF file's metadata (`general.license`, `general.base_model.0.repo_url`)."""
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(path)).fields.get(key)
        return None if field is None else bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
    except Exception:  # unreadable metadata: the card says less, nothing fails
        return None


def base_model_id(spec: str) -> str | None:
    """The hub id of a model spec: the embedded model's, a GGUF file's own (its metadata's base model), a hub
    id as given; None for a local directory (a path says nothing to a reader)."""
    if spec == EMBEDDED_MODEL:
        return EMBEDDED_BASE
    if spec in ENCODERS:
        return ENCODERS[spec]
    if spec.endswith(".gguf") and Path(spec).is_file():
        url = _gguf_field(Path(spec), "general.base_model.0.repo_url") or ""
        return url.removeprefix("https://huggingface.co/").strip("/") or None
    looks_like_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not Path(spec).exists()
    return spec if looks_like_id else None


def _model_type(spec: str) -> str:
    """A local model directory's model_type ("" where there is none to read)."""
    try:
        import json

        return str(json.loads((Path(spec) / "config.json").read_text()).get("model_type", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def license_of(spec: str, base: str | None) -> str:
    """The license a derivative inherits: a GGUF's own metadata, else the base's publisher's (Gemma: the
    Gemma terms), else "other" (the base's card says which)."""
    if spec.endswith(".gguf") and Path(spec).is_file() and (found := _gguf_field(Path(spec), "general.license")):
        return found.lower()
    key = (base or spec).lower()
    if spec == EMBEDDED_MODEL or "gemma" in key or _model_type(spec).startswith("gemma"):
        return "gemma"
    return next((name for owner, name in LICENSES_BY_OWNER.items() if key.startswith(owner)), "other")


def write_cards(run: Path) -> list[Path]:
    """A card in each of the run's handed-over folders that exist; the paths written."""
    config, metrics = runs.read_config(run), runs.read_metrics(run)
    student = runs.read_student(run) if (run / runs.STUDENT_RECORD).is_file() else None
    written = []
    for folder, kind in ((runs.ADAPTER, "adapter"), (runs.MERGED, "merged"), (runs.STUDENT, "student")):
        if (run / folder).is_dir():
            written.append(_write(run / folder, kind, run, config, metrics, student))
        if (run / folder / "onnx").is_dir():
            written.append(_write(run / folder / "onnx", "onnx", run, config, metrics, student))
    if (run / "onnx").is_dir():
        written.append(_write(run / "onnx", "onnx", run, config, metrics, student))
    return written


def _write(folder: Path, kind: str, run: Path, config: Config, metrics, student) -> Path:
    of_student = student is not None and (kind == "student" or folder.parent.name == runs.STUDENT)
    test = student.test if of_student else metrics.test
    base = base_model_id(student.model if of_student else config.model)
    header = _metadata(kind, of_student, run.name, base, config, test)
    body = [
        f"# {run.name}: {_what(kind, config, student if of_student else None)}",
        "",
        f"Made with loracls from `{config.model}`"
        + (f" ({base})" if base and base != config.model else "")
        + f". Labels: {', '.join(runs.read_labels(run).values())}. Problem: `{metrics.problem}`.",
        "",
        "## Data",
        "",
        f"`{config.data}`: "
        + ", ".join(f"{split} {sum(counts.values())}" for split, counts in metrics.data.items())
        + " texts (per label: "
        + "; ".join(f"{s}: {_counts(c)}" for s, c in metrics.data.items())
        + ").",
        "",
        "## Results on the test split",
        "",
        *_results(metrics, test),
        "",
        "## How to use it",
        "",
        *_usage(kind, folder, config, runs.read_labels(run)),
        *_input_format(folder),
    ]
    path = folder / "README.md"
    files.write_text(path, "---\n" + yaml.safe_dump(header, sort_keys=False) + "---\n" + "\n".join(body) + "\n")
    return path


_VARIANT_NAMES = {"lora": "plain LoRA", "rslora": "rsLoRA", "dora": "DoRA"}


def _what(kind: str, config: Config, student) -> str:
    return {
        "adapter": f"a LoRA adapter ({_VARIANT_NAMES[config.lora_variant]}, r {config.r}) and classification head"
        if config.method == "lora"
        else "every weight of the fully fine-tuned classifier (full_model.safetensors; merged/ is the same model)",
        "merged": "the classifier with its LoRA merged",
        "student": f"{student.model if student else 'an encoder'} distilled from the LoRA classifier",
        "onnx": f"{f'the distilled {student.model}' if student else 'the classifier'} as ONNX (checked by onnxruntime)",
    }[kind]


def _metadata(kind: str, of_student: bool, name: str, base: str | None, config: Config, test) -> dict:
    library = {"adapter": "peft", "merged": "transformers", "student": "transformers", "onnx": "onnx"}[kind]
    data = {"library_name": library, "pipeline_tag": "text-classification"}
    data["license"] = license_of(config.model if not of_student else base or "", base)
    if data["license"] == "gemma":
        data["license_link"] = GEMMA_TERMS  # a Gemma derivative is bound by the Gemma terms of use
    if base:
        data["base_model"] = base
    data["tags"] = ["loracls", "text-classification", "distillation" if of_student else "lora"]
    dataset = EMBEDDED_DATASET if config.data == EMBEDDED_DATA else None
    if dataset:
        data["datasets"] = [dataset]
    metrics = [
        {"type": "accuracy", "value": round(float(test.accuracy), 4), "name": "test accuracy"},
        {"type": "f1", "value": round(float(test.macro_f1), 4), "name": "test macro F1", "args": {"average": "macro"}},
    ]
    data["model-index"] = [
        {
            "name": name,
            "results": [
                {
                    "task": {"type": "text-classification", "name": "Text Classification"},
                    "dataset": {"name": dataset or Path(config.data).name, "type": dataset or "local", "split": "test"},
                    "metrics": metrics,
                }
            ],
        }
    ]
    return data


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{label} {n}" for label, n in counts.items())


def _results(metrics, test) -> list[str]:
    lines = [f"Accuracy {test.accuracy:.4f}, macro F1 {test.macro_f1:.4f}."]
    verdict = metrics.verdict
    if verdict is not None:
        lines += ["", "| model | accuracy | macro F1 | ECE | texts/s | parameters |", "|---|---|---|---|---|---|"]
        for row in verdict.rows:
            ece = "-" if row.ece is None else f"{row.ece:.3f}"
            speed = "-" if row.texts_per_second is None else f"{row.texts_per_second:.1f}"
            size = "-" if row.parameters is None else f"{row.parameters / 1e6:.1f}M"
            lines.append(f"| {row.name} | {row.accuracy:.4f} | {row.macro_f1:.4f} | {ece} | {speed} | {size} |")
        lines += ["", f"Verdict: {verdict.reason}."]
    calibration = metrics.calibration
    if calibration is not None:
        lines += [
            "",
            f"Calibration: temperature {calibration.temperature:.3f} fitted on validation; test ECE "
            f"{calibration.before.ece:.3f} before, {calibration.after.ece:.3f} after.",
        ]
    return lines


def _input_format(folder: Path) -> list[str]:
    """What a client must do beyond the weights: the template, the length, the decision left to apply."""
    if not (folder / runs.INPUT_FORMAT).is_file() and not (folder / runs.CALIBRATION).is_file():
        return []
    fmt = runs.InputFormat.read(
        folder / (runs.INPUT_FORMAT if (folder / runs.INPUT_FORMAT).is_file() else runs.CALIBRATION)
    )
    lines = ["", f"Inputs: at most {fmt.max_length} tokens a text; longer texts: `{fmt.long_text}` in loracls."]
    if fmt.input_template:
        lines.append(f"Each text is placed in the template `{fmt.input_template!r}` before tokenizing.")
    if fmt.decision.thresholds:
        lines.append(
            "A label is chosen where its sigmoid probability reaches its threshold (config.json `loracls_thresholds`)."
        )
    elif fmt.decision.temperature != 1.0:
        lines.append(f"Divide the logits by the temperature {fmt.decision.temperature:.4f} before the softmax.")
    else:
        lines.append("The softmax of the logits is the calibrated probability (any temperature is in the head).")
    return lines


def _usage(kind: str, folder: Path, config: Config, id2label: dict[int, str]) -> list[str]:
    where = folder.resolve()
    if kind == "adapter":
        base = base_model_id(config.model) or str(Path(config.model).resolve())
        temperature = runs.InputFormat.read(folder / runs.CALIBRATION).decision.temperature
        return [
            "```python",
            "import torch",
            "from peft import PeftModel",
            "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
            f"id2label = {dict(id2label)!r}",
            f'base = AutoModelForSequenceClassification.from_pretrained("{base}", num_labels={len(id2label)}, '
            "id2label=id2label)",
            f'model = PeftModel.from_pretrained(base, "{where}").eval()  # the head is saved with the adapter',
            f'tokenizer = AutoTokenizer.from_pretrained("{base}")',
            f'inputs = tokenizer(["a text"], truncation=True, max_length={config.max_length}, return_tensors="pt")',
            "with torch.no_grad():",
            f"    probs = (model(**inputs).logits / {temperature!r}).softmax(-1)  # temperature: fitted on validation",
            "```",
            "",
            f"Or serve the run (base + adapter) with `loracls serve {where.parent}`.",
        ]
    if kind == "onnx":
        return [
            "```python",
            "import onnxruntime",
            f'session = onnxruntime.InferenceSession("{where / "model.onnx"}")',
            'logits = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]',
            "```",
            "",
            "Or `loracls predict RUN --engine onnx` / `loracls serve RUN --engine onnx`.",
        ]
    return [
        "```python",
        "from transformers import pipeline",
        f'classify = pipeline("text-classification", model="{where}", top_k=None'
        + (", trust_remote_code=True)" if (folder / "modeling_loracls_generic.py").is_file() else ")"),
        'probabilities = classify(["a text"], truncation=True)  # cut at max_length, as in training',
        "```",
        "",
        f"Or `loracls predict {folder.name} --text ...` and `loracls serve {folder.name}`"
        + " (vLLM's /classify and TEI's /predict shapes).",
    ]
