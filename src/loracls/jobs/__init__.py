"""Jobs: the main train job as named phases, its baseline ladder and verdict, the Optuna search, and the
preflight checks."""

__all__ = ["train", "ladder", "tune", "preflight"]
