"""Data: read tables, check and split them, tokenize and batch, and read texts to score in chunks (the first
stage; imports only the core)."""

__all__ = ["spec", "tables", "splits", "hf_sets", "batching", "text_chunks"]
