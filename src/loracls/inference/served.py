"""What every route of `loracls serve` reads: the served runs (`Served`: one engine's, or several side by side)
and, per request, the app's state (`Serving`: the runs, the batcher, the metrics, the request limits)."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from fastapi import Request

from loracls.inference.batcher import Batcher

if TYPE_CHECKING:
    from loracls.inference.engine import Engine

__all__ = [
    "Served",
    "Serving",
    "TooManyTexts",
    "UnknownModel",
    "logits_of",
    "encoded_off_loop",
    "tei_timing",
    "ServeLimits",
    "APP_LIMITS",
    "SERVE_MAX_TOKENS",
    "MAX_CLIENT_BATCH_SIZE",
]

# A gathered batch mixes lengths; cutting it where padding would pass this many tokens per forward pass was
# measured at 22-26 texts/s against 19-21 uncut (Rotten Tomatoes snippets, concurrency 32, this 2-core CPU).
SERVE_MAX_TOKENS = 512
MAX_CLIENT_BATCH_SIZE = 32  # TEI's default: texts in one request


class TooManyTexts(Exception):
    """A request with more texts than max_client_batch_size (HTTP 413)."""


class UnknownModel(Exception):
    """A request naming a model this server does not serve (HTTP 404)."""


class Served:
    """The runs one server answers for: one engine (a run, a merged model, an ONNX export, a
    label_and_comment run), or an AdapterSet's runs on one shared base. `pick` finds a request's run (none
    named: the first), and `score(ids, models)` computes rows of any mix of them in one batch."""

    def __init__(self, engine: Engine):
        self.runs = engine.served_runs()
        self.first = next(iter(self.runs.values()))
        self.score = functools.partial(engine.score, max_tokens=SERVE_MAX_TOKENS)

    def pick(self, name: str | None):
        if name is None:
            return self.first
        if name not in self.runs:
            served = ", ".join(f"`{known}`" for known in self.runs)
            raise UnknownModel(f"The model `{name}` does not exist; this server serves {served}")
        return self.runs[name]


async def logits_of(batcher: Batcher, classifier, encoded, metrics, timing: dict | None = None) -> np.ndarray:
    """Per-text logits by `classifier` (one served run), computed in some batch with other requests' texts (a
    long text's windows averaged under long_text: chunks); `timing` gets the queue and inference seconds."""
    logits = encoded.per_text(await batcher.submit(encoded.ids, classifier.name, timing))
    metrics.texts.labels(classifier.name).inc(len(encoded.long))
    return logits


class Serving:
    """What every handler reads from the app: the served runs, the batcher, the metrics, the request limit."""

    def __init__(self, request: Request):
        state = request.app.state
        self.served, self.batcher, self.metrics = state.served, state.batcher, state.metrics
        self.max_client_batch_size = state.max_client_batch_size

    def texts(self, value: str | list[str]) -> list[str]:
        texts = [value] if isinstance(value, str) else value
        if len(texts) > self.max_client_batch_size:
            raise TooManyTexts(f"batch size {len(texts)} > maximum allowed batch size {self.max_client_batch_size}")
        return texts

    async def probabilities(self, classifier, encoded) -> np.ndarray:
        return classifier.calibrated(await logits_of(self.batcher, classifier, encoded, self.metrics))


async def encoded_off_loop(classifier, texts: list[str], **cut):
    """A request's texts tokenized in a worker thread: a large legal request (megabytes of text) must not hold
    the event loop, so /health and other requests are answered meanwhile. `cut`: a client's truncation."""
    return await asyncio.to_thread(lambda: classifier.encode(texts, **cut) if cut else classifier.encode(texts))


def tei_timing(metrics, method: str, timing: dict, characters: int, tokens: int, texts: int) -> dict:
    """TEI's response headers (milliseconds) and its te_* series (seconds) for one answered request."""
    metrics.te_success.labels(method).inc()
    metrics.te_predictions.labels(method).inc(texts)
    for part, seconds in timing.items():
        metrics.te_duration[f"{part}_" if part else ""].observe(seconds)
    return {
        "x-compute-characters": str(characters),
        "x-compute-tokens": str(tokens),
        "x-total-time": str(round(1000 * timing[""])),
        "x-tokenization-time": str(round(1000 * timing["tokenization"])),
        "x-queue-time": str(round(1000 * timing.get("queue", 0.0))),
        "x-inference-time": str(round(1000 * timing.get("inference", 0.0))),
    }


APP_LIMITS = ("max_batch_size", "max_wait_ms", "max_queue", "max_body_bytes", "max_client_batch_size")


@dataclass(frozen=True)
class ServeLimits:
    """`loracls serve`'s batching and request limits (create_app's keyword arguments)."""

    max_batch_size: int = 64
    max_wait_ms: float = 5.0
    max_queue: int = 4096
    max_body_bytes: int = 4 * 2**20
    max_client_batch_size: int = MAX_CLIENT_BATCH_SIZE
    max_connections: int | None = None  # open connections at most (None: the descriptor limit less a reserve)
    header_timeout_s: float = 10.0  # a connection that sends nothing this long is closed
