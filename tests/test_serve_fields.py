"""Every request field a client sends is honoured as its anchor (vLLM, TEI) does, or refused with a 422 that
names it: never accepted and dropped. vLLM's routes answer errors in vLLM's body (the openai SDK shows the
message); `/v1/models/{id}`, `created` and SGLang's `/v1/classify` path are served."""

import numpy as np
import pytest

from conftest import make_tokenizer
from loracls.data.batching import TextEncoder
from test_serve_contract import FakeClassifier, ask, is_error, message_of


class Encoding(FakeClassifier):
    """The fake model (it counts "good") behind the real TextEncoder: truncation as a run does it."""

    def __init__(self, max_length=8, long_text="truncate"):
        super().__init__(max_length=max_length, long_text=long_text)
        self.tokenizer = make_tokenizer()
        self.text_encoder = TextEncoder(self.tokenizer, max_length, long_text=long_text)
        self.seen = []

    def encode(self, texts, **cut):
        encoded = self.text_encoder.encode(texts, **cut)
        self.seen.append(encoded.ids)
        return encoded

    def logits(self, ids, max_tokens=None):
        good = self.tokenizer.convert_tokens_to_ids("good")
        counts = np.array([sum(1 for x in row if x == good) for row in ids], dtype=float)
        return np.stack([-counts, counts], axis=1)


def test_use_activation_false_gives_the_raw_scores():
    fake = Encoding()
    plain, raw = ask(
        fake,
        [
            ("POST", "/classify", {"input": "good good film"}),
            ("POST", "/classify", {"input": "good good film", "use_activation": False}),
        ],
    )
    assert plain.json()["data"][0]["probs"] == pytest.approx([1 / (1 + np.exp(4)), 1 / (1 + np.exp(-4))])
    assert raw.json()["data"][0]["probs"] == [-2.0, 2.0]


def test_truncate_prompt_tokens_keeps_the_last_tokens():
    fake = Encoding(max_length=16)
    text = "good good good bad bad bad film"
    full, cut = ask(
        fake,
        [
            ("POST", "/classify", {"input": text}),
            ("POST", "/classify", {"input": text, "truncate_prompt_tokens": 4}),
        ],
    )
    assert cut.json()["usage"]["prompt_tokens"] == 4 < full.json()["usage"]["prompt_tokens"]
    assert cut.json()["data"][0]["label"] == "neg" and full.json()["data"][0]["label"] == "pos"
    tokens = fake.tokenizer.convert_ids_to_tokens(fake.seen[-1][0])
    assert tokens[-3:] == ["bad", "bad", "film"]  # the end kept; the special tokens framed as the tokenizer does


def test_truncation_direction_left_keeps_a_long_texts_end():
    fake = Encoding(max_length=6)
    text = "good good good good bad bad bad bad bad bad bad"
    right, left = ask(
        fake,
        [
            ("POST", "/predict", {"inputs": text}),
            ("POST", "/predict", {"inputs": text, "truncation_direction": "Left"}),
        ],
    )
    assert right.json()[0]["label"] == "pos" and left.json()[0]["label"] == "neg"


def test_a_cut_a_chunked_run_cannot_make_is_a_422_naming_it():
    (response,) = ask(
        Encoding(long_text="chunks"), [("POST", "/predict", {"inputs": "good film", "truncation_direction": "Left"})]
    )
    assert is_error(response, 422, "Validation") and "truncation_direction" in message_of(response)


@pytest.mark.parametrize(
    "path, body, field",
    [
        ("/classify", {"input": "good", "priority": 3}, "priority"),
        ("/classify", {"input": "good", "messages": [{"role": "user", "content": "hi"}]}, "messages"),
        ("/predict", {"inputs": "good", "normalize": True}, "normalize"),
        ("/", {"inputs": "good", "parameters": {"candidate_labels": ["a", "b"]}}, "parameters.candidate_labels"),
        ("/tokenize", {"prompt": "good", "return_token_ids": True}, "return_token_ids"),
        ("/decode", {"ids": [5], "foo": 1}, "foo"),
    ],
)
def test_a_field_the_server_does_not_implement_is_a_422_naming_it(path, body, field):
    response, after = ask(FakeClassifier(), [("POST", path, body), ("POST", "/classify", {"input": "good film"})])
    assert response.status_code == 422, response.text
    assert field in message_of(response) and "Extra inputs are not permitted" in message_of(response)
    assert after.status_code == 200


def test_vllm_tokenize_gives_the_token_strings_when_asked():
    (response,) = ask(FakeClassifier(), [("POST", "/tokenize", {"prompt": "good film", "return_token_strs": True})])
    body = response.json()
    assert body["token_strs"][-2:] == ["good", "film"] and len(body["token_strs"]) == body["count"]


def test_models_by_id_created_and_sglangs_classify_path():
    listing, one, unknown, sglang = ask(
        FakeClassifier(),
        [
            ("GET", "/v1/models", None),
            ("GET", "/v1/models/fake", None),
            ("GET", "/v1/models/other", None),
            ("POST", "/v1/classify", {"input": "good film"}),
        ],
    )
    card = listing.json()["data"][0]
    assert card["created"] > 0 and one.json() == card
    assert is_error(unknown, 404, "NotFound") and unknown.json()["error"]["type"] == "NotFoundError"
    assert sglang.status_code == 200 and sglang.json()["data"][0]["label"] == "pos"


def test_the_openai_sdk_shows_vllms_error_message():
    openai = pytest.importorskip("openai")
    from test_serve_clients import http_server

    with http_server(FakeClassifier()) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.NotFoundError) as raised:
            client.models.retrieve("other")
        assert "`other` does not exist" in str(raised.value)
        assert client.models.retrieve("fake").id == "fake"


def test_tei_timing_headers_and_the_anchors_metric_names():
    predicted, classified, metrics = ask(
        FakeClassifier(),
        [
            ("POST", "/predict", {"inputs": ["good film", "bad"]}),
            ("POST", "/classify", {"input": "good film"}),
            ("GET", "/metrics", None),
        ],
    )
    headers = predicted.headers
    parts = [int(headers[name]) for name in ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")]
    assert all(part >= 0 for part in parts) and parts[0] >= max(parts[1:])  # the total holds each part
    assert (
        headers["x-compute-characters"] == str(len("good film") + len("bad")) and int(headers["x-compute-tokens"]) > 0
    )
    text = metrics.text
    for line in (
        'te_request_count{method="batch"} 1.0',
        'te_request_success{method="batch"} 1.0',
        'te_predict_count{method="batch"} 2.0',
        "te_request_inference_duration_count 1.0",
        "te_batch_next_size_count",
        "te_queue_size ",
        'vllm:request_success_total{finished_reason="stop",model_name="fake"} 1.0',
        'vllm:e2e_request_latency_seconds_count{model_name="fake"} 1.0',
        "vllm:prompt_tokens_total",
        "vllm:num_requests_waiting ",
    ):
        assert line in text, line
