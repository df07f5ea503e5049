"""Diagnostics: doctor, the HTML report of a finished run, and sweeps over a grid of configs (the bench harness
lives in benchmarks/, outside the package)."""

__all__ = ["doctor", "report", "sweep"]
