"""Jobs: the one training job as named phases (every problem, through its scorer), the baseline ladder and
verdict, distillation of a finished run into an encoder, the Optuna search, trainings as Ray Tune trials
(`ray_trials`, for tune and sweep), and the preflight checks."""

__all__ = ["train", "ladder", "distill", "tune", "ray_trials", "preflight"]
