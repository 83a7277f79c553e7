"""A replica that freezes (accepts connections, answers nothing): its requests end when it is ejected.

Without this they would wait ``upstream_timeout_s`` (600 s by default).  The stub answers no
scrape in time and no completion at all; the router ejects it after ``eject_after_silent``
silent scrapes and ends what waits on it with a 504, or an error event on a stream already begun.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from bench.stub_upstream import DEFAULT_CHUNKS, StubUpstream
from router.app import ROUTER
from tests.router.servers import eventually, router, stubs, url_of

pytestmark = pytest.mark.timeout(60)
STREAM = {"prompt": "hello there", "max_tokens": 8, "stream": True}
PLAIN = {"prompt": "hello there", "max_tokens": 1}
FROZEN = {"scrape_timeout_s": 0.1, "eject_after_silent": 3, "upstream_timeout_s": 30.0, "readmit_after": 1000}


def test_a_request_waiting_on_a_frozen_replica_gets_a_504_when_it_is_ejected() -> None:
    with stubs(1, metrics_delay_s=5.0) as (frozen,), router([frozen], **FROZEN) as r:  # type: ignore[arg-type]
        frozen.mode = "hang"
        began = time.monotonic()
        answer = httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=20)
        waited_s = time.monotonic() - began
        assert answer.status_code == 504
        error = answer.json()["error"]
        assert error["replica"] == url_of(frozen) and "stopped answering" in error["message"]
        assert waited_s < 10, "ended by the ejection, not by upstream_timeout_s"
        assert r.replicas()[url_of(frozen)]["healthy"] is False
        labels = {"replica": url_of(frozen), "outcome": "upstream_error"}
        eventually(lambda: r.sample("moeslo_router_requests_total", decision="lowest_predicted_ttft", **labels) == 1,
                   5, "the request counted")
        eventually(lambda: frozen.peer_closed == 1, 5, "the upstream connection closed")
        assert r.app[ROUTER]._in_flight == {}  # nothing in flight: no record kept of the replica


def test_a_stream_begun_on_a_replica_that_freezes_ends_with_an_error_event() -> None:
    with stubs(1, metrics_delay_s=5.0, chunk_delay_s=20.0) as (frozen,), router([frozen], **FROZEN) as r:  # type: ignore[arg-type]
        began = time.monotonic()
        with httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=20) as answer:
            assert answer.status_code == 200  # the headers came before the replica froze
            body = answer.read()
        assert time.monotonic() - began < 10
        events = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]
        assert events[-1] == b"[DONE]"
        error = json.loads(events[-2])["error"]
        assert (error["code"], error["replica"]) == (504, url_of(frozen))


def test_a_slow_but_answering_replica_keeps_its_requests() -> None:
    # Late scrapes that are not all late in a row: the replica stays in, its stream goes on to the end.
    with stubs(1, chunk_delay_s=0.2) as (slow,), router([slow], **FROZEN) as r:  # type: ignore[arg-type]
        with httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=20) as answer:
            body = answer.read()
        assert body.endswith(b"data: [DONE]\n\n") and b"error" not in body
        assert r.replicas()[url_of(slow)]["healthy"] is True


def test_a_stream_still_flowing_outlives_its_replicas_ejection_for_late_scrapes() -> None:
    # /metrics answers late (a busy exporter) while tokens come every 0.1 s: the replica leaves routing,
    # the stream goes on to its [DONE].
    chunks = (*(f'data: {{"t":{i}}}\n\n'.encode() for i in range(40)), b"data: [DONE]\n\n")
    with stubs(1, stream_chunks=chunks, chunk_delay_s=0.1, metrics_delay_s=5.0) as (busy,), \
            router([busy], **FROZEN) as r:  # type: ignore[arg-type]
        with httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=20) as answer:
            body = answer.read()
        assert body.endswith(b"data: [DONE]\n\n") and b"error" not in body
        assert body.count(b'"t":') == 40
        assert r.replicas()[url_of(busy)]["healthy"] is False  # ejected all the same: no new requests go there


class _HalfThenFrozen(tuple[bytes, ...]):
    """Half an event at once, then the replica freezes (its next chunk 20 s away)."""

    stub: StubUpstream | None = None

    def __iter__(self) -> Iterator[bytes]:
        yield b'data: {"id":"cmpl-stub","cho'
        assert self.stub is not None
        self.stub.chunk_delay_s = 20.0
        yield from DEFAULT_CHUNKS[1:]


def test_a_replica_frozen_inside_an_event_has_it_ended_before_the_error_event() -> None:
    """The 504 event was glued onto the half event (``..."chodata: {"error"...``): no client could parse it."""
    chunks = _HalfThenFrozen(DEFAULT_CHUNKS)
    with stubs(1, metrics_delay_s=5.0, stream_chunks=chunks) as (frozen,), \
            router([frozen], **FROZEN) as r:  # type: ignore[arg-type]
        chunks.stub = frozen
        with httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=20) as answer:
            body = answer.read()
    events = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]
    assert events[0] == b'{"id":"cmpl-stub","cho'
    assert json.loads(events[1])["error"]["code"] == 504 and events[2] == b"[DONE]"


def test_a_full_connection_pool_is_a_wait_in_the_router_not_a_replica_that_timed_out() -> None:
    """With every pooled connection busy, the next request's wait counted as the replica's connect
    timeout: a 504 naming a healthy replica, which was then ejected."""
    with stubs(1, chunk_delay_s=0.3) as (stub,), router([stub], max_connections=2) as r:  # type: ignore[arg-type]
        name = url_of(stub)
        streams = [httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=30) for _ in range(2)]
        answers = [s.__enter__() for s in streams]
        time.sleep(0.5)
        extra = httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=30)
        bodies = [b"".join(a.iter_raw()) for a in answers]
        for stream in streams:
            stream.__exit__(None, None, None)
        assert extra.status_code == 200, extra.text
        assert all(body.endswith(b"[DONE]\n\n") for body in bodies)
        assert r.replicas()[name]["healthy"]
        assert not r.sample("moeslo_router_ejections_total", replica=name)


def test_scrapes_do_not_wait_for_the_capped_forwarding_pool() -> None:
    """With the only pooled connection held by a long stream, the scrapes waited for it, timed out, and a
    healthy replica was ejected as frozen."""
    chunks = (*(f'data: {{"t":{i}}}\n\n'.encode() for i in range(10)), b"data: [DONE]\n\n")
    with stubs(1, stream_chunks=chunks, chunk_delay_s=0.2) as (stub,), \
            router([stub], max_connections=1, **FROZEN) as r:  # type: ignore[arg-type]
        name = url_of(stub)
        with httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=30) as answer:
            body = answer.read()
        assert body.endswith(b"data: [DONE]\n\n") and body.count(b'"t":') == 10
        assert stub.requests["/metrics"] >= 5, "the replica was scraped while its stream held the pool"
        assert r.replicas()[name]["healthy"]
        assert not r.sample("moeslo_router_ejections_total", replica=name)


def test_a_request_retried_on_another_replica_is_not_ended_by_the_first_ones_ejection() -> None:
    import asyncio

    from router.config import RouterConfig
    from router.forward import Router, _Exchange

    frozen, healthy = "http://127.0.0.1:1", "http://127.0.0.1:2"
    outcome: dict[str, object] = {}

    async def scenario() -> None:
        r = Router(RouterConfig(replicas=(frozen, healthy), scrape_interval_s=0.05, scrape_timeout_s=0.05,
                                eject_after_silent=3))  # fmt: skip
        exchange = _Exchange(send=None)  # type: ignore[arg-type]

        async def request() -> None:
            task = asyncio.current_task()
            assert task is not None
            r._in_flight.setdefault(frozen, {})[task] = exchange
            exchange.heard_s = r.clock()
            await asyncio.sleep(0.05)  # not accepted there: retried on the healthy one, as _attempt does
            del r._in_flight[frozen]
            r._in_flight.setdefault(healthy, {})[task] = exchange
            exchange.heard_s = r.clock()
            await asyncio.sleep(0.6)  # twice the silence window, a long answer on the healthy replica
            outcome["served"] = True

        task = asyncio.create_task(request())
        await asyncio.sleep(0.01)
        r.eject(frozen, frozen=True)
        await task

    asyncio.run(scenario())
    assert outcome == {"served": True}


def test_a_request_on_a_replica_readmitted_meanwhile_is_not_ended_as_frozen() -> None:
    """The silence watch set at a frozen ejection went on after the replica passed its health checks again, and
    ended a request it was still prefilling, healthy, as if the replica were frozen."""
    import asyncio

    from router.config import RouterConfig
    from router.forward import Router, _Exchange

    name = "http://127.0.0.1:1"
    outcome: dict[str, object] = {}

    async def scenario() -> None:
        r = Router(RouterConfig(replicas=(name,), scrape_interval_s=0.05, scrape_timeout_s=0.05,
                                eject_after_silent=3))  # fmt: skip
        exchange = _Exchange(send=None)  # type: ignore[arg-type]

        async def request() -> None:
            task = asyncio.current_task()
            assert task is not None
            r._in_flight.setdefault(name, {})[task] = exchange
            exchange.heard_s = r.clock()
            await asyncio.sleep(0.8)  # a long prefill: silent past the 0.3 s window, on a live replica
            outcome["served"] = True

        task = asyncio.create_task(request())
        await asyncio.sleep(0.1)
        r.eject(name, frozen=True)  # heard 0.1 s ago: watched, not ended
        for _ in range(r.config.readmit_after):
            r.pool.health_result(name, True)
        assert r.pool.is_healthy(name)  # readmitted before the watch looks again
        await task

    asyncio.run(scenario())
    assert outcome == {"served": True}
