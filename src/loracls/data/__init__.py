"""Data: read tables, check and split them, tokenize and batch, and read texts to score in chunks (the first
stage; imports only the core); and augmented variants of texts for distillation."""

__all__ = ["spec", "tables", "splits", "hf_sets", "batching", "text_chunks", "augment"]
