"""Many runs on one base (`loracls serve RUN1 RUN2 ...`): each run's answers equal serving that run alone (in
process, fp32, within 1e-5), batches that mix runs, the `model` field / query / header, /v1/models, the
refusals, and one real server process with two runs."""

import asyncio
import json
import shutil

import httpx
import numpy as np
import pytest

from conftest import NEGATIVE, POSITIVE, synthetic_frame, tiny_overrides
from loracls.cli import main
from loracls.inference.adapters import AdapterSet
from loracls.inference.engine import Classifier
from loracls.inference.server import create_app
from test_serve import Server
from test_serve_contract import is_error, message_of

TEXTS = ["good film", "bad boring plot", "the movie was very great and lovely", "a dull script", "ok meh so-so"]
THREE = {"pos": POSITIVE, "neg": NEGATIVE, "plain": ["ok", "meh", "neutral", "so-so"]}


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory, gemma3_dir, data_csv):
    """Three runs on the tiny Gemma 3: two 2-label runs trained differently, one 3-label run."""
    out = tmp_path_factory.mktemp("adapters")
    three_csv = out / "three.csv"
    synthetic_frame(500, seed=3, classes=THREE).to_csv(three_csv, index=False)
    made = {}
    for name, data, extra in (
        ("alpha", data_csv, {}),
        ("beta", data_csv, {"seed": 7, "learning_rate": 2e-3, "r": 8}),
        ("gamma", three_csv, {"epochs": 6}),
    ):
        overrides = tiny_overrides(gemma3_dir, data, out, run_name=name, baselines=[], **extra)
        assert main(["train", *overrides]) == 0
        made[name] = out / name
    return made


@pytest.fixture(scope="module")
def adapters(three_runs):
    return AdapterSet([str(path) for path in three_runs.values()], log=lambda *_: None, batch_size=4)


def test_each_run_equals_its_own_single_classifier(three_runs, adapters):
    assert list(adapters.runs) == ["alpha", "beta", "gamma"]
    for name, path in three_runs.items():
        alone = Classifier(str(path), log=lambda *_: None)
        served = adapters.runs[name]
        assert served.labels == alone.labels and served.decision.problem == alone.decision.problem
        # the run's merged model has the temperature in its head, the served adapter applies it: same probabilities
        np.testing.assert_allclose(served.probabilities(TEXTS), alone.probabilities(TEXTS), atol=1e-5)
    assert len(adapters.runs["gamma"].labels) == 3  # heads of different widths on one base


def test_a_batch_mixing_runs_gives_each_row_its_runs_answer(adapters):
    names = ["alpha", "gamma", "beta", "alpha", "gamma"] * 3
    texts = TEXTS * 3
    ids = [adapters.runs[name].encode([text]).ids[0] for name, text in zip(names, texts)]
    mixed = adapters.logits(ids, names)
    for name in set(names):
        rows = [i for i, n in enumerate(names) if n == name]
        alone = adapters.runs[name].logits([ids[i] for i in rows])
        np.testing.assert_allclose(np.stack([mixed[i] for i in rows]), alone, atol=1e-5)


async def _ask_all(app, requests):
    async with app.app.router.lifespan_context(app.app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://loracls") as client:
            return await asyncio.gather(*(client.request(m, path, **kw) for m, path, kw in requests))


def test_served_runs_answer_as_single_servers_with_mixed_batches(three_runs, adapters):
    batches = []
    score = adapters.logits

    def spy(ids, models, max_tokens=None):
        batches.append(set(models))
        return score(ids, models, max_tokens)

    adapters.logits = spy
    try:
        app = create_app(adapters, max_batch_size=64, max_wait_ms=200)
        requests = [("POST", "/classify", {"json": {"model": name, "input": TEXTS}}) for name in three_runs]
        answers = asyncio.run(_ask_all(app, requests))
    finally:
        del adapters.logits
    assert any(len(models) > 1 for models in batches)  # the three requests shared a forward pass
    for (name, path), answer in zip(three_runs.items(), answers):
        assert answer.status_code == 200 and answer.json()["model"] == name
        alone_app = create_app(Classifier(str(path), log=lambda *_: None))
        alone = asyncio.run(_ask_all(alone_app, [("POST", "/classify", {"json": {"input": TEXTS}})]))[0].json()
        got, expected = answer.json()["data"], alone["data"]
        assert [item["label"] for item in got] == [item["label"] for item in expected]
        np.testing.assert_allclose([item["probs"] for item in got], [item["probs"] for item in expected], atol=1e-5)


def test_model_query_header_listing_and_unknown_names(adapters):
    app = create_app(adapters)
    answers = asyncio.run(
        _ask_all(
            app,
            [
                ("POST", "/predict?model=gamma", {"json": {"inputs": "ok meh"}}),
                ("POST", "/predict", {"json": {"inputs": "ok meh"}, "headers": {"X-Model": "gamma"}}),
                ("POST", "/predict", {"json": {"inputs": "ok meh"}}),
                ("GET", "/v1/models", {}),
                ("GET", "/info?model=beta", {}),
                ("POST", "/classify", {"json": {"model": "delta", "input": "good"}}),
                ("POST", "/predict?model=delta", {"json": {"inputs": "good"}}),
                ("GET", "/info?model=delta", {}),
            ],
        )
    )
    by_query, by_header, default, listing, info, *unknown = answers
    assert by_query.json() == by_header.json() and len(by_query.json()) == 3
    assert len(default.json()) == 2  # no model named: the first run (alpha, 2 labels)
    assert [card["id"] for card in listing.json()["data"]] == ["alpha", "beta", "gamma"]
    assert info.json()["model"] == "beta" and info.json()["models"] == ["alpha", "beta", "gamma"]
    for response in unknown:
        assert is_error(response, 404, "NotFound")  # each route's own body (vLLM's on /classify)
        assert "`delta` does not exist" in message_of(response)


def _refused(capsys, argv) -> str:
    assert main([*argv, "--port", "0"]) == 2  # refused before or after the socket is bound: no fixed port
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("loracls: ")
    return err[0]


def test_runs_that_cannot_share_a_server_are_refused(three_runs, trained_runs, tmp_path, capsys):
    alpha, beta = str(three_runs["alpha"]), str(three_runs["beta"])
    assert "do not share one base model" in _refused(capsys, ["serve", alpha, str(trained_runs["gemma4"])])
    assert "two runs are named 'alpha'" in _refused(capsys, ["serve", alpha, alpha])
    assert "--engine torch" in _refused(capsys, ["serve", alpha, beta, "--engine", "onnx"])
    no_weights = tmp_path / "copy"
    shutil.copytree(three_runs["beta"], no_weights)
    (no_weights / "adapter" / "adapter_model.safetensors").unlink()
    assert "has no adapter/adapter_model.safetensors" in _refused(capsys, ["serve", alpha, str(no_weights)])


def test_a_real_server_process_with_two_runs(three_runs):
    server = Server([three_runs["alpha"], three_runs["gamma"]], "--max-wait-ms", "20")
    try:
        assert "alpha (" in "".join(server.lines) and "gamma (" in "".join(server.lines)
        answer = server.client.post("/classify", json={"model": "gamma", "input": ["ok meh", "good"]}).json()
        assert answer["model"] == "gamma" and answer["data"][0]["num_classes"] == 3
        first = server.client.post("/predict", json={"inputs": "good"}).json()
        assert {row["label"] for row in first} == {"pos", "neg"}
        metrics = server.client.get("/metrics").text
        assert 'loracls_texts_total{model="gamma"} 2.0' in metrics
        assert json.loads(server.client.get("/v1/models").text)["data"][1]["id"] == "gamma"
    finally:
        assert server.stop() == 0
