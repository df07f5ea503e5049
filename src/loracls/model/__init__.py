"""Model: where weights come from, where a checkpoint keeps its decoder (text-only or inside a multimodal
wrapper), the tokenizer, the classifier head and its pooling, LoRA with its checks, the training methods
(`methods`: LoRA, full fine-tuning), batched scoring, label scoring and comment generation with a causal LM,
the two scorers a problem trains with (`scorers`: a head, or the label words), and the CPU speed-ups."""

__all__ = [
    "source",
    "checkpoint",
    "tokenizer",
    "classifier",
    "pooling",
    "lora",
    "methods",
    "scoring",
    "label_scoring",
    "generation",
    "scorers",
    "speedups",
]
