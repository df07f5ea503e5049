"""Inference: a finished run reloaded for predict / evaluate / serve (one engine), the merged and ONNX exports,
the HTTP server, its batcher and its typed contract."""

__all__ = ["engine", "loaded", "export", "onnx_export", "server", "batcher", "protocol"]
