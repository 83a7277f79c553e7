"""Queue mode holds requests first come, first served: a later arrival never overtakes a held one.

The replica is an aiohttp app on 127.0.0.1 that records the order requests reach it and holds each
until the test lets it go; the cost model gives it room for one request at a time (1,200 prompt tokens at 4,000
tokens/s: 0.3 s alone, 0.6 s behind another, over the 0.5 s objective).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import httpx
import pytest
from aiohttp import web

from bench.stub_upstream import COMPLETION
from contracts.errors import OverloadedError
from router.config import RouterConfig
from router.features import request_features
from router.forward import Router
from router.pool import Ticket
from router.types import RequestFeatures
from tests.router.servers import WAITING_TEXT, RunningRouter, eventually, replica_app, router, serving

pytestmark = pytest.mark.timeout(60)
PROMPT_TOKENS = 1200
ONE_AT_A_TIME = {"admission": "queue", "prefill_tokens_per_s": 4000.0, "policy": "least-loaded"}


class HoldingReplica:
    """Records the order completions reach it (their prompts' first token id); answers the n-th only once the test
    has let n go."""

    def __init__(self) -> None:
        self.order: list[int] = []
        self.let_go = 0

    def app(self) -> web.Application:
        async def completion(request: web.Request) -> web.Response:
            self.order.append((await request.json())["prompt"][0])
            place = len(self.order)
            while self.let_go < place:
                await asyncio.sleep(0.01)
            return web.Response(body=COMPLETION, content_type="application/json")

        return replica_app(completion)


def post(r: RunningRouter, index: int, statuses: dict[int, int], timeout_s: float = 20) -> threading.Thread:
    """Post prompt ``index`` from a thread of its own, its status into ``statuses`` (none if it timed out)."""

    def go() -> None:
        body = {"prompt": [index] * PROMPT_TOKENS, "max_tokens": 1}
        with contextlib.suppress(httpx.TimeoutException):
            statuses[index] = httpx.post(r.url + "/v1/completions", json=body, timeout=timeout_s).status_code

    thread = threading.Thread(target=go)
    thread.start()
    return thread


def test_held_requests_are_served_in_the_order_they_arrived_and_the_last_ones_refused() -> None:
    replica, statuses = HoldingReplica(), {}
    with serving(replica.app()) as url, router([url], max_queue_s=1.5, **ONE_AT_A_TIME) as r:  # type: ignore[arg-type]
        threads = []
        for index in range(1, 9):  # each sent once the one before has reached the router (held, or at the replica)
            threads.append(post(r, index, statuses))
            eventually(lambda n=index: len(replica.order) + r.sample("moeslo_router_queued_requests") == n, 5,
                       "its arrival")  # fmt: skip
        for freed in (1, 2, 3):  # well before the first held request's 1.5 s
            replica.let_go = freed
            eventually(lambda n=freed: len(replica.order) == n + 1, 5, "the next one at the replica")
        for thread in threads[4:]:
            thread.join(10)  # refused after max_queue_s, the fourth still at the replica
        replica.let_go = 8
        for thread in threads[:4]:
            thread.join(10)
        assert replica.order == [1, 2, 3, 4], "not first come, first served"
        assert statuses == {1: 200, 2: 200, 3: 200, 4: 200, 5: 429, 6: 429, 7: 429, 8: 429}
        eventually(lambda: r.sample("moeslo_router_queued_requests") == 0, 5, "the queue emptied")


def test_past_max_queued_held_requests_a_new_one_is_refused_at_once() -> None:
    """The line had no bound: under overload each held request kept its body and socket for max_queue_s."""
    replica, statuses = HoldingReplica(), {}
    with serving(replica.app()) as url, \
            router([url], max_queue_s=10.0, max_queued=2, **ONE_AT_A_TIME) as r:  # type: ignore[arg-type]  # fmt: skip
        threads = [post(r, 1, statuses)]
        eventually(lambda: replica.order == [1], 5, "the first request at the replica")
        for index in (2, 3):  # one after the other: each held before the next is sent
            threads.append(post(r, index, statuses))
            eventually(lambda n=index: r.sample("moeslo_router_queued_requests") == n - 1, 5, "held")
        started = time.monotonic()
        post(r, 4, statuses).join(5)
        assert statuses == {4: 429} and time.monotonic() - started < 2.0  # not after max_queue_s
        replica.let_go = 3
        for thread in threads:
            thread.join(10)
        assert statuses == {1: 200, 2: 200, 3: 200, 4: 429} and replica.order == [1, 2, 3]


def test_a_held_request_whose_client_leaves_gives_its_turn_to_the_next() -> None:
    replica, statuses = HoldingReplica(), {}
    with serving(replica.app()) as url, router([url], max_queue_s=10.0, **ONE_AT_A_TIME) as r:  # type: ignore[arg-type]
        first = post(r, 1, statuses)
        eventually(lambda: replica.order == [1], 5, "the first request at the replica")
        post(r, 2, statuses, timeout_s=0.3).join(5)  # held behind the first, then gone
        eventually(lambda: r.sample("moeslo_router_queued_requests") == 0, 5, "the departed request out of the line")
        third = post(r, 3, statuses)
        eventually(lambda: r.sample("moeslo_router_queued_requests") == 1, 5, "the third held")
        replica.let_go = 2
        for thread in (first, third):
            thread.join(10)
        assert replica.order == [1, 3] and statuses == {1: 200, 3: 200}


def test_the_line_moves_only_on_wake_ups_in_order_and_a_cancelled_request_leaves_it() -> None:
    """No network, no polling (a scrape interval of a minute): each freed place admits the next in line."""
    replica = "http://127.0.0.1:9"
    config = RouterConfig(replicas=(replica,), scrape_interval_s=60.0, max_queue_s=30.0, **ONE_AT_A_TIME)  # type: ignore[arg-type]

    async def go() -> list[int]:
        router = Router(config)
        admitted: list[int] = []
        # The place taken by a long prompt: the first in line looks again 0.8 s on unless woken.
        tickets: dict[int, Ticket] = {0: router.pool.begin(replica, 4000)}

        async def ask(index: int, prompt_tokens: int = PROMPT_TOKENS) -> None:
            await router.decide(request_features({"prompt": [index] * prompt_tokens}))
            admitted.append(index)
            tickets[index] = router.pool.begin(replica, prompt_tokens)  # as the request path does, at once

        held = [asyncio.create_task(ask(i)) for i in (1, 2, 3)]
        await asyncio.sleep(0.05)
        small = asyncio.create_task(ask(4, prompt_tokens=100))  # it would fit beside the one running: it waits
        await asyncio.sleep(0.05)
        assert (admitted, len(router.held)) == ([], 4)
        router.held.wake()  # a wake-up (a scrape, say) as the first in line's client leaves
        held[0].cancel()
        await asyncio.sleep(0.05)
        assert (admitted, len(router.held), held[0].cancelled()) == ([], 3, True)
        for index in (0, 2, 3):
            router.pool.finish(tickets[index])
            await asyncio.sleep(0.05)
        await asyncio.wait_for(small, 5)
        assert router.metrics.registry.get_sample_value("moeslo_router_queued_requests") == 0
        return admitted

    assert asyncio.run(go()) == [2, 3, 4]


def test_the_wait_in_line_shows_as_queue_wait_not_as_router_overhead() -> None:
    replica, statuses = HoldingReplica(), {}
    with serving(replica.app()) as url, router([url], max_queue_s=10.0, **ONE_AT_A_TIME) as r:  # type: ignore[arg-type]
        first = post(r, 1, statuses)
        eventually(lambda: replica.order == [1], 5, "the first request at the replica")
        second = post(r, 2, statuses)
        eventually(lambda: r.sample("moeslo_router_queued_requests") == 1, 5, "the second held")
        threading.Event().wait(1.0)  # held a second behind the first
        replica.let_go = 2
        for thread in (first, second):
            thread.join(10)
        assert statuses == {1: 200, 2: 200}
        assert r.sample("moeslo_router_queue_wait_seconds_count") == 1  # only the held request waited
        assert r.sample("moeslo_router_queue_wait_seconds_sum") >= 1.0
        assert r.sample("moeslo_router_overhead_seconds_count") == 2
        assert r.sample("moeslo_router_overhead_seconds_sum") < 0.5  # the router's own work, milliseconds


class FailingReplica:
    """A replica whose scraped queue the test sets, whose completions answer 503 (an engine whose core died) and
    whose /health answers ``health_after_503`` once it has."""

    def __init__(self, *, waiting: int, health_after_503: int = 200) -> None:
        self.waiting, self.health, self.health_after_503, self.completions = waiting, 200, health_after_503, 0

    def app(self) -> web.Application:
        async def completion(_: web.Request) -> web.Response:
            self.completions += 1
            self.health = self.health_after_503
            return web.json_response({"error": {"message": "core died", "code": 503}}, status=503)

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=WAITING_TEXT.format(waiting=self.waiting))

        async def health(_: web.Request) -> web.Response:
            return web.Response(text="", status=self.health)

        return replica_app(completion, gets={"/metrics": metrics, "/health": health})


def test_a_retry_in_queue_mode_keeps_the_requests_deadline() -> None:
    # Both replicas busy; one frees up late in the wait and answers 503 (and stays unhealthy). The retry waits for
    # the other only until the request's own deadline, not a fresh one.
    busy, failing = FailingReplica(waiting=100), FailingReplica(waiting=100, health_after_503=503)
    with serving(busy.app()) as busy_url, serving(failing.app()) as failing_url, \
            router([busy_url, failing_url], admission="queue", max_queue_s=1.5) as r:  # fmt: skip
        eventually(lambda: r.replicas()[failing_url]["waiting"] == 100, 5, "the queues scraped")
        timer = threading.Timer(0.9, lambda: setattr(failing, "waiting", 0))
        timer.start()
        started = time.monotonic()
        answer = httpx.post(r.url + "/v1/completions", json={"prompt": "held", "max_tokens": 4}, timeout=10)
        waited_s = time.monotonic() - started
        timer.join()
        assert (answer.status_code, failing.completions, busy.completions) == (429, 1, 0), answer.text
        assert waited_s < 2.2, f"held {waited_s:.1f} s with --max-queue-s 1.5"


def test_a_prompt_with_a_cached_prefix_waits_behind_held_requests_like_any_that_fits() -> None:
    """A 2,100-token prompt whose first 1,024 tokens the replica holds fits now, as a short one does: both wait
    their turn behind the request already held (judged without the cached prefix, the long one went first)."""
    replica = "http://127.0.0.1:9"
    config = RouterConfig(replicas=(replica,), admission="queue", max_queue_s=0.2, scrape_interval_s=60.0,
                          prefix_max_blocks=64)  # fmt: skip

    def features(prompt: list[int]) -> RequestFeatures:
        return request_features({"prompt": prompt}, block_tokens=16, max_blocks=64)

    async def go() -> None:
        router = Router(config)
        shared = list(range(1024))
        router.prefixes.record(replica, features(shared + [7] * 100).prefix_blocks)  # sent there before
        router.pool.begin(replica, 800)  # 800 prompt tokens at the replica
        router.held.join()  # a request held already (one that does not fit)
        for prompt in ([9] * 500, shared + [3] * 1076):
            with pytest.raises(OverloadedError, match="earlier requests are still held"):
                await router.decide(features(prompt))

    asyncio.run(go())


def test_a_retry_held_first_in_line_goes_back_to_its_replica_once_readmitted() -> None:
    # One replica busy, one free that answers 503 and is readmitted (its /health answers 200). The retry, held
    # first in line, takes the readmitted replica again: left out for good, it (and every request behind it) waited
    # out the whole --max-queue-s while that replica stood idle.
    busy, failing = FailingReplica(waiting=100), FailingReplica(waiting=0, health_after_503=200)
    with serving(busy.app()) as busy_url, serving(failing.app()) as failing_url, \
            router([busy_url, failing_url], admission="queue", max_queue_s=8.0) as r:  # fmt: skip
        eventually(lambda: r.replicas()[busy_url]["waiting"] == 100, 5, "the queues scraped")
        started = time.monotonic()
        answer = httpx.post(r.url + "/v1/completions", json={"prompt": "held", "max_tokens": 4}, timeout=20)
        waited_s = time.monotonic() - started
        assert failing.completions == 2 and busy.completions == 0, answer.text
        assert waited_s < 6.0, f"held {waited_s:.1f} s though its replica was readmitted"
