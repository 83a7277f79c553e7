"""An engine core that stops reading and answering (stopped, hung): the API process stays responsive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zmq

from contracts.errors import UnavailableError, ValidationError
from engine import wire
from engine.client import EngineCoreClient
from engine.core_inputs import CoreInputs
from engine.executors import ExecutorOptions
from engine.sampling import SamplingParams
from engine.server import ServerThread, create_app
from engine.tokenizer import load_tokenizer
from harness.processes import free_port


@contextlib.contextmanager
def _serving(checkpoint: Path, **config: object) -> Iterator[tuple[EngineCoreClient, str]]:
    """A core client (its engine settings from ``config``) behind the HTTP app; the client and the base URL."""
    from engine.engine_types import EngineConfig

    client = EngineCoreClient(ExecutorOptions(checkpoint=checkpoint, kv_cache_mb=1.0),
                              EngineConfig(warmup_requests=0, **config)).start()  # type: ignore[arg-type]
    server = ServerThread(create_app(client, load_tokenizer(checkpoint, client.vocab_size), model_name="m"),
                          port=free_port())
    try:
        server.start()
        yield client, server.url
    finally:
        pid = client.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # a core a test stopped and left stopped
        server.stop()
        client.shutdown()


def test_an_abort_that_finds_no_room_is_kept_and_sent_once_there_is(tmp_path: Path) -> None:
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    address = f"ipc://{tmp_path / 'in.sock'}"
    try:
        push.bind(address)  # nobody reads yet: every send finds the queue full
        inputs = CoreInputs(push)
        inputs.abort(["a", "b"], "abort")
        inputs.abort(["c"], "stop")
        inputs.abort(["d"], "abort")
        inputs.forget("d")  # it finished first: no abort needed
        assert inputs.pending_aborts == 3
        assert not inputs.send([wire.SHUTDOWN])  # refused, not blocked
        pull.connect(address)
        deadline = time.monotonic() + 5
        while inputs.pending_aborts and time.monotonic() < deadline:
            inputs.flush()
            time.sleep(0.01)
        assert inputs.pending_aborts == 0
        assert inputs.send([wire.SHUTDOWN])
        received = [wire.unpack(pull.recv()) for _ in range(3)]
        assert received == [[wire.ABORT, ["a", "b"], "abort"], [wire.ABORT, ["c"], "stop"], [wire.SHUTDOWN]]
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()


def _flood(client: EngineCoreClient, stop: threading.Event, outcome: dict[str, object]) -> None:
    """Add requests (never read) until the client refuses one; record how many went and the refusal."""

    async def run() -> None:
        params = SamplingParams(max_tokens=4)
        for sent in range(20_000):
            if stop.is_set():
                return
            try:
                client.add_request([1 + sent % 400, 2, 3], params)
            except UnavailableError as exc:
                outcome.update(sent=sent, error=str(exc))
                return

    asyncio.run(run())


def _stop_and_fill(client: EngineCoreClient, pid: int) -> tuple[bool, dict[str, object]]:
    """SIGSTOP the core and add requests until one is refused: (still blocked after 20 s, the outcome)."""
    os.kill(pid, signal.SIGSTOP)
    stop, outcome = threading.Event(), {}
    flood = threading.Thread(target=_flood, args=(client, stop, outcome), daemon=True)
    flood.start()
    flood.join(20)
    stop.set()
    return flood.is_alive(), outcome


@pytest.mark.integration
def test_a_stopped_core_with_a_full_queue_refuses_requests_and_health_still_answers(tiny_checkpoint: Path) -> None:
    with _serving(tiny_checkpoint) as (client, url):
        pid = client.pid
        assert pid is not None
        blocked, outcome = _stop_and_fill(client, pid)
        assert not blocked, "adding a request blocked on the full queue to the core"
        assert 100 < int(outcome["sent"]) < 20_000 and "queue is full" in str(outcome["error"])  # type: ignore[call-overload]
        with httpx.Client(base_url=url, timeout=5) as http:
            began = time.monotonic()
            assert http.get("/health").status_code == 200  # silent for seconds only: not yet judged hung
            refused = http.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2})
            assert time.monotonic() - began < 3
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
            assert "queue is full" in refused.json()["error"]["message"]
            client.abort("cmpl-none")  # kept: the queue has no room
            assert client.pending_aborts == 1
            os.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + 20
            while client.pending_aborts and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client.pending_aborts == 0  # sent by the receiver once the core read again
            assert http.get("/health").status_code == 200


@pytest.mark.integration
def test_shutdown_with_a_full_queue_to_a_stopped_core_kills_it_within_its_timeout(tiny_checkpoint: Path) -> None:
    from engine.engine_types import EngineConfig

    client = EngineCoreClient(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=1.0),
                              EngineConfig(warmup_requests=0)).start()
    pid = client.pid
    assert pid is not None
    try:
        blocked, outcome = _stop_and_fill(client, pid)
        assert not blocked and "error" in outcome
        closer = threading.Thread(target=client.shutdown, kwargs={"timeout_s": 1.0}, daemon=True)
        began = time.monotonic()
        closer.start()
        closer.join(15)
        assert not closer.is_alive(), "shutdown blocked on the full queue to the core"
        assert time.monotonic() - began < 12 and not client.is_alive
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        client.shutdown()


@pytest.mark.integration
def test_a_stopped_core_is_judged_hung_after_its_silence_and_stays_failed(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="moeslo.engine_client")
    with _serving(tiny_checkpoint, core_silence_timeout_s=2.5) as (client, url), \
            httpx.Client(base_url=url, timeout=20) as http:
        time.sleep(3.5)  # idle longer than the timeout: its heartbeats keep it trusted
        assert http.get("/health").status_code == 200
        pid = client.pid
        assert pid is not None
        events: list[str] = []

        def stream() -> None:
            payload = {"prompt": "a long one", "max_tokens": 400, "stream": True, "ignore_eos": True}
            with http.stream("POST", "/v1/completions", json=payload) as resp:
                events.extend(line for line in resp.iter_lines() if line.startswith("data: "))

        client.set_step_delay(0.05)  # the request is still running when the core stops
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        deadline = time.monotonic() + 20
        while not events and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        reader.join(15)
        assert not reader.is_alive(), "the stream hung with its engine core stopped"
        assert 2.0 < time.monotonic() - stopped < 10
        assert events[-1] == "data: [DONE]" and '"error"' in events[-2]
        health = http.get("/health")
        assert health.status_code == 503 and "has not answered for 2.5 s" in health.json()["status"]
        refused = http.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2})
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
        os.kill(pid, signal.SIGCONT)  # it speaks again: still failed, until the replica restarts
        time.sleep(1.5)
        assert http.get("/health").status_code == 503
        assert client.pending_aborts == 0  # the request failed here was aborted there too, once it read again
    messages = [r.getMessage() for r in caplog.records]
    assert any("engine core hung" in m for m in messages) and any("speaks again" in m for m in messages)


def test_a_silence_timeout_that_is_not_positive_is_refused() -> None:
    from engine.engine_types import EngineConfig

    with pytest.raises(ValidationError, match="core_silence_timeout_s"):
        EngineConfig(core_silence_timeout_s=0)


@pytest.mark.integration
def test_a_placement_apply_that_times_out_is_unavailable_and_the_served_placement_follows_the_core(
    tiny_checkpoint: Path,
) -> None:
    """The apply stays queued to the core after its waiter gives up: it answered 500 and GET /v1/placement kept
    the old placement for good, though the core applied the new one."""
    from contracts.placement import Placement

    with _serving(tiny_checkpoint) as (client, url), httpx.Client(base_url=url, timeout=5) as http:
        pid = client.pid
        assert pid is not None
        old = client.placement
        new = Placement(old.phy2log[:, ::-1].copy(), old.num_ranks)
        os.kill(pid, signal.SIGSTOP)  # the core reads the request only once it runs again
        try:
            with pytest.raises(UnavailableError, match=r"timed out after 0.3 s; it may still be applied"):
                client.request_placement(new, timeout_s=0.3)
            assert http.get("/v1/placement").json() == old.to_json()  # not applied yet
        finally:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 20
        while client.placement != new and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http.get("/v1/placement").json() == new.to_json()
        assert Placement.from_json(client.call("get_placement")) == new


@pytest.mark.integration
def test_a_request_added_while_the_core_is_judged_hung_is_refused_not_left_waiting(tiny_checkpoint: Path) -> None:
    """The receiver thread may fail every stream between add_request's health check and the stream's registration:
    that stream was never failed, and its reader waited for ever."""
    from engine.engine_types import EngineConfig

    client = EngineCoreClient(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=1.0),
                              EngineConfig(warmup_requests=0)).start()  # fmt: skip
    check = client.check_prompt

    def judged_hung_meanwhile(*args: object, **kwargs: object) -> None:
        check(*args, **kwargs)  # type: ignore[arg-type]
        client._on_core_silent()

    client.check_prompt = judged_hung_meanwhile  # type: ignore[method-assign]

    async def add() -> None:
        client.add_request([1, 2, 3], SamplingParams(max_tokens=3))

    try:
        with pytest.raises(UnavailableError, match="has not answered"):
            asyncio.run(add())
        assert not client._streams
    finally:
        client.shutdown()
