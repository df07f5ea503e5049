"""Inference: a finished run reloaded for predict / evaluate / serve (one engine; `commenter` for
label_and_comment runs; `onnx_engine` for its ONNX export; `adapters` for several runs on one base; `group` for
engines side by side; `ensemble_engine` for the verdict's ensemble row), files of any length streamed through it
(`streaming`, or Ray Data in `ray_predict`), the merged and ONNX exports (checked in staging; `plain_check`
reads an export back with plain transformers in a fresh process), the HTTP server, its batcher, its model-free
HTTP pieces (`http`) and its typed contract."""

__all__ = [
    "engine",
    "adapters",
    "group",
    "ensemble_engine",
    "loaded",
    "commenter",
    "onnx_engine",
    "streaming",
    "ray_predict",
    "export",
    "model_card",
    "plain_check",
    "onnx_export",
    "server",
    "served",
    "tokens",
    "batcher",
    "http",
    "protocol",
]
