"""The router in front of a real engine (`moeslo serve`'s stack on a tiny checkpoint): relaying and its load series.

(Disconnects are tested against the stub: the tiny model finishes 400 tokens before a client could leave.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.server import ServerThread
from exporters.app import ServeOptions, build_stack
from harness.processes import free_port
from router.scrape import parse_load
from tests.router.servers import router

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> Iterator[str]:
    stack = build_stack(ServeOptions(checkpoint=tiny_checkpoint, model_name="tiny-moe", kv_cache_mb=1.0))
    server = ServerThread(stack.app, port=free_port()).start()
    try:
        yield server.url
    finally:
        server.stop()


def test_the_engine_writes_the_series_the_router_reads(engine: str) -> None:
    load = parse_load(httpx.get(engine + "/metrics", timeout=10).text)
    assert None not in (load.waiting, load.running, load.kv_usage), load


def test_completions_stream_and_errors_pass_through_from_the_engine(engine: str) -> None:
    with router([engine]) as r:
        # ignore_eos: the random model's sampled output may reach its eos token, and these count tokens.
        plain = httpx.post(r.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4, "ignore_eos": True},
                           timeout=60)
        assert plain.status_code == 200 and plain.json()["usage"]["completion_tokens"] == 4
        body = {"prompt": "hello", "max_tokens": 4, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", r.url + "/v1/completions", json=body, timeout=60) as answer:
            events = [line for line in answer.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) == 5
        assert json.loads(events[0].removeprefix("data: "))["object"] == "text_completion"
        bad = httpx.post(r.url + "/v1/completions", json={"prompt": "x", "max_tokens": 0}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"  # the engine's own
        assert bad.json()["error"]["param"] == "max_tokens"
        chat = httpx.post(r.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                                "max_tokens": 2}, timeout=60)
        assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
        assert httpx.get(r.url + "/v1/models", timeout=10).json()["data"][0]["id"] == "tiny-moe"
