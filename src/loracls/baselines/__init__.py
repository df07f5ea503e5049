"""Baselines a run is compared with: the zero-shot prompt, TF-IDF, a fine-tuned encoder, and the ensemble of LoRA
with that encoder; and the student `loracls distill` trains from a run (independent of inference)."""

__all__ = ["zero_shot", "tfidf", "encoder", "ensemble", "student"]
