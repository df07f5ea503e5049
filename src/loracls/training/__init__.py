"""Training: the explicit loop (Trainer), its plan (steps, micro-batches, optimizer), the run's one logger,
resumable checkpoints, the stopping rule, MFU, and DDP / FSDP2."""

__all__ = ["loop", "plan", "logger", "checkpoint", "stopping", "mfu", "distributed"]
