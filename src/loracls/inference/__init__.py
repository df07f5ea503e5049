"""Inference: a finished run reloaded for predict / evaluate / serve (one engine; `commenter` for
label_and_comment runs), the merged and ONNX exports, the HTTP server, its batcher and its typed contract."""

__all__ = ["engine", "loaded", "commenter", "export", "onnx_export", "server", "batcher", "protocol"]
