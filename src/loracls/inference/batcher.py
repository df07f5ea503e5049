"""Dynamic batching for the server: texts from concurrent requests are gathered (up to `max_batch_size` texts,
or `max_wait_ms` after the first one arrived), run in one forward pass sorted by length, and each request gets
its own rows back. The model runs in one worker thread, so the event loop never blocks on it. Each request
names the model (run) its rows are for; a batch may mix runs (`score(ids, models)` gets one name a row)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np


class Overloaded(Exception):
    """The queue is full now: the client should retry later (HTTP 429 + Retry-After)."""


class TooLarge(Exception):
    """One request holds more rows than the queue can ever hold: retrying cannot help (HTTP 413)."""


@dataclass
class _Pending:
    ids: list[list[int]]
    model: str | None
    future: asyncio.Future
    timing: dict | None = None  # filled with "queue" and "inference" seconds where the caller asks
    queued_at: float = 0.0


class Batcher:
    def __init__(
        self,
        score: Callable[[list[list[int]], list[str | None]], np.ndarray | list[np.ndarray]],
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        on_batch: Callable[[int], None] = lambda n: None,
    ):
        self.score, self.on_batch = score, on_batch
        self.max_batch_size, self.max_wait, self.max_queue = max_batch_size, max_wait_ms / 1000.0, max_queue
        self.queued_texts = 0
        self._queue: asyncio.Queue[_Pending] | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loracls-model")

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Answer everything queued, then stop the worker."""
        while self.queued_texts and self._task is not None and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def submit(self, ids: list[list[int]], model: str | None = None, timing: dict | None = None) -> np.ndarray:
        """Logits for `ids` (one row per text) by `model`, computed in some batch with other requests' texts;
        `timing` (a dict) gets the seconds spent waiting for the batch (`queue`) and in it (`inference`)."""
        if len(ids) > self.max_queue:
            raise TooLarge(
                f"{len(ids)} texts (or windows of long texts) in one request; the queue holds at most {self.max_queue}"
            )
        if self.queued_texts + len(ids) > self.max_queue:
            raise Overloaded(f"{self.queued_texts} texts are queued (limit {self.max_queue})")
        future = asyncio.get_running_loop().create_future()
        self.queued_texts += len(ids)
        await self._queue.put(_Pending(ids, model, future, timing, asyncio.get_running_loop().time()))
        return await future

    async def _gather(self) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        count, deadline = len(batch[0].ids), loop.time() + self.max_wait
        while count < self.max_batch_size:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            batch.append(item)
            count += len(item.ids)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            ids = [x for pending in batch for x in pending.ids]
            models = [pending.model for pending in batch for _ in pending.ids]
            started = loop.time()
            try:
                logits = await loop.run_in_executor(self._executor, self.score, ids, models)
            except Exception as exc:  # answered to every request of the batch; the worker goes on
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
            else:
                offset = 0
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_result(np.asarray(logits[offset : offset + len(pending.ids)]))
                    offset += len(pending.ids)
                self.on_batch(len(ids))
            finally:
                self.queued_texts -= len(ids)
                ended = loop.time()
                for pending in batch:
                    if pending.timing is not None:
                        pending.timing.update(queue=started - pending.queued_at, inference=ended - started)
