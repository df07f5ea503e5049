"""Inference: a finished run reloaded for predict / evaluate / serve (one engine; `commenter` for
label_and_comment runs; `onnx_engine` for its ONNX export), files of any length streamed through it
(`streaming`, or Ray Data in `ray_predict`), the merged and ONNX exports, the HTTP server, its batcher and its
typed contract."""

__all__ = [
    "engine",
    "loaded",
    "commenter",
    "onnx_engine",
    "streaming",
    "ray_predict",
    "export",
    "onnx_export",
    "server",
    "batcher",
    "protocol",
]
