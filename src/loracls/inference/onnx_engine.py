"""The ONNX export of a run (`loracls export RUN --format onnx [--quantize int8]`) as the engine of `predict`,
`evaluate` and `serve` (`--engine onnx` / `--engine onnx-int8`): onnxruntime on the CPU, with the same
encoding, long-text policy, calibration and decision as the PyTorch engine, read from the export's own
`loracls_input.json`, `labels.json` and tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loracls import files, runs
from loracls.errors import Log, LoraclsError, first_line
from loracls.hardware import setup_runtime
from loracls.inference.engine import RunFormat
from loracls.inference.onnx_export import ONNX_DIR
from loracls.model.scoring import batched_logits
from loracls.model.tokenizer import load_tokenizer

__all__ = ["ENGINES", "OnnxClassifier"]

ENGINES = {"onnx": "model.onnx", "onnx-int8": "model.int8.onnx"}  # --engine -> the file in the export folder


class OnnxClassifier(RunFormat):
    def __init__(
        self,
        path: str,
        log: Log = print,
        batch_size: int | None = None,
        engine: str = "onnx",
        threads: int | None = None,
    ):
        try:
            import onnxruntime
        except ImportError:
            raise LoraclsError(f"--engine {engine} needs onnxruntime: pip install onnxruntime") from None
        source = Path(path)
        inside = (source / runs.CONFIG).is_file() or (source / ONNX_DIR / ENGINES["onnx"]).is_file()
        folder = source / ONNX_DIR if inside else source  # a run's (or a model folder's) export, or the export
        file = folder / ENGINES[engine]
        if not file.is_file():
            quantize = " --quantize int8" if engine == "onnx-int8" else ""
            raise LoraclsError(f"{file} not found: make it with loracls export RUN --format onnx{quantize}")
        fmt = runs.InputFormat.read(folder / runs.INPUT_FORMAT)
        labels = files.read_json(folder / "labels.json", "the export's labels")
        self.id2label = {int(i): str(name) for i, name in labels.items()}
        self.input_template, self.max_length, self.decision = fmt.input_template, fmt.max_length, fmt.decision
        self.long_text, self.chunk_stride = fmt.long_text, fmt.chunk_stride
        self.tokenizer = load_tokenizer(folder, log)
        try:
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = threads or 0  # 0: onnxruntime's default, one a physical core
            self.session = onnxruntime.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise LoraclsError(f"onnxruntime cannot load {file}: {first_line(exc, 200)}") from None
        self.name, self.source, self.engine = source.name, str(file), engine
        self.batch_size = batch_size or 32
        self.runtime = setup_runtime("cpu", "fp32", threads)
        self._setup_format(file)
        log(f"engine: onnxruntime, {file}")

    @property
    def precision(self) -> str:
        return "int8" if self.engine == "onnx-int8" else "float32"

    def logits(self, ids: list[list[int]], progress: bool = False, max_tokens: int | None = None) -> np.ndarray:
        def forward(batch) -> np.ndarray:
            return self.session.run(None, {name: tensor.numpy() for name, tensor in batch.items()})[0]

        return batched_logits(ids, self.tokenizer.pad_token_id, self.batch_size, forward, progress, max_tokens)
