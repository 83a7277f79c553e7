"""Requests that fan out into several core requests (``n`` > 1, lists of prompts): a client that goes away
aborts every one of them, and a refused choice leaves none behind."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from engine.server import ServerThread
from exporters.app import ServeOptions, ServingStack, build_stack
from harness.processes import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path) -> Iterator[tuple[ServerThread, ServingStack]]:
    port = free_port()
    stack = build_stack(ServeOptions(checkpoint=tiny_checkpoint, model_name="m", kv_cache_mb=1.0, port=port))
    server = ServerThread(stack.app, port=port).start()
    yield server, stack
    server.stop()


def _wait(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _idle(stack: ServingStack) -> bool:
    return stack.engine.kv_state()[0] == 0 and stack.engine.num_requests() == (0, 0)


def _aborted(stack: ServingStack) -> float:
    assert stack.prometheus is not None
    labels = {"model_name": "m", "engine": "0", "finished_reason": "abort"}
    return stack.prometheus.registry.get_sample_value("vllm:request_success_total", labels) or 0.0


@pytest.mark.parametrize(
    ("path", "body", "choices"),
    [
        ("/v1/completions", {"prompt": ["walk", "away"], "n": 2, "max_tokens": 400, "ignore_eos": True}, 4),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "bye"}], "n": 3, "max_tokens": 400,
                                  "ignore_eos": True, "stream": True}, 3),
    ],
)
def test_a_client_that_goes_away_aborts_every_choice(
    served: tuple[ServerThread, ServingStack], path: str, body: dict[str, object], choices: int
) -> None:
    server, stack = served
    before = _aborted(stack)
    host, port = server.url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
                     + b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        assert _wait(lambda: sum(stack.engine.num_requests()) >= 2, 20)
    assert _wait(lambda: _idle(stack), 10), stack.engine.num_requests()
    assert _wait(lambda: _aborted(stack) - before == choices, 5), _aborted(stack) - before
    stack.engine.blocks.check_invariants()


def test_a_refused_choice_leaves_no_request_behind(served: tuple[ServerThread, ServingStack]) -> None:
    server, stack = served
    before = _aborted(stack)
    # The second prompt leaves no room in the context for a token: the first one must not be left running.
    body = {"prompt": [[1, 2, 3], [1] * 600], "max_tokens": 20, "ignore_eos": True}
    resp = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"
    assert _wait(lambda: _idle(stack), 10), stack.engine.num_requests()
    assert _aborted(stack) == before  # refused before any choice reached the core: nothing to abort


def test_a_prompt_the_client_refuses_leaves_the_earlier_prompts_unsent(served: tuple[ServerThread, ServingStack]
                                                                        ) -> None:  # fmt: skip
    server, stack = served
    before = _aborted(stack)
    # The last prompt is empty: every prompt is checked before the first is sent, as vLLM checks them.
    body = {"prompt": ["a", "b", "c", ""], "max_tokens": 20, "ignore_eos": True}
    resp = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert resp.status_code == 400 and "at least one token" in resp.json()["error"]["message"]
    assert _wait(lambda: _idle(stack), 10), stack.engine.num_requests()
    assert _aborted(stack) == before
