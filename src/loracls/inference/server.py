"""`loracls serve`: the classifier over HTTP in the shapes clients already speak, so a client written for
vLLM or text-embeddings-inference works unchanged:

- `POST /classify` (vLLM): `{"model", "input": str | [str]}` -> `{"id", "object", "created", "model",
  "data": [{"index", "label", "probs", "num_classes"}], "usage": {...}}`; a multi_label model's items also
  hold `labels`, the set at or above the per-label thresholds, and its `probs` are per-label sigmoids
- `POST /predict` (TEI): `{"inputs": str | [str], "raw_scores", "truncate"}` -> `[{"label", "score"}, ...]`
  sorted by score (a list of such lists for a list of inputs)
- `POST /` (TEI's task route, in the Inference API's shape that huggingface_hub's InferenceClient reads),
  `POST /tokenize`, `/decode`, `/detokenize` (inference/tokens.py), `GET /v1/models` (vLLM, openai)
- `GET /health`, `GET /info` (TEI's fields and ours), `GET /metrics` (Prometheus text format)

Texts longer than max_length are truncated exactly as in training (`usage.truncated_inputs`, and the
`X-Truncated-Inputs` header on /predict); TEI's `"truncate": false` turns that into a 413 instead. Every
error is TEI's `{"error", "error_type"}` and the server keeps serving; the statuses are listed in
`loracls.inference.protocol` and documented in `/openapi.json`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import numpy as np
from fastapi import APIRouter, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from loracls.errors import CutNotHere, Log, NoTokens, first_line
from loracls.inference.batcher import Batcher, Overloaded, TooLarge

if TYPE_CHECKING:
    pass
from loracls import __version__
from loracls.inference import tokens
from loracls.inference.http import BACKLOG, BodyLimit, ServerMetrics, error_for, main_problem
from loracls.inference.protocol import (
    ERRORS,
    ClassifyItem,
    ClassifyRequest,
    ClassifyResponse,
    Generated,
    GenerateRequest,
    HealthResponse,
    InfoResponse,
    LabelScore,
    ModelCard,
    ModelList,
    PredictRequest,
    RootRequest,
    TeiModelType,
    Usage,
)
from loracls.inference.served import (
    APP_LIMITS,
    MAX_CLIENT_BATCH_SIZE,
    SERVE_MAX_TOKENS,
    Served,
    ServeLimits,
    Serving,
    TooManyTexts,
    UnknownModel,
    encoded_off_loop,
    logits_of,
    tei_timing,
)


class _InputTooLong(Exception):
    """/predict with `truncate: false` and a text longer than max_length (HTTP 413, as TEI)."""


class _NotAGenerator(Exception):
    """/generate asked of a classifier run (HTTP 404: no such generator served)."""


def create_app(
    classifier,
    max_batch_size: int = 64,
    max_wait_ms: float = 5.0,
    max_queue: int = 4096,
    max_body_bytes: int = 4 * 2**20,
    max_client_batch_size: int = MAX_CLIENT_BATCH_SIZE,
) -> FastAPI:
    metrics, served = ServerMetrics(), Served(classifier)
    batcher = Batcher(served.score, max_batch_size, max_wait_ms, max_queue, metrics.on_batch)
    metrics.queue_from(lambda: batcher.queued_texts)

    @asynccontextmanager
    async def lifespan(app):
        await batcher.start()
        yield
        await batcher.stop()  # after the server stopped accepting: what is in flight is answered

    app = FastAPI(title="loracls", lifespan=lifespan)
    app.state.served, app.state.batcher, app.state.metrics = served, batcher, metrics
    app.state.max_client_batch_size = max_client_batch_size
    app.state.created = int(time.time())  # /v1/models' `created`: when this server loaded its runs
    app.include_router(router)
    app.include_router(tokens.router)
    _error_handlers(app)

    @app.middleware("http")
    async def count(request: Request, call_next):
        started = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception as exc:  # a failure of ours or of the model: a 500 in TEI's shape, one log line
            print(
                f"loracls serve: 500 on {request.url.path}: {type(exc).__name__}: {first_line(exc, 200)}",
                file=sys.stderr,
            )
            response = error_for(request.url.path, 500, "Backend", f"{type(exc).__name__}: {first_line(exc, 200)}")
        route = request.scope.get("route")  # the route's template: an unknown path makes no new series
        name = route.path if route is not None else "unmatched"
        metrics.requests.labels(name, str(response.status_code)).inc()
        metrics.latency.labels(name).observe(time.perf_counter() - started)
        return response

    return BodyLimit(app, max_body_bytes)


def _usage(classifier, encoded) -> Usage:
    long = sum(encoded.long)
    return Usage(
        prompt_tokens=encoded.tokens,
        total_tokens=encoded.tokens,
        max_length=classifier.max_length,
        long_text=classifier.long_text,
        long_inputs=long,
        truncated_inputs=0 if classifier.long_text == "chunks" else long,
    )


def _classified(classifier, index: int, probs: np.ndarray, top_k: int | None) -> ClassifyItem:
    """One /classify item: vLLM's fields (`label` the most probable label), plus for multi_label `labels`,
    every label at or above its threshold (maybe none), and with `top_k` the k most probable labels."""
    extra = classifier.decision.kind.served_fields(probs, classifier.decision, classifier.id2label)
    label = classifier.labels[int(probs.argmax())]
    top = _ranked(classifier.labels, probs)[:top_k] if top_k is not None else None
    return ClassifyItem(
        index=index, label=label, probs=[float(p) for p in probs], num_classes=len(probs), top=top, **extra
    )


def _ranked(labels: list[str], scores) -> list[LabelScore]:
    return sorted((LabelScore(label=labels[k], score=float(s)) for k, s in enumerate(scores)), key=lambda r: -r.score)


async def _comments(classifier, texts: list[str], chosen) -> list[str]:
    """label_and_comment: each text's comment, generated after its chosen label (off the event loop)."""
    return await asyncio.get_running_loop().run_in_executor(None, classifier.comments, texts, chosen)


router = APIRouter()
MODEL_QUERY = Query(None, description="the run to ask (`GET /v1/models`); none: the first served")
MODEL_HEADER = Header(None, description="the same as the `model` query, for clients that set headers")


@router.post("/v1/classify", response_model_exclude_none=True, responses=ERRORS["classify"], include_in_schema=False)
@router.post("/classify", response_model_exclude_none=True, responses=ERRORS["classify"])
async def classify(body: ClassifyRequest, request: Request) -> ClassifyResponse:
    started, serving = time.perf_counter(), Serving(request)
    classifier = serving.served.pick(body.model)
    texts = serving.texts(body.input)
    last = body.truncate_prompt_tokens
    encoded = await encoded_off_loop(classifier, texts, **({"last_tokens": last} if last not in (None, -1) else {}))
    if body.use_activation is False:  # vLLM: the raw scores, no softmax / sigmoid
        probs = np.asarray(await logits_of(serving.batcher, classifier, encoded, serving.metrics))
    else:
        probs = await serving.probabilities(classifier, encoded)
    items = [_classified(classifier, i, row, body.top_k) for i, row in enumerate(probs)]
    if classifier.writes_comments:  # label_and_comment: generated after the label
        for item, comment in zip(items, await _comments(classifier, texts, classifier.decision.chosen(probs))):
            item.comment = comment
    usage = _usage(classifier, encoded)
    serving.metrics.vllm_prompt_tokens.labels(classifier.name).inc(usage.prompt_tokens)
    serving.metrics.vllm_success.labels(classifier.name, "stop").inc()
    serving.metrics.vllm_latency.labels(classifier.name).observe(time.perf_counter() - started)
    return ClassifyResponse(
        id=f"classify-{uuid.uuid4().hex}", created=int(time.time()), model=classifier.name, data=items, usage=usage,
    )  # fmt: skip


@router.post("/predict", response_model=list[LabelScore] | list[list[LabelScore]], responses=ERRORS["predict"])
async def predict(
    body: PredictRequest, request: Request, model: str | None = MODEL_QUERY, x_model: str | None = MODEL_HEADER
):
    return await _predicted(body, Serving(request), model or x_model, nested=False)


@router.post("/", response_model=list[list[LabelScore]], responses=ERRORS["root"])
async def root(
    body: RootRequest, request: Request, model: str | None = MODEL_QUERY, x_model: str | None = MODEL_HEADER
):
    """TEI's route for the model's task (text classification here), answered as the Hugging Face Inference API
    answers it: a list of `{label, score}` lists, one per text, even for one text (huggingface_hub's
    `InferenceClient(url).text_classification` reads the first); `parameters.top_k` keeps the k best;
    `parameters.function_to_apply: "none"` gives raw scores."""
    parameters = body.parameters
    if parameters is not None:
        changes = {"raw_scores": body.raw_scores or parameters.function_to_apply == "none"}
        if parameters.top_k is not None:
            changes["top_k"] = parameters.top_k
        body = body.model_copy(update=changes)
    return await _predicted(body, Serving(request), model or x_model, nested=True)


async def _predicted(body: PredictRequest, serving: Serving, model: str | None, nested: bool) -> JSONResponse:
    """TEI's /predict: each text's labels by score (`nested`: a list of lists even for one text), with TEI's
    timing headers and te_* series."""
    started, timing = time.perf_counter(), {}
    classifier = serving.served.pick(model)
    texts = serving.texts(body.inputs)
    method = "single" if isinstance(body.inputs, str) else "batch"
    serving.metrics.te_requests.labels(method).inc()
    left = body.truncation_direction.lower() == "left"
    encoded = await encoded_off_loop(classifier, texts, **({"keep_end": True} if left else {}))
    timing["tokenization"] = time.perf_counter() - started
    if body.truncate is False and classifier.long_text != "chunks" and any(encoded.long):
        raise _InputTooLong(
            f"input {encoded.long.index(True)} is longer than max_length {classifier.max_length} tokens and "
            f"truncate is false"
        )
    logits = await logits_of(serving.batcher, classifier, encoded, serving.metrics, timing)
    scores, labels = (logits if body.raw_scores else classifier.calibrated(logits)), classifier.labels
    rows = [[item.model_dump() for item in _ranked(labels, row)[: body.top_k]] for row in np.asarray(scores)]
    timing[""] = time.perf_counter() - started
    headers = {"X-Truncated-Inputs": str(_usage(classifier, encoded).truncated_inputs)}
    headers |= tei_timing(serving.metrics, method, timing, sum(map(len, texts)), encoded.tokens, len(texts))
    single = isinstance(body.inputs, str) and not nested
    return JSONResponse(rows[0] if single else rows, headers=headers)


@router.post("/generate", responses=ERRORS["generate"])
async def generate(
    body: GenerateRequest, request: Request, model: str | None = MODEL_QUERY, x_model: str | None = MODEL_HEADER
) -> list[Generated]:
    """label_and_comment runs: each text's label (scored, calibrated) and the comment written after it;
    the run picked like every other route's (body `model`, `model` query or `X-Model` header)."""
    serving = Serving(request)
    classifier = serving.served.pick(body.model or model or x_model)
    if not classifier.writes_comments:
        raise _NotAGenerator(f"`{classifier.name}` is a classifier: /generate serves label_and_comment runs")
    texts, labels = serving.texts(body.inputs), classifier.labels
    probs = await serving.probabilities(classifier, await encoded_off_loop(classifier, texts))
    chosen = classifier.decision.chosen(probs)
    comments = await _comments(classifier, texts, chosen)
    return [
        Generated(label=labels[int(k)], probabilities=dict(zip(labels, map(float, row))), comment=comment)
        for k, row, comment in zip(chosen, probs, comments)
    ]


@router.get("/health")
async def health() -> HealthResponse:
    return HealthResponse()


@router.get("/v1/models")
async def models(request: Request) -> ModelList:
    """The served runs, as vLLM and OpenAI list models."""
    runs, created = Serving(request).served.runs, request.app.state.created
    return ModelList(data=[ModelCard(id=name, root=run.source, created=created) for name, run in runs.items()])


@router.get("/v1/models/{model_id:path}", responses=ERRORS["classify"])
async def model(model_id: str, request: Request) -> ModelCard:
    """One served run (the openai SDK's `models.retrieve`); another name is a 404."""
    run = Serving(request).served.pick(model_id)
    return ModelCard(id=model_id, root=run.source, created=request.app.state.created)


@router.get("/info", responses=ERRORS["info"])
async def info(
    request: Request, model: str | None = Query(None, description="the run to describe; none: the first served")
) -> InfoResponse:
    serving = Serving(request)
    classifier, batcher = serving.served.pick(model), serving.batcher
    return InfoResponse(
        model_id=classifier.source,
        model_dtype=classifier.precision,
        model_type=TeiModelType(
            classifier={
                "id2label": {str(i): name for i, name in classifier.id2label.items()},
                "label2id": {name: i for i, name in classifier.id2label.items()},
            }
        ),
        max_concurrent_requests=batcher.max_queue,
        max_input_length=classifier.max_length,
        max_batch_tokens=SERVE_MAX_TOKENS,
        max_batch_requests=batcher.max_batch_size,
        auto_truncate=True,
        version=__version__,
        model=classifier.name,
        models=list(serving.served.runs),
        source=classifier.source,
        labels=classifier.labels,
        max_length=classifier.max_length,
        input_template=classifier.input_template,
        problem=classifier.decision.problem,
        temperature=classifier.temperature,
        thresholds=classifier.decision.thresholds,
        long_text=classifier.long_text,
        precision=classifier.precision,
        device=str(classifier.runtime.device),
        max_batch_size=batcher.max_batch_size,
        max_client_batch_size=serving.max_client_batch_size,
        max_wait_ms=batcher.max_wait * 1000,
        max_queue=batcher.max_queue,
    )


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def prometheus(request: Request):
    return Response(generate_latest(Serving(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


_HTTP_KINDS = {404: "NotFound", 405: "MethodNotAllowed", 413: "Validation"}


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        problem = main_problem(list(exc.errors()))
        where = ".".join(str(p) for p in problem.get("loc", ()) if p != "body")
        message = f"{where}: {problem.get('msg')}" if where else str(problem.get("msg"))
        return error_for(request.url.path, 422, "Validation", message)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # unknown routes, wrong methods
        return error_for(
            request.url.path,
            exc.status_code,
            _HTTP_KINDS.get(exc.status_code, "Validation"),
            str(exc.detail),
            headers=getattr(exc, "headers", None),
        )

    for kind in ERROR_STATUS:
        app.add_exception_handler(kind, _mapped_error)


# every error of ours that a request can cause -> (HTTP status, TEI's error_type); one place, TEI's pattern
ERROR_STATUS: dict[type, tuple[int, str]] = {
    TooManyTexts: (413, "Validation"),
    CutNotHere: (422, "Validation"),  # truncation_direction / truncate_prompt_tokens a run cannot apply
    NoTokens: (422, "Validation"),  # a text that encodes to nothing: named, never a 500 or a silent 0.5
    tokens.BadTokenIds: (422, "Validation"),
    _InputTooLong: (413, "Validation"),
    _NotAGenerator: (404, "NotFound"),
    TooLarge: (413, "Validation"),
    UnknownModel: (404, "NotFound"),
    Overloaded: (429, "Overloaded"),
}
_RETRY_LATER = {Overloaded: {"Retry-After": "1"}}


async def _mapped_error(request: Request, exc: Exception):
    status, kind = next(ERROR_STATUS[k] for k in type(exc).__mro__ if k in ERROR_STATUS)
    message = f"server busy: {exc}; retry later" if isinstance(exc, Overloaded) else str(exc)
    return error_for(request.url.path, status, kind, message, headers=_RETRY_LATER.get(type(exc)))


def serve(classifier, sock, limits: ServeLimits = ServeLimits(), log: Log = print) -> None:
    """Serve on `sock` (http.bound_socket's) until SIGTERM / Ctrl-C: then stop accepting, answer what is in
    flight, and return."""
    import signal

    import uvicorn

    app = create_app(classifier, **{k: v for k, v in dataclasses.asdict(limits).items() if k in APP_LIMITS})
    from loracls.inference.http import FD_RESERVE, idle_guarded, raise_open_files

    connections = limits.max_connections or max(raise_open_files() - FD_RESERVE, 16)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            timeout_graceful_shutdown=30,
            http=idle_guarded(connections, limits.header_timeout_s),
            timeout_keep_alive=5,  # uvicorn's: a kept-alive connection idle this long after a response is closed
        )
    )
    # a SIGTERM / SIGINT before uvicorn's own handlers are in place (it loads, then takes the signals) stops the
    # server as theirs would. After a graceful shutdown uvicorn raises the signal again for the handlers it
    # found: these then only set a flag on a stopped server, and `serve` returns (exit code 0)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
    sock.listen(BACKLOG)  # before the address is printed: a client that connects at once is queued, not refused
    host, port = sock.getsockname()[:2]
    host = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL
    runs = Served(classifier).runs
    first = next(iter(runs.values()))
    log(
        f"serve: {'; '.join(f'{name} ({chr(44).join(run.labels)})' for name, run in runs.items())} on "
        f"{first.runtime.device}, {first.precision}; listening on http://{host}:{port} (max batch "
        f"{limits.max_batch_size}, max wait {limits.max_wait_ms:g} ms)"
    )
    server.run(sockets=[sock])
    log("serve: stopped; requests in flight were answered")
