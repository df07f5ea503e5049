"""Training: the explicit loop (Trainer), resumable checkpoints, the stopping rule, MFU, and DDP / FSDP2."""

__all__ = ["loop", "checkpoint", "stopping", "mfu", "distributed"]
