"""A hostile but fair client against the served engine: bad requests hurt nobody, every error is our JSON."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.engine.test_server import Served, serve, stream_completion

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path) -> Iterator[Served]:
    server, engine = serve(tiny_checkpoint, max_waiting=32)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield Served(server.url, engine, client)
    server.stop()


OPENAI_ERROR_TYPES = {"invalid_request_error", "rate_limit_error", "service_unavailable_error", "server_error"}


def _is_error_document(resp: httpx.Response) -> dict[str, object]:
    assert resp.headers["content-type"].startswith("application/json"), resp.text
    error = resp.json()["error"]
    assert error["code"] == resp.status_code and error["message"]
    # OpenAI's shape: a type from its set and the field at fault (or null).
    assert error["type"] in OPENAI_ERROR_TYPES and "param" in error
    assert "Traceback" not in resp.text and "/site-packages/" not in resp.text
    return error  # type: ignore[no-any-return]


POISON = [
    ({"prompt": "x", "max_tokens": 2, "seed": 18446744073709551616}, "seed"),
    ({"prompt": "x", "max_tokens": 2, "temperature": 2.5}, "temperature"),
    ({"prompt": "x", "max_tokens": 2, "stop_token_ids": [99999]}, "stop_token_ids"),
    ({"prompt": "x", "max_tokens": 2, "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "max_tokens": 0, "logprobs": 1}, "max_tokens"),
    ({"prompt": [True, False], "max_tokens": 2}, "prompt"),
    ({"prompt": "x", "max_tokens": 2, "stop": [""]}, "stop"),
]


def test_poisoned_requests_get_400_naming_the_field_while_victims_stream_on(served: Served) -> None:
    results: list[tuple[float, list[float], list[dict]]] = []

    def victim(i: int) -> None:
        payload = {"prompt": f"victim {i} " * 4, "max_tokens": 48, "ignore_eos": True, "temperature": 0.7,
                   "seed": i}
        results.append(stream_completion(served.client, payload))

    threads = [threading.Thread(target=victim, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    for payload, field in POISON:
        resp = served.client.post("/v1/completions", json=payload)
        assert resp.status_code == 400, resp.text
        error = _is_error_document(resp)
        assert field in str(error["message"]) and error["param"] == field, error
    # Near-zero top_p is computable (the most likely token stays), and a temperature near 0 samples at
    # vLLM's floor of 0.01: served, not a poisoned batch.
    assert served.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "top_p": 1e-300,
                                                       "temperature": 0.5}).status_code == 200
    assert served.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2,
                                                       "temperature": 1e-300}).status_code == 200
    for t in threads:
        t.join(60)
    assert len(results) == 4
    for _, _, events in results:
        assert len(events) == 48 and events[-1]["choices"][0]["finish_reason"] == "length"
    assert served.client.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"prompt": "\\ud800", "max_tokens": 2}', "prompt"),
        (b'{"prompt": "x", "stop": ["\\udfff"]}', "stop"),
        (b'{"prompt": "\xff\xfe x"}', ""),
        (b"[" * 1100 + b"]" * 1100, ""),
        (b'{"prompt": "x", "\\ud800": 1}', "body"),
    ],
)
def test_malformed_bodies_get_the_error_document(served: Served, content: bytes, needle: str) -> None:
    resp = served.client.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert needle in str(_is_error_document(resp)["message"])


def test_unknown_routes_and_methods_get_the_error_document(served: Served) -> None:
    assert _is_error_document(served.client.get("/nope"))["code"] == 404
    assert _is_error_document(served.client.get("/v1/completions"))["code"] == 405


def _greedy(served: Served, **extra: object) -> dict:
    payload = {"prompt": "stop strings", "max_tokens": 24, "temperature": 0, "ignore_eos": True, **extra}
    resp = served.client.post("/v1/completions", json=payload)
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def test_stop_strings_cut_the_text_and_end_the_request_streaming_or_not(served: Served) -> None:
    full = _greedy(served)["choices"][0]["text"]
    stop = full[len(full) // 2 : len(full) // 2 + 3]  # three characters: they span token boundaries
    expected = full[: full.find(stop)]
    body = _greedy(served, stop=[stop, "never seen \u2603"])
    assert body["choices"][0] == {"index": 0, "text": expected, "logprobs": None, "finish_reason": "stop",
                                  "stop_reason": stop}
    assert body["usage"]["completion_tokens"] < 24
    _, _, events = stream_completion(served.client, {"prompt": "stop strings", "max_tokens": 24, "temperature": 0,
                                                     "ignore_eos": True, "stop": stop})
    assert "".join(e["choices"][0]["text"] for e in events) == expected
    assert (events[-1]["choices"][0]["finish_reason"], events[-1]["choices"][0]["stop_reason"]) == ("stop", stop)
    deadline = time.monotonic() + 5
    while served.engine.kv_state()[0] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert served.engine.kv_state()[0] == 0


def test_a_non_streaming_client_that_disconnects_is_aborted_within_a_step(served: Served) -> None:
    served.engine.set_step_delay(0.05)  # 400 tokens would take 20 s: only the abort frees the blocks sooner
    try:
        host, port = served.url.removeprefix("http://").split(":")
        body = json.dumps({"prompt": "walk away", "max_tokens": 400, "ignore_eos": True}).encode()
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            deadline = time.monotonic() + 20
            while served.engine.kv_state()[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)  # tokens are flowing
        closed = time.monotonic()
        while served.engine.kv_state()[0] and time.monotonic() - closed < 5:
            time.sleep(0.01)
        assert served.engine.kv_state() == (0, served.engine.num_blocks)
        assert time.monotonic() - closed < 0.5, "the abort took more than a few steps"
    finally:
        served.engine.set_step_delay(0.0)


def test_a_server_side_deadline_ends_requests_with_its_own_finish_reason(tiny_checkpoint: Path) -> None:
    server, engine = serve(tiny_checkpoint, request_deadline_s=0.5)
    try:
        engine.set_step_delay(0.02)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            resp = client.post("/v1/completions", json={"prompt": "slow", "max_tokens": 400, "ignore_eos": True})
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["finish_reason"] == "deadline"
            assert 0 < resp.json()["usage"]["completion_tokens"] < 400
            quick = client.post("/v1/completions", json={"prompt": "quick", "max_tokens": 2})
            assert quick.json()["choices"][0]["finish_reason"] == "length"
    finally:
        server.stop()
    assert engine.kv_state()[0] == 0


def test_a_step_that_raises_breaks_the_engine_with_503_and_retry_after_never_a_hang(tiny_checkpoint: Path) -> None:
    server, engine = serve(tiny_checkpoint)
    try:
        engine.set_step_delay(0.02)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            results: list[httpx.Response] = []
            reader = threading.Thread(target=lambda: results.append(client.post(
                "/v1/completions", json={"prompt": "in flight", "max_tokens": 400, "ignore_eos": True})))
            reader.start()
            deadline = time.monotonic() + 20
            while engine.kv_state()[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            engine.fail_next_step()
            reader.join(10)
            assert not reader.is_alive(), "the request hung after the engine broke"
            assert results[0].status_code == 503 and int(results[0].headers["Retry-After"]) >= 1
            assert _is_error_document(results[0])["type"] == "service_unavailable_error"
            health = client.get("/health")
            assert health.status_code == 503 and "an engine step failed" in health.json()["status"]
            refused = client.post("/v1/completions", json={"prompt": "after", "max_tokens": 2})
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
    finally:
        server.stop()
    assert engine.kv_state()[0] == 0  # as the core left it: the failed request's blocks were freed
