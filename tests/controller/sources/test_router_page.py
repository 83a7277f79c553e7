"""The entry router's page as the scrape source reads it: its queue, its refusals and their rate."""

from __future__ import annotations

import asyncio

import pytest

from controller.policy import Policy
from controller.sources import ScrapeSource
from controller.sources.router_page import RefusalRates, RouterReading, parse_router_page
from tests.controller.sources.engine_page import EngineMetrics, MetricsServer, RouterPage

MODEL = "Qwen/Qwen3-30B-A3B"


def test_the_page_gives_the_queue_and_the_refusals_so_far() -> None:
    page = RouterPage()
    assert parse_router_page(page.render().decode()) == RouterReading(queued=0.0, refused_total=0.0)
    page.hold(2)
    page.refuse(7)
    page.metrics.request("http://engine:8000", "lowest_cost", "ok")  # served: not a refusal
    assert parse_router_page(page.render().decode()) == RouterReading(queued=2.0, refused_total=7.0)
    assert parse_router_page(EngineMetrics(MODEL).render().decode()) is None  # not a router


def test_the_refusal_rate_covers_the_window_and_survives_a_restart() -> None:
    rates = RefusalRates(window_s=60.0)
    rates.record("r", 0.0, 100.0)
    assert rates.rate("r") is None  # one read: a baseline, not a rate
    rates.record("r", 15.0, 130.0)
    assert rates.rate("r") == pytest.approx(2.0)
    rates.record("r", 30.0, 10.0)  # the router restarted and refused 10 since
    assert rates.rate("r") == pytest.approx(40 / 30)
    for t in (45.0, 60.0, 75.0, 90.0):
        rates.record("r", t, 10.0)  # nothing more refused
    # The window is the last 60 s (30 .. 90): the 40 before it have left.
    assert rates.rate("r") == pytest.approx(0.0)
    assert rates.rate("other") is None


def test_the_refusal_rate_starts_at_the_last_read_at_or_before_the_window() -> None:
    rates = RefusalRates(window_s=60.0)
    for t in range(0, 90, 10):
        rates.record("r", float(t), float(min(t, 40)))  # one refusal a second until 40 s, then none
    # At 80 s the window starts at 20 s (20 refused then, 40 now): 20 over 60 s.
    assert rates.rate("r") == pytest.approx(20 / 60)


def test_a_policy_naming_its_router_gets_the_refusal_rate() -> None:
    engine, routers = EngineMetrics(MODEL), [RouterPage(), RouterPage()]
    servers = [MetricsServer(engine), *(MetricsServer(r) for r in routers)]  # type: ignore[arg-type]
    routed = Policy.model_validate({"name": "p", "target": {"kind": "local", "model": MODEL,
                                                           "endpoints": [servers[0].url]},
                                    "router": {"endpoints": [s.url for s in servers[1:]]}})  # fmt: skip
    source = ScrapeSource(lambda p: p.target.endpoints, rate_window_s=60.0)  # type: ignore[union-attr]

    async def scenario() -> None:
        first = (await source.observe([routed], 0.0))["p"]
        assert first.router_queued == 0.0 and first.router_refused_rps is None  # no rate from one read
        routers[0].refuse(30)
        routers[1].refuse(15)
        later = (await source.observe([routed], 15.0))["p"]
        assert later.router_refused_rps == pytest.approx(3.0) and later.errors == ()
        servers[2].stop()  # one router unread: the sum would understate the refusals, so they are unknown
        down = (await source.observe([routed], 30.0))["p"]
        assert down.router_refused_rps is None and down.router_queued is None and len(down.errors) == 1

    try:
        asyncio.run(scenario())
    finally:
        for server in servers[:2]:
            server.stop()
        asyncio.run(source.aclose())
