"""`loracls export RUN --format onnx`: the merged classifier as an ONNX file (torch's dynamo exporter, dynamic
batch and sequence length), checked with onnxruntime against PyTorch on the run's test split: the largest
probability difference, label agreement, and both CPU throughputs measured side by side. A model the
exporter cannot handle is refused with one line naming the exporter's error; nothing is left behind."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from loracls import files, runs
from loracls.data.batching import collate
from loracls.data.spec import DataSpec
from loracls.data.splits import load_dataset
from loracls.errors import Log, LoraclsError, first_line
from loracls.inference.engine import Classifier
from loracls.inference.export import compare_predictions, export_checked
from loracls.model.scoring import Batching, batched_logits, predict_logits
from loracls.problems import evaluation
from loracls.runs import INPUT_FORMAT, ExportCheck, InputFormat

ONNX_DIR = "onnx"
MATCH_TOLERANCE = 1e-3  # max probability difference accepted between onnxruntime and PyTorch (both fp32)


class _Logits(torch.nn.Module):
    """input_ids, attention_mask -> logits (no KV cache in the outputs: the exporter cannot carry it).
    `pad_to`: the inputs are right-padded inside the graph to that many tokens first, so that what follows
    sees one fixed length (texts are never longer: they are cut or chunked at the run's max_length)."""

    def __init__(self, model, pad_to: int | None = None, pad_id: int = 0):
        super().__init__()
        self.model, self.pad_to, self.pad_id = model, pad_to, pad_id

    def forward(self, input_ids, attention_mask):
        if self.pad_to is not None:
            extra = self.pad_to - input_ids.shape[1]
            input_ids = torch.nn.functional.pad(input_ids, (0, extra), value=self.pad_id)
            attention_mask = torch.nn.functional.pad(attention_mask, (0, extra), value=0)
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def _require_onnx():
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise LoraclsError("export --format onnx needs: pip install onnx onnxscript onnxruntime") from None


def _program(model, example: dict, longest: int, pad_to: int | None, pad_id: int):
    """torch.export's program with batch and sequence length dynamic, the length up to `longest` (the run's
    max_length: no text is longer). Unbounded, a model that slices a position table (BERT's `position_ids[:, :n]`,
    512 rows) fails the exporter's guard `sequence <= 512` and was padded to max_length: MiniLM's student then ran
    at 6 texts/s in onnxruntime against 81 in PyTorch on rt's test texts, 1 thread."""
    batch = torch.export.Dim("batch")
    seq = torch.export.Dim("sequence", max=pad_to or longest)
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    return torch.export.export(
        _Logits(model, pad_to, pad_id).eval(), (), kwargs=example, dynamic_shapes=shapes, strict=False
    )


def export_dynamic(model, example: dict, target: Path, max_length: int, pad_id: int, log) -> int | None:
    """Dynamic batch and sequence length. Where the sequence length cannot stay dynamic (chunked linear
    attention, as in Qwen3.5 and Olmo hybrids, loops over a number of chunks set by the length), the graph
    takes its inputs padded inside it to max_length: still any batch and any length up to max_length, each text
    computed at max_length. Returns that padded length, or None."""
    import logging

    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # the exporter's registry warnings are not ours to show
    padded = None
    longest = min(max_length, getattr(model.config, "max_position_embeddings", None) or max_length)
    try:
        try:
            program = _program(model, example, longest, None, pad_id)
        except torch._dynamo.exc.UserError as exc:  # "Constraints violated (sequence)": a guard fixed the length
            log(
                f"export: this model's sequence length cannot stay dynamic in the graph (torch.export: "
                f"{first_line(exc, 60)}); its inputs are padded to {max_length} inside the graph"
            )
            padded = max_length
            program = _program(model, example, longest, padded, pad_id)
        onnx_program = torch.onnx.export(
            program,
            (),
            kwargs=example,
            dynamo=True,
            input_names=["input_ids", "attention_mask"],
            output_names=["logits"],
            verbose=False,
        )
    except Exception as exc:
        raise LoraclsError(
            f"the ONNX exporter (torch {torch.__version__}) cannot export this model: "
            f"{type(exc).__name__}: {first_line(exc, 240)}"
        ) from None
    onnx_program.save(str(target), external_data=True)  # a full disk here is said as such by replace_dir
    check_dynamic_inputs(target)
    return padded


def use_exportable_experts(model, log) -> None:
    """MoE layers: transformers' default experts code loops over the experts a batch picks (a data-dependent
    loop the exporter refuses); `batched_mm` computes every expert with batched matmuls, which exports."""
    if not any("experts" in name.rsplit(".", 1)[-1] for name, _ in model.named_modules()):
        return
    try:
        model.set_experts_implementation("batched_mm")
    except (ValueError, AttributeError) as exc:
        log(f"export: the experts implementation stays as it is ({first_line(exc, 120)})")
        return
    log("export: mixture-of-experts layers exported with experts_implementation='batched_mm'")


def fixed_input_axes(path: Path) -> list[str]:
    """The graph inputs' batch and sequence axes that the exporter fixed, e.g. "input_ids's sequence at 7"."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [
        f"{value.name}'s {axis} at {dim.dim_value}"
        for value in graph.input
        for axis, dim in zip(("batch", "sequence"), value.type.tensor_type.shape.dim)
        if not dim.dim_param
    ]


def check_dynamic_inputs(path: Path) -> None:
    """The graph's inputs must keep batch and sequence length free (a graph fixed at the example's shape
    would fail on every other input)."""
    fixed = fixed_input_axes(path)
    if fixed:
        raise LoraclsError(
            f"the ONNX exporter fixed {', '.join(fixed)} for this model (it cannot keep them dynamic); not kept"
        )


def _run_onnx(path: Path, ids: list[list[int]], pad_id: int, batch_size: int) -> np.ndarray:
    """onnxruntime's logits; a session or run failure is one line."""
    import onnxruntime

    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return _onnx_logits(session, ids, pad_id, batch_size)
    except Exception as exc:  # onnxruntime's own errors have no common base class
        raise LoraclsError(f"onnxruntime cannot run the exported model: {first_line(exc, 240)}; not kept") from None


def _onnx_logits(session, ids: list[list[int]], pad_id: int, batch_size: int) -> np.ndarray:
    return batched_logits(
        ids, pad_id, batch_size, lambda batch: session.run(None, {k: v.numpy() for k, v in batch.items()})[0]
    )


def _checked_target(target: Path, replace: bool) -> Path:
    """The export's folder: new, empty, or (with --force) an earlier ONNX export, never some other folder."""
    if target.exists() and not target.is_dir():
        raise LoraclsError(f"{target} exists and is not a folder")
    if target.exists() and any(target.iterdir()):
        if not replace:
            raise LoraclsError(f"{target} already exists and is not empty; add --force to replace it")
        if not (target / "model.onnx").is_file():
            raise LoraclsError(f"{target} is not an ONNX export (no model.onnx): refusing to replace it")
    return target


def _compared(check: ExportCheck) -> str:
    return (
        f"max probability difference {check.max_probability_difference:.2e}, {check.disagreements} label "
        f"disagreement(s); {check.texts_per_second:.1f} vs {check.reference_texts_per_second:.1f} texts/s"
    )


def _write_beside(classifier: Classifier, folder: Path) -> None:
    """What a user needs beside model.onnx: the tokenizer (with the run's max_length), the model's config.json
    (id2label; optimum's ORTModelForSequenceClassification reads it), the input format and decision, the label
    names."""
    from loracls.inference.export import save_tokenizer_as_trained

    save_tokenizer_as_trained(classifier.tokenizer, folder, classifier.max_length)
    classifier.model.config.to_json_file(str(folder / "config.json"))
    trained_with = (classifier.input_template, classifier.max_length, classifier.long_text, classifier.chunk_stride)
    InputFormat(*trained_with, classifier.decision).write(folder / INPUT_FORMAT)
    files.write_json(folder / "labels.json", {str(i): name for i, name in classifier.id2label.items()})


def export_onnx(
    run_path: str, out: str | None = None, log: Log = print, replace: bool = False, quantize: str | None = None
) -> list[ExportCheck]:
    """The fp32 export's check, then (`quantize: int8`) the int8 model's."""
    _require_onnx()
    source = runs.check_model_dir(run_path)  # a run, or a model folder inside one (RUN/student)
    run = runs.owning_run(source)
    if run is None:
        raise LoraclsError(f"export --format onnx checks on the run's test split: {run_path} is in no run directory")
    config = runs.read_config(run)
    target = _checked_target(Path(out) if out else source / ONNX_DIR, replace)
    classifier = Classifier(run_path, log, device="cpu", precision="fp32")  # exported and checked in fp32 on the CPU
    test = load_dataset(DataSpec.of(config)).test
    encoded = classifier.encode(test.texts)
    ids = encoded.ids
    pad = classifier.tokenizer.pad_token_id
    example = collate(ids[:2], pad)
    log(f"export: tracing {classifier.name} for ONNX (torch.onnx dynamo exporter) ...")
    use_exportable_experts(classifier.model, log)

    padded = []

    def fill(staging: Path) -> None:
        padded.append(
            export_dynamic(classifier.model, example, staging / "model.onnx", classifier.max_length, pad, log)
        )
        _write_beside(classifier, staging)

    def check(staging: Path) -> tuple[ExportCheck, np.ndarray, float]:
        started = time.perf_counter()
        torch_logits = predict_logits(classifier.model, ids, Batching(pad, classifier.batch_size, classifier.runtime))
        torch_seconds = time.perf_counter() - started
        started = time.perf_counter()
        onnx_logits = _run_onnx(staging / "model.onnx", ids, pad, classifier.batch_size)
        onnx_seconds = time.perf_counter() - started
        a, b = (classifier.calibrated(encoded.per_text(logits)) for logits in (torch_logits, onnx_logits))
        result = dataclasses.replace(
            compare_predictions(a, b, "fp32", classifier.decision),
            format="onnx",
            file=str(target / "model.onnx"),
            texts_per_second=len(a) / onnx_seconds,
            reference_texts_per_second=len(a) / torch_seconds,
            sequence_padded_to=padded[-1],
        )
        if result.non_finite or result.max_probability_difference > MATCH_TOLERANCE:
            raise LoraclsError(
                f"the ONNX model differs from PyTorch by {result.max_probability_difference:.2e} in probability "
                f"(tolerance {MATCH_TOLERANCE}; non-finite on {result.non_finite} texts); not kept"
            )
        runs.write_record(staging / "export_check.json", result)
        return result, a, torch_seconds

    check, a, torch_seconds = export_checked(target, fill, check, "the ONNX export")
    log(f"export: {check.file}; on {len(a)} test texts onnxruntime vs PyTorch (fp32, CPU): " + _compared(check))
    if quantize is None:
        return [check]
    return [check, _quantized(target, classifier, encoded, test, _TorchReference(a, torch_seconds), log)]


@dataclasses.dataclass(frozen=True)
class _TorchReference:
    """fp32 PyTorch's calibrated probabilities on the test split, and the seconds they took."""

    probabilities: np.ndarray
    seconds: float


def _quantized(target: Path, classifier, encoded, test, torch_side: _TorchReference, log) -> ExportCheck:
    """model.int8.onnx beside model.onnx: int8 weights for every MatMul, in blocks of 128 with a scale each
    (onnxruntime's MatMulNBitsQuantizer, bits=8, accuracy_level 4: int8 products inside the kernel), checked
    against fp32 PyTorch on the test split: label agreement, the accuracy change and the largest probability
    difference. Kept whatever they are: the check says what the int8 model costs in quality. Measured on a
    270M run (docs/benchmarks.md): onnxruntime's dynamic quantization (quantize_dynamic: activations
    quantized per batch too) lost 3.0 points of accuracy there, and 4.5 on another run on a CPU with VNNI;
    these weight-only blocks lost none and 0.5 against the bf16 engine."""
    reference, reference_seconds = torch_side.probabilities, torch_side.seconds
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
