"""The monitor against stub replicas on 127.0.0.1: what ejects a replica, what does not, and readmission."""

from __future__ import annotations

import asyncio

import pytest

from router.config import RouterConfig
from router.forward import Router
from router.monitor import Monitor, Repeating
from tests.router.servers import WAITING_TEXT, stubs, url_of

pytestmark = pytest.mark.timeout(60)


def ticks(router: Router, count: int) -> None:
    async def go() -> None:
        monitor = Monitor(router)
        for _ in range(count):
            await monitor.tick()
        await monitor.stop()
        await router.aclose()

    asyncio.run(go())


def test_a_scrape_sets_the_load_and_a_slow_or_garbled_one_keeps_the_replica() -> None:
    with stubs(1, metrics_text=WAITING_TEXT.format(waiting=4)) as (stub,):
        router = Router(RouterConfig(replicas=(url_of(stub),), scrape_timeout_s=0.2))
        ticks(router, 1)
        assert router.pool.snapshot()[0].waiting == 4
        stub.metrics_delay_s = 0.5
        ticks(router, 2)
        assert router.pool.is_healthy(url_of(stub)) and router.pool.snapshot()[0].waiting == 4
        stub.metrics_delay_s, stub.metrics_text = 0.0, "vllm:num_requests_waiting{garbage 1\n"
        ticks(router, 1)
        assert router.pool.is_healthy(url_of(stub)) and router.pool.snapshot()[0].waiting == 4


def test_a_refused_scrape_ejects_and_passing_health_checks_readmit() -> None:
    with stubs(1) as (stub,):
        url, port = url_of(stub), stub.port
        router = Router(RouterConfig(replicas=(url,), readmit_after=2))
        stub.stop_in_thread()
        ticks(router, 3)  # the scrape is refused, then so are the health checks
        assert not router.pool.is_healthy(url)
        assert router.metrics.registry.get_sample_value("moeslo_router_replica_healthy", {"replica": url}) == 0
        stub.start_in_thread(port)
        ticks(router, 1)
        assert not router.pool.is_healthy(url)  # one pass of two
        ticks(router, 1)
        assert router.pool.is_healthy(url)
        assert router.metrics.registry.get_sample_value("moeslo_router_replica_healthy", {"replica": url}) == 1
        assert router.metrics.registry.get_sample_value("moeslo_router_ejections_total", {"replica": url}) == 1


def test_a_replica_silent_for_several_scrapes_in_a_row_is_ejected_and_readmitted_when_it_answers() -> None:
    with stubs(1, metrics_text=WAITING_TEXT.format(waiting=1)) as (stub,):
        url = url_of(stub)
        router = Router(RouterConfig(replicas=(url,), scrape_timeout_s=0.1, eject_after_silent=3, readmit_after=1))
        ticks(router, 1)
        assert router.pool.snapshot()[0].waiting == 1
        stub.metrics_delay_s = 0.3
        ticks(router, 2)
        assert router.pool.is_healthy(url)  # late twice: busy, not frozen
        ticks(router, 1)
        assert not router.pool.is_healthy(url)  # the third silent scrape in a row
        assert router.pool.snapshot()[0].waiting == 0  # its last load goes with it
        ticks(router, 1)  # /health answers (only /metrics is slow): readmitted
        assert router.pool.is_healthy(url)
        ticks(router, 2)
        stub.metrics_delay_s = 0.0
        ticks(router, 1)  # an answer: the count starts again
        stub.metrics_delay_s = 0.3
        ticks(router, 2)
        assert router.pool.is_healthy(url)


def test_a_replica_whose_health_fails_is_ejected_though_its_metrics_answer() -> None:
    # An engine whose core died keeps its API process: /metrics still answers (with its last, light load)
    # while /health and every request answer 503.
    with stubs(1, metrics_text=WAITING_TEXT.format(waiting=0)) as (stub,):
        url = url_of(stub)
        router = Router(RouterConfig(replicas=(url,), readmit_after=2))
        ticks(router, 1)
        assert router.pool.is_healthy(url)
        stub.health_status = 503
        ticks(router, 1)
        assert not router.pool.is_healthy(url)
        assert router.metrics.registry.get_sample_value("moeslo_router_ejections_total", {"replica": url}) == 1
        ticks(router, 3)
        assert not router.pool.is_healthy(url)  # still failing: not readmitted
        stub.health_status = 200
        ticks(router, 2)
        assert router.pool.is_healthy(url)


class _FailsOnce(Repeating):
    def __init__(self) -> None:
        self.calls = 0

    async def once(self) -> None:
        self.calls += 1
        if self.calls == 1:
            raise ValueError("a bug in one round")

    @property
    def interval_s(self) -> float:
        return 0.01


def test_an_exception_in_one_round_does_not_stop_the_task(caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> int:
        task = _FailsOnce()
        task.start()
        await asyncio.sleep(0.2)
        await task.stop()
        return task.calls

    assert asyncio.run(go()) > 2
    assert "a bug in one round" in caplog.text
