"""Data: read tables, check and split them, tokenize and batch (the first stage; imports only the core)."""

__all__ = ["tables", "splits", "batching"]
