"""Diagnostics: doctor, the HTML report, sweeps, and the bench harness (out of the core path)."""

__all__ = ["doctor", "report", "sweep", "bench", "bench_recipes"]
