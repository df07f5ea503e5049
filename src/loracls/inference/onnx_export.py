"""`loracls export RUN --format onnx`: the merged classifier as an ONNX file (torch's dynamo exporter, dynamic
batch and sequence length), checked with onnxruntime against PyTorch on the run's test split: the largest
probability difference, label agreement, and both CPU throughputs measured side by side. A model the
exporter cannot handle is refused with one line naming the exporter's error; nothing is left behind."""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from loracls import files, runs
from loracls.data.batching import collate
from loracls.data.splits import load_dataset
from loracls.errors import LoraclsError, first_line
from loracls.inference.engine import Classifier
from loracls.inference.export import compare_predictions
from loracls.model.scoring import batched_logits, predict_logits
from loracls.problems import evaluation
from loracls.runs import INPUT_FORMAT, ExportCheck, InputFormat

ONNX_DIR = "onnx"
MATCH_TOLERANCE = 1e-3  # max probability difference accepted between onnxruntime and PyTorch (both fp32)


class _Logits(torch.nn.Module):
    """input_ids, attention_mask -> logits (no KV cache in the outputs: the exporter cannot carry it)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def _require_onnx():
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise LoraclsError("export --format onnx needs: pip install onnx onnxscript onnxruntime") from None


def _export(model, example: dict, target: Path) -> None:
    import logging

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # the exporter's registry warnings are not ours to show
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    try:
        program = torch.onnx.export(
            _Logits(model).eval(),
            (),
            kwargs=example,
            dynamo=True,
            dynamic_shapes=shapes,
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            verbose=False,
        )
    except Exception as exc:
        raise LoraclsError(
            f"the ONNX exporter (torch {torch.__version__}) cannot export this model: "
            f"{type(exc).__name__}: {first_line(exc, 240)}"
        ) from None
    program.save(str(target), external_data=True)  # a full disk here is said as such by replace_dir


def _onnx_logits(session, ids: list[list[int]], pad_id: int, batch_size: int) -> np.ndarray:
    return batched_logits(
        ids, pad_id, batch_size, lambda batch: session.run(None, {k: v.numpy() for k, v in batch.items()})[0]
    )


def export_onnx(
    run_path: str, out: str | None = None, log=print, replace: bool = False, quantize: str | None = None
) -> list[ExportCheck]:
    """The fp32 export's check, then (`quantize: int8`) the int8 model's."""
    _require_onnx()
    import onnxruntime

    run = runs.check_run_dir(run_path)
    config = runs.read_config(run)
    target = Path(out) if out else run / ONNX_DIR
    if target.exists() and not target.is_dir():
        raise LoraclsError(f"{target} exists and is not a folder")
    if target.exists() and any(target.iterdir()):
        if not replace:
            raise LoraclsError(f"{target} already exists and is not empty; add --force to replace it")
        if not (target / "model.onnx").is_file():  # --force replaces an export, never some other folder
            raise LoraclsError(f"{target} is not an ONNX export (no model.onnx): refusing to replace it")
    classifier = Classifier(run_path, log, device="cpu", precision="fp32")  # exported and checked in fp32 on the CPU
    test = load_dataset(config).test
    encoded = classifier.encode(test.texts)
    ids = encoded.ids
    pad = classifier.tokenizer.pad_token_id
    example = collate(ids[:2], pad)
    log(f"export: tracing {classifier.name} for ONNX (torch.onnx dynamo exporter) ...")

    def fill(staging: Path) -> None:
        _export(classifier.model, example, staging / "model.onnx")
        classifier.tokenizer.save_pretrained(staging)
        InputFormat(
            classifier.input_template,
            classifier.max_length,
            classifier.long_text,
            classifier.chunk_stride,
            classifier.decision,
        ).write(staging / INPUT_FORMAT)
        files.write_json(staging / "labels.json", {str(i): name for i, name in classifier.id2label.items()})

    files.replace_dir(target, fill, "the ONNX export")
    session = onnxruntime.InferenceSession(str(target / "model.onnx"), providers=["CPUExecutionProvider"])
    started = time.perf_counter()
    torch_logits = predict_logits(classifier.model, ids, pad, classifier.batch_size, classifier.runtime)
    torch_seconds = time.perf_counter() - started
    started = time.perf_counter()
    onnx_logits = _onnx_logits(session, ids, pad, classifier.batch_size)
    onnx_seconds = time.perf_counter() - started
    a, b = (classifier.calibrated(encoded.per_text(logits)) for logits in (torch_logits, onnx_logits))
    check = dataclasses.replace(
        compare_predictions(a, b, "fp32", classifier.decision),
        format="onnx",
        file=str(target / "model.onnx"),
        texts_per_second=len(a) / onnx_seconds,
        reference_texts_per_second=len(a) / torch_seconds,
    )
    runs.write_record(target / "export_check.json", check)
    log(
        f"export: {check.file}; on {len(a)} test texts onnxruntime vs PyTorch (fp32, CPU): max probability "
        f"difference {check.max_probability_difference:.2e}, {check.disagreements} label disagreement(s); "
        f"{check.texts_per_second:.1f} vs {check.reference_texts_per_second:.1f} texts/s"
    )
    if check.max_probability_difference > MATCH_TOLERANCE:
        shutil.rmtree(target, ignore_errors=True)
        raise LoraclsError(
            f"the ONNX model differs from PyTorch by {check.max_probability_difference:.2e} in "
            f"probability (tolerance {MATCH_TOLERANCE}); not kept"
        )
    if quantize is None:
        return [check]
    return [check, _quantized(target, classifier, encoded, a, test, torch_seconds, log)]


def _quantized(target: Path, classifier, encoded, reference: np.ndarray, test, reference_seconds, log) -> ExportCheck:
    """model.int8.onnx beside model.onnx: int8 weights for every MatMul, in blocks of 128 with a scale each
    (onnxruntime's MatMulNBitsQuantizer, bits=8, accuracy_level 4: int8 products inside the kernel), checked
    against fp32 PyTorch on the test split: label agreement, the accuracy change and the largest probability
    difference. Kept whatever they are: the check says what the int8 model costs in quality. Measured on a
    270M run (docs/benchmarks.md): onnxruntime's dynamic quantization (quantize_dynamic: activations
    quantized per batch too) lost 3.0 points of accuracy there, and 4.5 on another run on a CPU with VNNI;
    these weight-only blocks lost none and 0.5 against the bf16 engine."""
    import logging

    import onnx
    import onnxruntime
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)  # else a line per node it skips

    file = target / "model.int8.onnx"
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(target / "model.onnx")), bits=8, block_size=128, is_symmetric=True, accuracy_level=4
    )
    quantizer.process()
    with files.writing(file, "the int8 ONNX model"):
        quantizer.model.save_model_to_file(str(file), use_external_data_format=True)  # no 2 GB protobuf limit
    session = onnxruntime.InferenceSession(str(file), providers=["CPUExecutionProvider"])
    started = time.perf_counter()
    logits = _onnx_logits(session, encoded.ids, classifier.tokenizer.pad_token_id, classifier.batch_size)
    seconds = time.perf_counter() - started
    probs = classifier.calibrated(encoded.per_text(logits))
    decision, id2label = classifier.decision, classifier.id2label
    accuracy, reference_accuracy = (
        evaluation(test.texts, test.labels, p, id2label, decision).metrics.accuracy for p in (probs, reference)
    )
    check = dataclasses.replace(
        compare_predictions(reference, probs, "int8", decision),
        format="onnx",
        file=str(file),
        texts_per_second=len(probs) / seconds,
        reference_texts_per_second=len(probs) / reference_seconds,
        accuracy=accuracy,
        reference_accuracy=reference_accuracy,
    )
    runs.write_record(target / "export_check.int8.json", check)
    log(
        f"export: {file}; int8 vs fp32 PyTorch on {check.examples} test texts: {check.disagreements} label "
        f"disagreement(s), accuracy {accuracy:.4f} vs {reference_accuracy:.4f}, max probability difference "
        f"{check.max_probability_difference:.2e}; {check.texts_per_second:.1f} vs "
        f"{check.reference_texts_per_second:.1f} texts/s"
    )
    return check
