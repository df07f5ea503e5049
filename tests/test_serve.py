"""`loracls serve` through a real HTTP client against a server on a free port of 127.0.0.1 (a tiny model),
and the dynamic batcher's mechanics."""

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest

from loracls.cli import main
from loracls.inference.batcher import Batcher, TooLarge
from test_serve_contract import is_error, message_of

LIMIT = 600  # seconds: only against a hang


class Server:
    def __init__(self, run, *options):
        served = [str(path) for path in run] if isinstance(run, list | tuple) else [str(run)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "loracls", "serve", *served, "--port", "0", *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines = []
        deadline = time.time() + LIMIT
        while time.time() < deadline:
            line = self.process.stdout.readline()
            if not line and self.process.poll() is not None:
                raise AssertionError("server ended: " + "".join(self.lines))
            self.lines.append(line)
            found = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if found:
                self.url = found.group(1)
                break
        threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True).start()
        self.client = httpx.Client(base_url=self.url, timeout=LIMIT)

    def stop(self) -> int:
        self.client.close()
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(LIMIT)


@pytest.fixture(scope="module")
def server(trained_runs):
    server = Server(trained_runs["gemma3"], "--max-wait-ms", "20", "--max-body-bytes", "20000", "--max-queue", "64")
    yield server
    assert server.stop() == 0


def test_health_info_and_metrics(server):
    assert server.client.get("/health").json() == {"status": "ok"}
    info = server.client.get("/info").json()
    assert info["labels"] == ["neg", "pos"] and info["max_length"] == 32 and info["precision"] == "float32"
    assert info["device"] == "cpu" and info["model"] == "run" and info["source"].endswith("merged")
    server.client.post("/classify", json={"input": "good film"})
    metrics = server.client.get("/metrics").text
    assert 'loracls_requests_total{route="/classify",status="200"}' in metrics
    assert "loracls_batch_size_bucket" in metrics and "loracls_request_latency_seconds_bucket" in metrics


def test_classify_in_vllm_shape_equals_predict(server, trained_runs, capsys):
    texts = ["good great film", "awful dull boring plot", "the movie was very messy and tedious"]
    body = server.client.post("/classify", json={"model": "run", "input": texts}).json()
    assert body["object"] == "list" and body["id"].startswith("classify-") and body["model"] == "run"
    assert isinstance(body["created"], int) and [d["index"] for d in body["data"]] == [0, 1, 2]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert body["usage"]["truncated_inputs"] == 0
    capsys.readouterr()
    assert main(["predict", str(trained_runs["gemma3"]), *sum((["--text", t] for t in texts), [])]) == 0
    predicted = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for served, local in zip(body["data"], predicted):
        assert served["num_classes"] == 2 and served["label"] == local["prediction"]
        assert served["probs"] == pytest.approx(
            [local["probabilities"]["neg"], local["probabilities"]["pos"]], abs=1e-5
        )
    single = server.client.post("/classify", json={"input": texts[0]}).json()
    assert len(single["data"]) == 1 and single["data"][0]["probs"] == pytest.approx(body["data"][0]["probs"], abs=1e-5)


def test_predict_in_tei_shape(server):
    one = server.client.post("/predict", json={"inputs": "good great film"}).json()
    assert [set(r) for r in one] == [{"label", "score"}] * 2 and one[0]["score"] >= one[1]["score"]
    assert sum(r["score"] for r in one) == pytest.approx(1.0, abs=1e-5)
    many = server.client.post("/predict", json={"inputs": ["good great film", "awful dull"]}).json()
    assert len(many) == 2 and [r["label"] for r in many[0]] == [r["label"] for r in one]
    assert [r["score"] for r in many[0]] == pytest.approx([r["score"] for r in one], abs=1e-5)
    raw = server.client.post("/predict", json={"inputs": "good great film", "raw_scores": True}).json()
    logits = np.array([r["score"] for r in raw]) / server.client.get("/info").json()["temperature"]
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert probs[0] == pytest.approx(one[0]["score"], abs=1e-5)


def test_long_texts_are_truncated_as_in_training_and_said(server):
    long_text = " ".join(["good"] + ["film"] * 80)
    body = server.client.post("/classify", json={"input": [long_text, "good film"]}).json()
    assert body["usage"]["truncated_inputs"] == 1 and body["usage"]["prompt_tokens"] <= 32 + 2
    response = server.client.post("/predict", json={"inputs": [long_text]})
    assert response.status_code == 200 and response.headers["X-Truncated-Inputs"] == "1"
    refused = server.client.post("/predict", json={"inputs": [long_text], "truncate": False})
    assert refused.status_code == 413 and "truncate is false" in refused.json()["error"]


@pytest.mark.parametrize(
    "route, payload, status",
    [
        ("/classify", {"input": ""}, 422),
        ("/classify", {"input": ["fine", "   "]}, 422),
        ("/classify", {"input": []}, 422),
        ("/classify", {"input": 42}, 422),
        ("/classify", {"input": ["fine", None]}, 422),
        ("/classify", {"text": "fine"}, 422),
        ("/predict", {"inputs": [""]}, 422),
        ("/predict", {"inputs": "fine", "raw_scores": "maybe"}, 422),
        ("/classify", "not json at all", 422),
        ("/classify", {"input": "x" * 30000}, 413),
        ("/classify", {"input": ["film"] * 33}, 413),  # more than --max-client-batch-size (TEI's default 32)
        ("/classify", {"model": "another", "input": "film"}, 404),
    ],
)
def test_bad_requests_get_json_errors_and_the_server_keeps_serving(server, route, payload, status):
    if isinstance(payload, str):
        response = server.client.post(route, content=payload, headers={"content-type": "application/json"})
    else:
        response = server.client.post(route, json=payload)
    assert response.status_code == status, response.text
    assert is_error(response, status, response.json().get("error_type")) and message_of(response)
    assert server.client.post("/classify", json={"input": "good film"}).status_code == 200


def test_concurrent_requests_are_each_answered_their_own(server):
    texts = [f"{'good great' if i % 2 else 'awful dull'} film {i}" for i in range(24)]
    alone = [server.client.post("/classify", json={"input": t}).json()["data"][0]["probs"] for t in texts]
    assert len({round(p[0], 4) for p in alone}) > 2  # different texts, different answers to tell apart

    async def send_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            return await asyncio.gather(*(client.post("/classify", json={"input": t}) for t in texts))

    responses = asyncio.run(send_all())
    assert all(r.status_code == 200 for r in responses)
    for expected, response in zip(alone, responses):
        assert response.json()["data"][0]["probs"] == pytest.approx(expected, abs=1e-5)


@pytest.mark.slow
def test_sigterm_answers_every_request_in_flight_and_exits_zero(trained_runs):
    server = Server(trained_runs["gemma3"], "--max-wait-ms", "5000", "--max-batch-size", "64")
    texts = [f"{'good' if i % 2 else 'awful'} film {i}" for i in range(16)]

    async def send_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=LIMIT) as client:
            return await asyncio.gather(
                *(client.post("/classify", json={"input": t}) for t in texts), return_exceptions=True
            )

    result = {}
    sender = threading.Thread(target=lambda: result.update(responses=asyncio.run(send_all())))
    sender.start()
    deadline = time.time() + LIMIT
    while time.time() < deadline and "loracls_queued_texts 16.0" not in server.client.get("/metrics").text:
        time.sleep(0.01)  # all 16 accepted and waiting for the batch deadline
    server.process.send_signal(signal.SIGTERM)
    sender.join(LIMIT)
    answered = [r for r in result["responses"] if not isinstance(r, Exception)]
    assert [r.status_code for r in answered] == [200] * 16, result["responses"]
    assert server.process.wait(LIMIT) == 0
    assert any("requests in flight were answered" in line for line in server.lines)


# the signal and a client both arrive after the address is printed and before uvicorn has started: the moment a
# loaded CI machine gave a test (connection refused, then SIGTERM ignored until the 600 s limit)
_EARLY = """
import signal, socket, sys
import uvicorn
from loracls.cli import main
run = uvicorn.Server.run
def early(self, sockets):
    socket.create_connection(sockets[0].getsockname()[:2], timeout=60).close()  # refused unless listening
    signal.raise_signal(signal.SIGTERM)  # before uvicorn's own handlers are in place
    return run(self, sockets=sockets)
uvicorn.Server.run = early
sys.exit(main(["serve", sys.argv[1], "--port", "0"]))
"""


def test_a_client_and_a_sigterm_right_after_the_address_is_printed(trained_runs):
    done = subprocess.run(
        [sys.executable, "-c", _EARLY, str(trained_runs["gemma3"])], capture_output=True, text=True, timeout=LIMIT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "listening on" in done.stderr and "serve: stopped" in done.stderr


# --- the batcher ------------------------------------------------------------------------------------------


def _batcher(max_batch_size, max_queue=1000):
    seen = []

    def score(ids, models):
        seen.append(len(ids))
        return np.array([[float(len(x)), 0.0] for x in ids])

    return Batcher(score, max_batch_size, max_wait_ms=1000, max_queue=max_queue), seen


def test_batcher_gathers_concurrent_requests_into_batches_and_scatters_rows():
    async def scenario():
        batcher, seen = _batcher(max_batch_size=4)
        await batcher.start()
        requests = [[[1] * (i + 1)] for i in range(10)]  # request i: one text of i+1 tokens
        results = await asyncio.gather(*(batcher.submit(ids) for ids in requests))
        await batcher.stop()
        return seen, results

    seen, results = asyncio.run(scenario())
    assert seen == [4, 4, 2]
    assert [float(r[0, 0]) for r in results] == [float(i + 1) for i in range(10)]


def test_batcher_refuses_what_its_queue_can_never_hold():
    async def scenario():
        batcher, _ = _batcher(max_batch_size=4, max_queue=3)
        await batcher.start()
        with pytest.raises(TooLarge, match="at most 3"):
            await batcher.submit([[1]] * 4)
        rows = await batcher.submit([[1]] * 3)
        await batcher.stop()
        return rows

    assert asyncio.run(scenario()).shape == (3, 2)


def test_serve_refuses_a_non_run_in_one_line(tmp_path, capsys):
    assert main(["serve", str(tmp_path), "--port", "0"]) == 2
    assert (
        "not a finished loracls run directory (config.yaml missing), nor an exported model" in capsys.readouterr().err
    )


def test_a_taken_port_is_refused_before_the_model_loads(trained_runs, capsys, monkeypatch):
    import socket

    import loracls.inference.loaded

    monkeypatch.setattr(loracls.inference.loaded, "engine_for", lambda *a: pytest.fail("the model was loaded"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(trained_runs["gemma3"]), "--port", str(port)]) == 2
    assert (
        capsys.readouterr().err.strip() == f"loracls: serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_accepted_connections_send_without_waiting_for_acks():
    """TCP_NODELAY on every accepted connection (asyncio sets it only where the socket's proto says TCP): without
    it each response waited ~40 ms for Nagle's algorithm and the client's delayed ACK."""
    import socket

    from loracls.inference.http import BACKLOG, bound_socket

    async def scenario():
        sock = bound_socket("127.0.0.1", 0)
        sock.listen(BACKLOG)  # as `serve` does
        accepted = []
        server = await asyncio.start_server(lambda r, w: accepted.append(w), sock=sock)
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        while not accepted:
            await asyncio.sleep(0.01)
        nodelay = accepted[0].get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        writer.close()
        server.close()
        return nodelay

    assert asyncio.run(scenario()) != 0
