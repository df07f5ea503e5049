"""Model: where weights come from, the tokenizer, the classifier head, LoRA with its checks, batched scoring,
label scoring and comment generation with a causal LM, and the CPU speed-ups."""

__all__ = ["source", "tokenizer", "classifier", "lora", "scoring", "label_scoring", "generation", "speedups"]
