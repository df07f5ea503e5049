"""The serving contract, in-process (httpx's ASGI transport, no port) with a fake classifier: every status of
loracls.inference.protocol, TEI's error body on every error, the batcher's error path and deadline flush,
multi-label, chunks, a wrong model name, /openapi.json, and a bounded hypothesis run that finds no 500."""

import asyncio
import json
import threading
import zlib
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_tokenizer
from loracls.data.batching import Encoded
from loracls.inference.server import create_app
from loracls.problems import Decision


def _word_id(word):
    """A stable id per word ("good" is 2, never shared): str hash() changes per process and once made "bad" good."""
    return 2 if word == "good" else 3 + zlib.crc32(word.encode()) % 90


class FakeClassifier:
    """Scores a text by its words: "good" pushes towards pos. "FAIL" in a batch makes the model raise. An
    Engine as the server uses one (loracls.inference.engine.Engine)."""

    writes_comments = False

    def served_runs(self):
        return {self.name: self}

    def score(self, ids, models, max_tokens=None):
        return self.logits(ids, max_tokens=max_tokens)

    def __init__(self, multi_label=False, long_text="truncate", max_length=8, gate=None):
        self.name, self.source, self.input_template = "fake", "memory", None
        self.labels = ["neg", "pos"] if not multi_label else ["joy", "fear", "anger"]
        self.max_length, self.long_text, self.precision = max_length, long_text, "float32"
        self.multi_label = multi_label
        self.decision = Decision("multi_label" if multi_label else "single_label", thresholds=None)
        self.id2label = dict(enumerate(self.labels))
        self.temperature = None if multi_label else 1.0
        self.runtime = SimpleNamespace(device="cpu")
        self.batches, self.gate = [], gate
        self.tokenizer = make_tokenizer()  # /tokenize and /decode

    def encode(self, texts):
        words = [text.split() for text in texts]
        long = [len(w) > self.max_length for w in words]
        if self.long_text != "chunks":
            return Encoded(
                [[_word_id(x) for x in w[: self.max_length]] + [1] for w in words], list(range(len(texts))), long
            )
        ids, owner = [], []
        for i, w in enumerate(words):
            for start in range(0, max(len(w), 1), self.max_length):
                ids.append([2 if x == "good" else 3 for x in w[start : start + self.max_length]] or [3])
                owner.append(i)
        return Encoded(ids, owner, long)

    def logits(self, ids, max_tokens=None):
        if self.gate is not None:
            self.gate.wait(60)
        self.batches.append(len(ids))
        if any(row[:1] == [-1] for row in ids):
            raise RuntimeError("the model failed")
        good = np.array([sum(1 for x in row if x == 2) for row in ids], dtype=float)
        columns = [-good, good] if not self.multi_label else [good, -good, 0 * good]
        return np.stack(columns, axis=1)

    def calibrated(self, logits):
        if self.multi_label:
            return 1 / (1 + np.exp(-logits))
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        return exp / exp.sum(axis=1, keepdims=True)

    def predicted(self, probs):
        return [label for label, p in zip(self.labels, probs) if p >= 0.5]


@asynccontextmanager
async def serving(classifier, **options):
    wrapped = create_app(classifier, **options)
    async with wrapped.app.router.lifespan_context(wrapped.app):  # the batcher runs as under uvicorn
        transport = httpx.ASGITransport(app=wrapped)
        async with httpx.AsyncClient(transport=transport, base_url="http://loracls") as client:
            yield client


def ask(classifier, requests, **options):
    """Send (method, path, json-or-bytes) requests one after another; the responses."""

    async def scenario():
        async with serving(classifier, **options) as client:
            out = []
            for method, path, body in requests:
                if isinstance(body, bytes):
                    out.append(
                        await client.request(method, path, content=body, headers={"content-type": "application/json"})
                    )
                else:
                    out.append(await client.request(method, path, json=body))
            return out

    return asyncio.run(scenario())


VLLM_ROUTES = ("/classify", "/v1/classify", "/v1/models", "/detokenize")


def is_error(response, status, kind):
    """TEI's body on TEI's routes; vLLM's ({"error": {"message", "type", "param", "code"}}) on vLLM's."""
    body = response.json()
    if response.request.url.path.startswith(VLLM_ROUTES):
        inner = body.get("error")
        return (
            response.status_code == status
            and set(body) == {"error"}
            and set(inner) == {"message", "type", "param", "code"}
            and inner["code"] == status
            and inner["message"]
        )
    return response.status_code == status and set(body) == {"error", "error_type"} and body["error_type"] == kind


def message_of(response) -> str:
    body = response.json()
    return body["error"]["message"] if isinstance(body["error"], dict) else body["error"]


def test_classify_and_predict_shapes():
    fake = FakeClassifier()
    classify, predict, one = ask(
        fake,
        [
            ("POST", "/classify", {"model": "fake", "input": ["good film", "bad"]}),
            ("POST", "/predict", {"inputs": ["good film"]}),
            ("POST", "/predict", {"inputs": "bad film", "raw_scores": True}),
        ],
    )
    body = classify.json()
    assert classify.status_code == 200 and body["object"] == "list" and body["model"] == "fake"
    assert [item["label"] for item in body["data"]] == ["pos", "neg"] and "labels" not in body["data"][0]
    assert body["usage"]["truncated_inputs"] == 0 and body["usage"]["prompt_tokens"] == 5
    assert [row["label"] for row in predict.json()[0]] == ["pos", "neg"]
    assert one.json()[0]["score"] == 0.0 and predict.headers["X-Truncated-Inputs"] == "0"


def test_top_k_keeps_the_k_most_probable_labels():
    fake = FakeClassifier()
    classify, predict, plain = ask(
        fake,
        [
            ("POST", "/classify", {"input": ["good film"], "top_k": 1}),
            ("POST", "/predict", {"inputs": ["good film", "bad"], "top_k": 1}),
            ("POST", "/classify", {"input": ["good film"]}),
        ],
    )
    item = classify.json()["data"][0]
    assert [row["label"] for row in item["top"]] == ["pos"] and item["top"][0]["score"] == max(item["probs"])
    assert [[row["label"] for row in rows] for rows in predict.json()] == [["pos"], ["neg"]]
    assert "top" not in plain.json()["data"][0]


@pytest.mark.parametrize(
    "method, path, body, status, kind",
    [
        ("POST", "/classify", {"model": "other", "input": "good"}, 404, "NotFound"),
        ("POST", "/generate", {"inputs": "good"}, 404, "NotFound"),  # a classifier writes no comments
        ("POST", "/generate", {"inputs": "good", "model": "other"}, 404, "NotFound"),  # no run of that name
        ("GET", "/nowhere", None, 404, "NotFound"),
        ("GET", "/classify", None, 405, "MethodNotAllowed"),
        ("POST", "/classify", b"{not json", 422, "Validation"),
        ("POST", "/classify", b'{"input": "\\ud800 lone"}', 422, "Validation"),
        ("POST", "/predict", b'{"inputs": ["ok", "\\udfff"]}', 422, "Validation"),
        ("POST", "/classify", {"input": []}, 422, "Validation"),
        ("POST", "/classify", {"input": ["good"] * 33}, 413, "Validation"),
        (
            "POST",
            "/predict",
            {"inputs": "one two three four five six seven eight nine", "truncate": False},
            413,
            "Validation",
        ),
        ("POST", "/classify", {"input": "FAIL"}, 500, "Backend"),
    ],
)
def test_every_error_is_teis_body_with_its_status_and_the_server_keeps_serving(method, path, body, status, kind):
    fake = FakeClassifier()
    if body == {"input": "FAIL"}:
        fake.encode = lambda texts, encode=fake.encode: (
            Encoded([[-1]], [0], [False]) if texts == ["FAIL"] else encode(texts)
        )
    response, after = ask(fake, [(method, path, body), ("POST", "/classify", {"input": "good film"})])
    assert is_error(response, status, kind), (response.status_code, response.text)
    assert after.status_code == 200
    if status == 422 and isinstance(body, bytes) and b"\\u" in body:
        assert "not valid Unicode" in message_of(response)


def test_more_texts_than_the_queue_can_ever_hold_is_413_not_a_retry_loop():
    (response,) = ask(
        FakeClassifier(), [("POST", "/classify", {"input": ["good"] * 10})], max_queue=8, max_client_batch_size=64
    )
    assert is_error(response, 413, "Validation") and "queue holds at most 8" in message_of(response)


def test_a_full_queue_is_429_with_retry_after_and_retrying_succeeds():
    gate = threading.Event()
    fake = FakeClassifier(gate=gate)

    async def scenario():
        async with serving(fake, max_queue=4, max_batch_size=4, max_wait_ms=1.0) as client:
            first = asyncio.create_task(client.post("/classify", json={"input": ["good"] * 4}))
            for _ in range(6000):  # until the four texts are queued or in the model
                if (await client.get("/metrics")).text.count("loracls_queued_texts 4.0"):
                    break
                await asyncio.sleep(0.01)
            busy = await client.post("/classify", json={"input": "good"})
            gate.set()
            done = await first
            again = await client.post("/classify", json={"input": "good"})
            return busy, done, again

    busy, done, again = asyncio.run(scenario())
    assert is_error(busy, 429, "Overloaded") and busy.headers["Retry-After"] == "1"
    assert done.status_code == 200 and again.status_code == 200


def test_a_lone_request_is_flushed_at_the_deadline_not_held_for_a_full_batch():
    fake = FakeClassifier()
    (response,) = ask(fake, [("POST", "/classify", {"input": ["good", "bad"]})], max_batch_size=64, max_wait_ms=20)
    assert response.status_code == 200 and fake.batches == [2]


def test_multi_label_items_hold_the_label_set():
    (response,) = ask(FakeClassifier(multi_label=True), [("POST", "/classify", {"input": ["good film", "bad"]})])
    items = response.json()["data"]
    assert items[0]["labels"] == ["joy", "anger"] and items[1]["labels"] == ["joy", "fear", "anger"]  # all at 0.5
    assert len(items[0]["probs"]) == 3 and items[0]["num_classes"] == 3


def test_chunks_average_the_windows_of_a_long_text():
    fake = FakeClassifier(long_text="chunks", max_length=2)
    (response,) = ask(fake, [("POST", "/classify", {"input": "good good bad bad"})])
    body = response.json()
    assert body["usage"]["long_inputs"] == 1 and body["usage"]["truncated_inputs"] == 0
    assert fake.batches == [2]  # two windows, one text
    low = 1 / (1 + np.exp(2.0))  # the windows' logits [-2, 2] and [0, 0] averaged: [-1, 1]
    assert body["data"][0]["probs"] == pytest.approx([low, 1 - low])


def test_openapi_documents_every_route_field_and_status():
    (spec,) = ask(FakeClassifier(), [("GET", "/openapi.json", None)])
    paths = spec.json()["paths"]
    assert {"/classify", "/predict", "/health", "/info", "/metrics"} <= set(paths)
    assert set(paths["/classify"]["post"]["responses"]) == {"200", "404", "413", "422", "429", "500"}
    assert set(paths["/predict"]["post"]["responses"]) == {"200", "404", "413", "422", "429", "500"}
    schemas = spec.json()["components"]["schemas"]
    assert {"ClassifyRequest", "ClassifyResponse", "ErrorResponse", "PredictRequest", "InfoResponse"} <= set(schemas)
    assert set(schemas["ErrorResponse"]["properties"]) == {"error", "error_type"}


def test_prometheus_labels_are_route_templates_not_raw_paths():
    *_, metrics = ask(FakeClassifier(), [("GET", f"/random/{i}", None) for i in range(3)] + [("GET", "/metrics", None)])
    assert 'route="unmatched",status="404"} 3.0' in metrics.text and "/random/" not in metrics.text


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
BODIES = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"input": st.one_of(st.text(), st.lists(st.text(), max_size=40), JSON)},
        optional={"model": st.one_of(st.none(), st.text(max_size=8), JSON)},
    ),
    st.fixed_dictionaries(
        {"inputs": st.one_of(st.text(), st.lists(st.text(), max_size=40), JSON)},
        optional={"raw_scores": JSON, "truncate": JSON},
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(route=st.sampled_from(["/classify", "/predict"]), body=BODIES, surrogate=st.booleans())
def test_no_request_body_makes_a_500(route, body, surrogate):
    raw = json.dumps(body)
    if surrogate:  # JSON may escape a lone surrogate, which is no valid Unicode text
        raw = raw.replace('"', '"\\ud83d', 1) if '"' in raw else raw
    (response,) = ask(FakeClassifier(), [("POST", route, raw.encode())], max_client_batch_size=32)
    assert response.status_code in (200, 404, 413, 422), (response.status_code, response.text)
    if response.status_code != 200:
        assert is_error(response, response.status_code, response.json().get("error_type"))


HOSTILE_REQUESTS = yaml.safe_load((Path(__file__).parent / "hostile" / "serve_requests.yaml").read_text())


@pytest.mark.parametrize("case", HOSTILE_REQUESTS, ids=lambda case: f"{case['path']}-{case['status']}")
def test_hostile_requests_get_their_status_and_the_routes_error_body(case):
    body = case["raw"].encode("utf-8", "surrogatepass") if "raw" in case else case["json"]
    if "raw" in case and "not utf-8" in case["raw"]:
        body = b"\xff\xfe not utf-8"
    response, after = ask(FakeClassifier(), [("POST", case["path"], body), ("POST", "/classify", {"input": "good"})])
    assert response.status_code == case["status"], response.text
    assert is_error(response, case["status"], response.json().get("error_type")) and message_of(response)
    assert after.status_code == 200
