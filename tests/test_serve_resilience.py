"""`loracls serve` under legal but heavy or idle clients: texts tokenized off the event loop (/health answers
while a request is being tokenized), connections that send nothing closed after the header timeout or, at the
connection limit, to make room; texts that encode to no tokens a 422 naming the input on every route."""

import contextlib
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from tokenizers import normalizers

from conftest import make_tokenizer
from loracls.data.batching import TextEncoder
from loracls.errors import NoTokens
from loracls.inference.http import BACKLOG, bound_socket, idle_guarded
from loracls.inference.server import create_app
from test_serve_contract import FakeClassifier, message_of

HANG = 600  # seconds: only against a hang on a busy machine, never a measured bound


@contextlib.contextmanager
def guarded_server(classifier, max_connections=20, header_timeout_s=0.5):
    sock = bound_socket("127.0.0.1", 0)
    sock.listen(BACKLOG)
    config = uvicorn.Config(
        create_app(classifier), log_level="warning", http=idle_guarded(max_connections, header_timeout_s)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + HANG
    while not server.started and thread.is_alive() and time.time() < deadline:
        time.sleep(0.01)
    assert server.started
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(60)


def _silent(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=HANG)
    return conn


def _closed_by_server(conn: socket.socket) -> bool:
    try:
        return conn.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout():
    with guarded_server(FakeClassifier(), header_timeout_s=0.3) as port:
        conn = _silent(port)
        assert _closed_by_server(conn)  # recv blocks until the server closes it (HANG only guards a hang)
        conn.close()


def test_health_answers_while_more_silent_connections_are_held_than_the_limit():
    with guarded_server(FakeClassifier(), max_connections=20, header_timeout_s=HANG) as port:
        held = [_silent(port) for _ in range(40)]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=HANG) as client:
            assert client.get("/health").status_code == 200
            assert client.post("/classify", json={"input": "good film"}).status_code == 200
        assert _closed_by_server(held[0])  # the oldest silent ones made room
        for conn in held:
            conn.close()


class SlowEncode(FakeClassifier):
    """Tokenizing blocks until released: a stand-in for megabytes of text."""

    def __init__(self):
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def encode(self, texts):
        self.entered.set()
        self.release.wait(HANG)
        return super().encode(texts)


def test_health_answers_while_a_request_is_being_tokenized():
    slow = SlowEncode()
    with guarded_server(slow, header_timeout_s=HANG) as port:
        url = f"http://127.0.0.1:{port}"
        answers = []
        worker = threading.Thread(
            target=lambda: answers.append(httpx.post(f"{url}/classify", json={"input": "good"}, timeout=HANG))
        )
        worker.start()
        assert slow.entered.wait(HANG)
        assert httpx.get(f"{url}/health", timeout=HANG).status_code == 200
        assert not slow.release.is_set()  # /health was answered while the tokenizer still held the request
        slow.release.set()
        worker.join(HANG)
        assert answers[0].status_code == 200


def _dropping_tokenizer():
    tokenizer = make_tokenizer()
    tokenizer.backend_tokenizer.normalizer = normalizers.Replace("\u200b", "")
    return tokenizer


class ZeroTokenAware(FakeClassifier):
    """Encodes with the real TextEncoder and a tokenizer whose normalizer drops U+200B."""

    def __init__(self):
        super().__init__()
        self.tokenizer = _dropping_tokenizer()
        self.text_encoder = TextEncoder(self.tokenizer, 8)

    def encode(self, texts):
        return self.text_encoder.encode(texts)


def test_a_text_of_no_tokens_is_refused_by_the_encoder():
    encoder = TextEncoder(_dropping_tokenizer(), 16)
    assert encoder.encode(["good film"]).ids
    with pytest.raises(NoTokens, match=r"1 of 2 texts encode to no tokens, e.g. text 1"):
        encoder.encode(["good film", "\u200b\u200b"])


@pytest.mark.parametrize(
    "route, body",
    [
        ("/classify", {"input": "\u200b"}),
        ("/classify", {"input": ["good", "\u200b"]}),
        ("/predict", {"inputs": "\u200b"}),
        ("/", {"inputs": "\u200b"}),
    ],
)
def test_a_text_of_no_tokens_is_a_422_on_every_route_and_the_server_goes_on(route, body):
    with guarded_server(ZeroTokenAware(), header_timeout_s=HANG) as port:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=HANG) as client:
            answer = client.post(route, json=body)
            assert answer.status_code == 422, answer.text
            assert "encode to no tokens" in message_of(answer)
            assert client.post("/classify", json={"input": "good film"}).status_code == 200


def test_a_vllm_tokenize_prompt_with_a_lone_surrogate_is_a_422():
    with guarded_server(FakeClassifier(), header_timeout_s=HANG) as port:
        raw = b'{"prompt": "\\udfff"}'
        answer = httpx.post(
            f"http://127.0.0.1:{port}/tokenize", content=raw, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 422, answer.text
