"""Several engines served by one server, side by side: a run beside its distilled student (`serve RUN
RUN/student`), or exported models of different bases. Each request names its model as for several runs
(`model` field, query or header); a batch that mixes models hands each engine its own rows."""

from __future__ import annotations

import numpy as np

from loracls.errors import LoraclsError
from loracls.inference.engine import Engine

__all__ = ["EngineGroup"]


class EngineGroup:
    """The served runs of several engines, under distinct names (the first engine's first run answers a
    request that names none)."""

    def __init__(self, engines: list[Engine]):
        self.owner: dict[str, Engine] = {}
        self.runs: dict[str, Engine] = {}
        for engine in engines:
            for name, run in engine.served_runs().items():
                if name in self.runs:
                    raise LoraclsError(f"serve: two models are named {name!r}; the `model` field picks one by name")
                self.owner[name], self.runs[name] = engine, run

    def served_runs(self) -> dict[str, Engine]:
        return dict(self.runs)

    def score(self, ids: list[list[int]], models: list[str | None], max_tokens: int | None = None) -> list:
        """Each row scored by the engine serving its model (a row naming none: the first model's)."""
        first = next(iter(self.runs))
        named = [model or first for model in models]
        rows: list = [None] * len(ids)
        for engine in {id(self.owner[name]): self.owner[name] for name in named}.values():
            mine = [i for i, name in enumerate(named) if self.owner[name] is engine]
            scored = engine.score([ids[i] for i in mine], [named[i] for i in mine], max_tokens)
            for i, row in zip(mine, np.asarray(scored) if not isinstance(scored, list) else scored):
                rows[i] = row
        return rows
