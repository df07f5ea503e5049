"""Jobs: the main train job as named phases, the label_and_comment job, the baseline ladder and verdict, the
Optuna search, trainings as Ray Tune trials (`ray_trials`, for tune and sweep), and the preflight checks."""

__all__ = ["train", "comment", "ladder", "tune", "ray_trials", "preflight"]
