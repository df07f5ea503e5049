"""The HTTP pieces under `loracls serve` that know nothing of models: TEI's error body, the Prometheus
metrics, the request-body limit and the listening socket."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.responses import JSONResponse

from loracls.errors import LoraclsError, first_line

__all__ = [
    "error",
    "error_for",
    "main_problem",
    "ServerMetrics",
    "BodyLimit",
    "BACKLOG",
    "bound_socket",
    "idle_guarded",
    "raise_open_files",
]


def error(status: int, kind: str, message: str, headers: dict | None = None) -> JSONResponse:
    """TEI's error body: {"error": message, "error_type": kind}."""
    return JSONResponse({"error": message, "error_type": kind}, status_code=status, headers=headers)


VLLM_PATHS = ("/classify", "/v1/classify", "/v1/models", "/detokenize")  # routes whose clients read vLLM's body
_VLLM_TYPES = {404: "NotFoundError", 429: "RateLimitError", 500: "InternalServerError"}


def error_for(path: str, status: int, kind: str, message: str, headers: dict | None = None) -> JSONResponse:
    """The error body a route's clients read: vLLM's (and OpenAI's: {"error": {"message", "type", "code"}})
    on vLLM's routes, so the openai SDK shows the message; TEI's everywhere else."""
    if path.startswith(VLLM_PATHS):
        body = {"message": message, "type": _VLLM_TYPES.get(status, "BadRequestError"), "param": None, "code": status}
        return JSONResponse({"error": body}, status_code=status, headers=headers)
    return error(status, kind, message, headers)


class ServerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("loracls_requests", "HTTP requests", ["route", "status"], registry=self.registry)
        self.texts = Counter("loracls_texts", "texts classified", ["model"], registry=self.registry)
        self.batch_size = Histogram(
            "loracls_batch_size",
            "texts per forward pass",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        )
        self.latency = Histogram(
            "loracls_request_latency_seconds",
            "request latency",
            ["route"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.queued = Gauge("loracls_queued_texts", "texts waiting or in the model", registry=self.registry)
        self._anchor_series()

    def _anchor_series(self) -> None:
        """The series TEI's and vLLM's dashboards read, by their names (beside loracls's own): TEI's te_* on its
        routes (/predict, /), vLLM's vllm:* on /classify. Durations in seconds."""
        registry, seconds = self.registry, (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
        # TEI's counters are exposed without prometheus_client's `_total` suffix (its Rust `metrics` crate adds
        # none): counted here as gauges that only go up, so `te_request_count` is the series a dashboard reads
        self.te_requests = Gauge("te_request_count", "TEI: requests", ["method"], registry=registry)
        self.te_success = Gauge("te_request_success", "TEI: requests answered", ["method"], registry=registry)
        self.te_predictions = Gauge("te_predict_count", "TEI: texts classified", ["method"], registry=registry)
        self.te_duration = {
            part: Histogram(
                f"te_request_{part}duration", f"TEI: {part or 'total '}time", registry=registry, buckets=seconds
            )
            for part in ("", "tokenization_", "queue_", "inference_")
        }
        self.vllm_latency = Histogram(
            "vllm:e2e_request_latency_seconds",
            "vLLM: request latency",
            ["model_name"],
            registry=registry,
            buckets=seconds,
        )
        self.vllm_prompt_tokens = Counter(
            "vllm:prompt_tokens", "vLLM: prompt tokens", ["model_name"], registry=registry
        )  # exposed as vllm:prompt_tokens_total
        self.vllm_success = Counter(
            "vllm:request_success", "vLLM: requests answered", ["model_name", "finished_reason"], registry=registry
        )  # exposed as vllm:request_success_total
        self.te_batch = Histogram(
            "te_batch_next_size", "TEI: texts per batch", registry=registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256)
        )
        self.te_queue = Gauge("te_queue_size", "TEI: texts waiting or in the model", registry=registry)
        self.vllm_waiting = Gauge("vllm:num_requests_waiting", "vLLM: texts waiting or in the model", registry=registry)

    def on_batch(self, size: int) -> None:
        self.batch_size.observe(size)
        self.te_batch.observe(size)

    def queue_from(self, read) -> None:
        for gauge in (self.queued, self.te_queue, self.vllm_waiting):
            gauge.set_function(read)


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes gets a JSON 413 before any of it is parsed."""

    class _TooLarge(Exception):
        pass

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        too_large = error_for(scope["path"], 413, "PayloadTooLarge", f"request body over {self.limit} bytes")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await too_large(scope, receive, send)
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise BodyLimit._TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except BodyLimit._TooLarge:
            await too_large(scope, receive, send)


BACKLOG = 2048  # connections the kernel queues before `serve` accepts them


def bound_socket(host: str, port: int):
    """A TCP socket bound to host:port (port 0: a free one), not yet listening: `loracls serve` binds before the
    model loads, so a taken port or an unknown host is one line at once, and listens when it can answer.
    Its proto must say TCP (not 0): asyncio sets TCP_NODELAY only on accepted sockets that do, and without it
    every response waited ~40 ms for Nagle's algorithm and the client's delayed ACK (measured here: GET /health
    44 ms, 1.9 ms with it; POST /classify 140 ms, 91 ms)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:  # a port taken or not ours, a host that is no address of this machine
        sock.close()
        raise LoraclsError(f"serve: cannot listen on {host}:{port}: {exc.strerror or first_line(exc)}") from None
    return sock


HEADER_TIMEOUT_S = 10.0  # a connection that sends no byte for this long is closed (nginx: client_header_timeout)
FD_RESERVE = 64  # descriptors kept free for the model's files, logs and the next accept


def raise_open_files() -> int:
    """The soft limit of open descriptors raised to the hard one (as servers do at start); returns it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def idle_guarded(max_connections: int, header_timeout_s: float = HEADER_TIMEOUT_S):
    """uvicorn's HTTP protocol class with two guards against connections that send nothing (1,100 of them
    once took every descriptor, and no request was answered): one that sends no byte within
    `header_timeout_s` is closed, and at `max_connections` open ones the oldest silent connection is closed to
    make room, so a real request (or /health) always gets in."""
    import asyncio
    from collections import OrderedDict

    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    silent: OrderedDict = OrderedDict()  # connections that have not sent a byte, oldest first
    open_count = [0]

    class IdleGuarded(AutoHTTPProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:
            open_count[0] += 1
            while open_count[0] > max_connections and silent:
                oldest, _ = silent.popitem(last=False)
                oldest._close_silent()
            super().connection_made(transport)
            silent[self] = asyncio.get_running_loop().call_later(header_timeout_s, self._close_silent)

        def data_received(self, data: bytes) -> None:
            timer = silent.pop(self, None)
            if timer is not None:
                timer.cancel()
            super().data_received(data)

        def connection_lost(self, exc) -> None:
            open_count[0] -= 1
            timer = silent.pop(self, None)
            if timer is not None:
                timer.cancel()
            super().connection_lost(exc)

        def _close_silent(self) -> None:
            timer = silent.pop(self, None)
            if timer is not None:
                timer.cancel()
            if not self.transport.is_closing():
                self.transport.close()

    return IdleGuarded


def main_problem(problems: list[dict]) -> dict:
    """The one validation error to name: in a union of request shapes (/tokenize: TEI's or vLLM's) the shape
    with the fewest errors is the one the client meant; in it, a field we do not implement comes first."""
    if not problems:
        return {"loc": (), "msg": "invalid request"}
    shapes: dict = {}
    for problem in problems:
        loc = problem.get("loc", ())
        shape = loc[1] if len(loc) > 1 and str(loc[1])[:1].isupper() else None
        shapes.setdefault(shape, []).append(problem)
    closest = min(shapes.values(), key=len)
    return next((p for p in closest if p.get("type") == "extra_forbidden"), closest[0])
