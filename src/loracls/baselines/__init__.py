"""Baselines a run is compared with: the zero-shot prompt, TF-IDF, and a fine-tuned encoder; and the student
`loracls distill` trains from a run (independent of inference)."""

__all__ = ["zero_shot", "tfidf", "encoder", "student"]
