"""Model: where weights come from, the tokenizer, the classifier head, LoRA with its checks, batched scoring, and
the CPU speed-ups."""

__all__ = ["source", "tokenizer", "classifier", "lora", "scoring", "speedups"]
