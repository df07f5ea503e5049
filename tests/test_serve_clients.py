"""The clients people already use, against `loracls serve`: huggingface_hub's InferenceClient pointed at the
server's root URL (POST /, its top_k and the errors it raises on 413 / 422 / 429), the openai client's
models.list(), and TEI's and vLLM's /tokenize, /decode, /detokenize and /info fields. The model-free cases run
on a real HTTP server in a thread (uvicorn, a fake classifier with a real tokenizer); the wiring runs against a
real `loracls serve` process (tests/test_serve.py's server)."""

import contextlib
import threading
import time

import httpx
import pytest
import uvicorn
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError

from conftest import make_tokenizer
from loracls.inference.http import BACKLOG, bound_socket
from loracls.inference.server import create_app
from test_serve_contract import FakeClassifier, ask, is_error


def _fake():
    fake = FakeClassifier()
    fake.tokenizer = make_tokenizer()
    return fake


@contextlib.contextmanager
def http_server(classifier, **options):
    """create_app on a free port of 127.0.0.1 in a thread; yields its URL."""
    sock = bound_socket("127.0.0.1", 0)
    sock.listen(BACKLOG)  # as `serve` does
    server = uvicorn.Server(uvicorn.Config(create_app(classifier, **options), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 600  # only against a hang: a busy machine may take long to start
    while not server.started and thread.is_alive() and time.time() < deadline:
        time.sleep(0.01)
    assert server.started, "the server did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(60)


def test_huggingface_hubs_inference_client_classifies_at_the_root_url():
    with http_server(_fake()) as url:
        client = InferenceClient(url)
        labels = client.text_classification("good good film")
        assert [(e.label, round(e.score, 3)) for e in labels][0][0] == "pos" and len(labels) == 2
        assert labels[0].score > labels[1].score and abs(sum(e.score for e in labels) - 1) < 1e-6
        assert [e.label for e in client.text_classification("bad film", top_k=1)] == ["neg"]
        with pytest.raises(HfHubHTTPError) as invalid:
            client.text_classification("   ")
        assert invalid.value.response.status_code == 422


def test_the_inference_client_sees_413_and_429():
    gate, fake = threading.Event(), _fake()
    fake.gate = gate
    with http_server(fake, max_queue=1, max_batch_size=1, max_wait_ms=1.0, max_body_bytes=2000) as url:
        client = InferenceClient(url)
        with pytest.raises(HfHubHTTPError) as too_large:
            client.text_classification("good " * 1000)
        assert too_large.value.response.status_code == 413
        first = threading.Thread(target=client.text_classification, args=("good",))
        first.start()  # held in the model by the gate: its text fills the queue of one
        deadline = time.time() + 600  # only against a hang
        while "loracls_queued_texts 1.0" not in httpx.get(f"{url}/metrics").text and time.time() < deadline:
            time.sleep(0.01)
        with pytest.raises(HfHubHTTPError) as busy:
            client.text_classification("good")
        assert busy.value.response.status_code == 429 and busy.value.response.headers["Retry-After"] == "1"
        gate.set()
        first.join(60)
        assert client.text_classification("good")[0].label == "pos"  # retrying later succeeds


def test_tokenize_and_decode_in_tei_and_vllm_shapes():
    fake = _fake()
    text = "good film and more"
    tei, vllm, decoded, several, detok, bad_id, unknown, info = ask(
        fake,
        [
            ("POST", "/tokenize", {"inputs": text}),
            ("POST", "/tokenize", {"prompt": text, "model": "fake"}),
            ("POST", "/decode", {"ids": [4, 20]}),
            ("POST", "/decode", {"ids": [[4], [20]]}),
            ("POST", "/detokenize", {"tokens": [4, 20]}),
            ("POST", "/decode", {"ids": [10**9]}),
            ("POST", "/tokenize?model=other", {"inputs": text}),
            ("GET", "/info", None),
        ],
    )
    (tokens,) = tei.json()
    assert all(text[t["start"] : t["stop"]] == t["text"] for t in tokens if not t["special"])
    ids = [t["id"] for t in tokens]
    assert vllm.json() == {"count": len(ids), "max_model_len": 8, "tokens": ids, "token_strs": None}
    assert decoded.json() == [fake.tokenizer.decode([4, 20], skip_special_tokens=True)]
    assert several.json() == [fake.tokenizer.decode([4]), fake.tokenizer.decode([20])]
    assert detok.json() == {"prompt": decoded.json()[0]}
    assert is_error(bad_id, 422, "Validation") and is_error(unknown, 404, "NotFound")
    body = info.json()
    assert body["model_type"] == {
        "classifier": {"id2label": {"0": "neg", "1": "pos"}, "label2id": {"neg": 0, "pos": 1}}
    }
    assert body["max_input_length"] == 8 and body["max_client_batch_size"] == 32 and body["auto_truncate"] is True
    assert body["model_id"] == "memory" and body["version"]


def test_the_root_route_is_the_inference_apis_shape_with_teis_options():
    one, several, raw, top = ask(
        _fake(),
        [
            ("POST", "/", {"inputs": "good film"}),
            ("POST", "/", {"inputs": ["good film", "bad"]}),
            ("POST", "/", {"inputs": "good film", "parameters": {"function_to_apply": "none"}}),
            ("POST", "/", {"inputs": ["good film"], "parameters": {"top_k": 1}}),
        ],
    )
    assert one.status_code == 200 and len(one.json()) == 1 and one.json()[0][0]["label"] == "pos"
    assert [rows[0]["label"] for rows in several.json()] == ["pos", "neg"]
    assert raw.json()[0][0]["score"] == 1.0  # the fake's logit, not a probability
    assert top.json() == [[{"label": "pos", "score": pytest.approx(top.json()[0][0]["score"])}]]


def test_openapi_documents_the_client_routes():
    (spec,) = ask(_fake(), [("GET", "/openapi.json", None)])
    paths = spec.json()["paths"]
    assert {"/", "/tokenize", "/decode", "/detokenize"} <= set(paths)
    assert set(paths["/"]["post"]["responses"]) == {"200", "404", "413", "422", "429", "500"}


def test_real_clients_against_a_real_serve_process(trained_runs):
    from openai import OpenAI

    from test_serve import Server

    server = Server(trained_runs["gemma3"], "--max-body-bytes", "20000")
    try:
        labels = InferenceClient(server.url).text_classification("a good film")
        assert {e.label for e in labels} == {"neg", "pos"} and abs(sum(e.score for e in labels) - 1) < 1e-4
        with pytest.raises(HfHubHTTPError) as too_large:
            InferenceClient(server.url).text_classification("good " * 5000)
        assert too_large.value.response.status_code == 413
        models = OpenAI(base_url=f"{server.url}/v1", api_key="none").models.list()
        assert [m.id for m in models.data] == ["run"]
        tokens = server.client.post("/tokenize", json={"prompt": "a good film"}).json()
        assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 32
    finally:
        assert server.stop() == 0
