"""Training: the explicit loop (Trainer), its plan (steps, micro-batches, optimizer), the run's one logger,
resumable checkpoints, the stopping rule, MFU, DDP / FSDP2, and experiment trackers (`tracking`: MLflow,
TensorBoard)."""

__all__ = ["loop", "plan", "logger", "tracking", "checkpoint", "stopping", "mfu", "distributed"]
