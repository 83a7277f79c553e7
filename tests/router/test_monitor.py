"""The monitor against a mock transport: what ejects a replica, what does not, and readmission."""

from __future__ import annotations

import asyncio

import httpx

from router.config import RouterConfig
from router.forward import Router
from router.monitor import Monitor

A = "http://a:8000"
METRICS = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 4.0\n"


def run_ticks(behaviour: dict[str, object], ticks: int, router: Router) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        answer = behaviour[request.url.path]
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, httpx.Response)
        return answer

    async def go() -> None:
        monitor = Monitor(router, transport=httpx.MockTransport(handle))
        for _ in range(ticks):
            await monitor.tick()
        await monitor.stop()

    asyncio.run(go())


def test_a_scrape_sets_the_load_and_a_slow_one_keeps_the_replica() -> None:
    router = Router(RouterConfig(replicas=(A,)))
    run_ticks({"/metrics": httpx.Response(200, text=METRICS)}, 1, router)
    assert router.pool.snapshot()[0].waiting == 4
    run_ticks({"/metrics": httpx.ReadTimeout("slow")}, 3, router)
    assert router.pool.is_healthy(A) and router.pool.snapshot()[0].waiting == 4
    run_ticks({"/metrics": httpx.Response(200, text="garbage{")}, 1, router)
    assert router.pool.is_healthy(A)


def test_a_refused_scrape_ejects_and_passing_health_checks_readmit() -> None:
    router = Router(RouterConfig(replicas=(A,), readmit_after=2))
    run_ticks({"/metrics": httpx.ConnectError("refused")}, 1, router)
    assert not router.pool.is_healthy(A)
    assert router.metrics.registry.get_sample_value("moeslo_router_replica_healthy", {"replica": A}) == 0
    run_ticks({"/health": httpx.Response(503)}, 3, router)
    assert not router.pool.is_healthy(A)
    run_ticks({"/health": httpx.Response(200)}, 2, router)
    assert router.pool.is_healthy(A)
    assert router.metrics.registry.get_sample_value("moeslo_router_replica_healthy", {"replica": A}) == 1
    assert router.metrics.registry.get_sample_value("moeslo_router_ejections_total", {"replica": A}) == 1
