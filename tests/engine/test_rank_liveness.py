"""A dead expert-parallel rank is found within a second, idle or busy: /health 503, a log line, a metric."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from engine.client import EngineCoreClient
from tests.engine.test_server import metric_samples, serve, value

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _rank_pid(engine: EngineCoreClient) -> int:
    """The EP rank 1 process: a spawned child of the engine core (not multiprocessing's resource tracker)."""
    assert engine.pid is not None
    ranks = [p for p in psutil.Process(engine.pid).children()
             if "spawn_main" in " ".join(p.cmdline()) and "resource_tracker" not in " ".join(p.cmdline())]
    assert len(ranks) == 1, [p.cmdline() for p in ranks]
    return ranks[0].pid


def _seconds_until_unhealthy(client: httpx.Client, limit_s: float = 5.0) -> float:
    start = time.monotonic()
    while client.get("/health").status_code == 200:
        assert time.monotonic() - start < limit_s, "/health still 200 after a rank died"
        time.sleep(0.02)
    return time.monotonic() - start


def _assert_refused_cleanly(client: httpx.Client) -> None:
    health = client.get("/health")
    assert health.status_code == 503 and int(health.headers["Retry-After"]) >= 1
    assert "expert-parallel rank 1" in health.json()["status"]
    refused = client.post("/v1/completions", json={"prompt": "after", "max_tokens": 2})
    assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
    message = refused.json()["error"]["message"]
    assert "/" not in message and "127.0.0.1" not in message, message
    assert value(metric_samples(client.get("/metrics").text), "moe_engine_healthy") == 0


def test_a_rank_killed_while_idle_turns_health_503_within_a_second(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="moeslo.engine_client")
    server, engine = serve(tiny_checkpoint, ep=2)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/v1/completions", json={"prompt": "warm", "max_tokens": 2}).status_code == 200
            assert value(metric_samples(client.get("/metrics").text), "moe_engine_healthy") == 1
            pid = _rank_pid(engine)
            time.sleep(1.5)  # idle: no request will come to find the dead rank
            os.kill(pid, signal.SIGKILL)
            assert _seconds_until_unhealthy(client) <= 1.0
            _assert_refused_cleanly(client)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        assert any("engine broken" in r.getMessage() and "rank 1" in r.getMessage() for r in caplog.records)
    finally:
        server.stop()


def test_a_rank_killed_mid_stream_fails_the_streams_and_health_within_a_second(tiny_checkpoint: Path) -> None:
    server, engine = serve(tiny_checkpoint, ep=2)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            engine.set_step_delay(0.02)
            lines: list[list[str]] = [[] for _ in range(3)]

            def stream(i: int) -> None:
                payload = {"prompt": f"busy {i}", "max_tokens": 400, "ignore_eos": True, "stream": True}
                with client.stream("POST", "/v1/completions", json=payload) as resp:
                    lines[i].extend(line for line in resp.iter_lines() if line.startswith("data: "))

            whole: list[httpx.Response] = []

            def collect() -> None:
                payload = {"prompt": "busy whole", "max_tokens": 400, "ignore_eos": True}
                whole.append(client.post("/v1/completions", json=payload))

            readers = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
            readers.append(threading.Thread(target=collect))
            for r in readers:
                r.start()
            deadline = time.monotonic() + 20
            while not all(lines) and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(_rank_pid(engine), signal.SIGKILL)
            assert _seconds_until_unhealthy(client) <= 1.0
            for r in readers:
                r.join(10)
                assert not r.is_alive(), "a stream hung after its rank died"
            for got in lines:
                assert got[-1] == "data: [DONE]" and '"error"' in got[-2]
                error = json.loads(got[-2].removeprefix("data: "))["error"]
                assert error["code"] == 503 and "/" not in error["message"], error
            assert whole[0].status_code == 503 and int(whole[0].headers["Retry-After"]) >= 1, whole[0].text
            _assert_refused_cleanly(client)
    finally:
        server.stop()
