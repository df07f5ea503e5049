"""Baselines a run is compared with: the zero-shot prompt, TF-IDF, and a fine-tuned encoder (independent of
inference)."""

__all__ = ["zero_shot", "tfidf", "encoder"]
