"""The direct-scrape source: good ratios from bucket counters between scrapes, resets, outages."""

from __future__ import annotations

import asyncio
import math

import pytest

from controller.policy import Policy
from controller.sources import ScrapeSource, histogram_quantile, parse_metrics, parse_router_queue
from controller.sources.base import good_count_at
from tests.controller.sources.engine_page import EngineMetrics, MetricsServer, RouterPage, TrickleServer

MODEL = "Qwen/Qwen3-30B-A3B"


def _policy(endpoints: list[str], name: str = "p") -> Policy:
    return Policy.model_validate(
        {"name": name, "target": {"kind": "local", "model": MODEL, "endpoints": endpoints}}
    )


def test_parse_reads_vllm_histograms_gauges_and_imbalance() -> None:
    engine = EngineMetrics(MODEL)
    engine.requests([0.1, 0.4, 0.9], [0.01, 0.03])
    engine.waiting.set(4)
    engine.kv.set(0.5)
    engine.set_imbalance([0.1, 0.3])
    sample = parse_metrics(engine.render().decode())[MODEL]
    assert sample.counters["ttft:le:0.5"] == 2 and sample.counters["ttft:count"] == 3
    assert sample.counters["itl:le:0.02"] == 1 and sample.counters["requests"] == 3
    assert sample.waiting == 4 and sample.kv_usage == 0.5
    assert sample.imbalance_by_layer == {0: 0.1, 1: 0.3}


def test_a_nan_figure_is_nothing_to_report_not_a_value() -> None:
    """vLLM's multiprocess route sets a layer with nothing routed in its window to NaN (its gauge cannot be
    removed): read as a value, NaN reached the imbalance SLI's max."""
    engine = EngineMetrics(MODEL)
    engine.set_imbalance([0.1, math.nan])
    assert parse_metrics(engine.render().decode())[MODEL].imbalance_by_layer == {0: 0.1}


def test_a_data_parallel_page_averages_its_engines_kv_and_keeps_each_layers_worst_cv() -> None:
    """vLLM data parallelism puts one series per engine (engine="0".."N-1") on one page: the last engine's
    figures alone hid a full KV cache and a skewed layer, as the Prometheus source's avg and max do not."""
    page = "\n".join([
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f'vllm:kv_cache_usage_perc{{model_name="{MODEL}",engine="0"}} 0.95',
        f'vllm:kv_cache_usage_perc{{model_name="{MODEL}",engine="1"}} 0.05',
        "# TYPE moe_layer_imbalance_cv gauge",
        f'moe_layer_imbalance_cv{{model_name="{MODEL}",engine="0",layer="0"}} 0.40',
        f'moe_layer_imbalance_cv{{model_name="{MODEL}",engine="1",layer="0"}} 0.02',
        f'moe_layer_imbalance_cv{{model_name="{MODEL}",engine="1",layer="1"}} 0.10',
        "",
    ])  # fmt: skip
    sample = parse_metrics(page)[MODEL]
    assert sample.kv_usage == pytest.approx(0.5)
    assert sample.imbalance_by_layer == {0: 0.40, 1: 0.10}


def test_good_ratio_between_scrapes_and_across_an_engine_restart() -> None:
    a, b = EngineMetrics(MODEL, engine="a"), EngineMetrics(MODEL, engine="b")
    a.requests([0.1] * 50)  # history before the first scrape belongs to no window
    servers = [MetricsServer(a), MetricsServer(b)]
    policy = _policy([s.url for s in servers])
    source = ScrapeSource(lambda p: p.target.endpoints)  # type: ignore[union-attr]

    async def scenario() -> None:
        first = (await source.observe([policy], 0.0))["p"]
        assert first.errors == () and first.ready_replicas == 2
        assert first.sli is not None and first.sli.ttft_good_ratio is None  # no increase yet
        a.requests([0.1] * 90 + [0.9] * 10, [0.01] * 95 + [0.05] * 5)
        b.requests([0.2] * 100)
        a.waiting.set(3)
        b.waiting.set(2)
        a.set_imbalance([0.05, 0.2])
        second = (await source.observe([policy], 30.0))["p"]
        assert second.sli is not None
        assert second.sli.ttft_good_ratio == pytest.approx(190 / 200)
        assert second.sli.itl_good_ratio == pytest.approx(95 / 100)
        assert second.sli.requests_in_window == 200
        assert second.sli.itl_events_in_window == 100  # token gaps, which the ITL burn is judged over
        assert second.queue_depth == 5
        assert second.sli.imbalance_cv_max == 0.2
        assert second.request_rate_rps == pytest.approx(200 / 30)
        assert second.sli.ttft_good_ratio_by_window["30d"] == pytest.approx(0.95)
        # Engine a restarts (counters back to zero) and serves 10 slow requests.
        a.reset()
        a.requests([0.9] * 10)
        third = (await source.observe([policy], 60.0))["p"]
        assert third.sli is not None
        assert third.sli.ttft_good_ratio == pytest.approx(190 / 210)

    try:
        asyncio.run(scenario())
    finally:
        for server in servers:
            server.stop()
        asyncio.run(source.aclose())


def test_requests_ended_before_a_first_token_by_the_engine_are_bad_ttft_events() -> None:
    engine = EngineMetrics(MODEL)
    engine.ended_before_first_token(1, "deadline")  # the counter exists before the first scrape
    server = MetricsServer(engine)
    policy = _policy([server.url])
    source = ScrapeSource(lambda p: p.target.endpoints)  # type: ignore[union-attr]

    async def scenario() -> None:
        await source.observe([policy], 0.0)
        engine.requests([0.1] * 90)
        engine.ended_before_first_token(6, "deadline")
        engine.ended_before_first_token(4, "error")
        engine.ended_before_first_token(20, "abort")  # the client's abort is not the engine's failure
        sli = (await source.observe([policy], 30.0))["p"].sli
        assert sli is not None
        assert sli.ttft_good_ratio == pytest.approx(90 / 100)  # as the generated rules count them
        assert sli.requests_in_window == 100

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        asyncio.run(source.aclose())


def test_rates_cover_the_configured_window_only() -> None:
    engine = EngineMetrics(MODEL)
    server = MetricsServer(engine)
    policy = _policy([server.url])
    source = ScrapeSource(lambda p: p.target.endpoints, rate_window_s=10.0)  # type: ignore[union-attr]

    async def scenario() -> None:
        await source.observe([policy], 0.0)
        engine.requests([0.1] * 100)  # 100 requests in the first 10 s, then 10 in the next 10 s
        await source.observe([policy], 10.0)
        engine.requests([0.1] * 10)
        latest = (await source.observe([policy], 20.0))["p"]
        assert latest.request_rate_rps == pytest.approx(10 / 10)

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        asyncio.run(source.aclose())


def test_the_prefill_speed_is_prompt_tokens_over_prefill_seconds_in_the_sli_window() -> None:
    engine = EngineMetrics(MODEL)
    engine.prefills([50_000], [10.0])  # before the first scrape: in no window
    server = MetricsServer(engine)
    policy = _policy([server.url])
    source = ScrapeSource(lambda p: p.target.endpoints)  # type: ignore[union-attr]

    async def scenario() -> None:
        first = (await source.observe([policy], 0.0))["p"]
        assert first.prefill_tokens_per_s is None  # nothing finished since the baseline
        engine.prefills([8_000, 2_000], [0.4, 0.1])
        second = (await source.observe([policy], 30.0))["p"]
        assert second.prefill_tokens_per_s == pytest.approx(10_000 / 0.5)

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        asyncio.run(source.aclose())


def test_the_peak_rate_is_the_busiest_half_minute_of_the_sli_window() -> None:
    engine = EngineMetrics(MODEL)
    server = MetricsServer(engine)
    policy = _policy([server.url])
    source = ScrapeSource(lambda p: p.target.endpoints)  # type: ignore[union-attr]

    async def scenario() -> None:
        first = (await source.observe([policy], 0.0))["p"]
        assert first.request_rate_peak_rps is None  # one read is no rate
        for at_s in (10.0, 20.0, 30.0, 40.0, 50.0, 60.0):
            engine.requests([0.1] * (300 if at_s == 20.0 else 10))  # a burst of 300 in the 10 s before 20 s
            latest = (await source.observe([policy], at_s))["p"]
        # Reads 30 s apart: 0-30 s (10 + 300 + 10) and 10-40 s and 20-50 s hold the burst, 30-60 s does not.
        assert latest.request_rate_peak_rps == pytest.approx(320 / 30)
        assert latest.request_rate_rps == pytest.approx(350 / 60)

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        asyncio.run(source.aclose())


def test_the_sli_window_is_the_configured_one_and_forgets_an_old_burn() -> None:
    engine = EngineMetrics(MODEL)
    server = MetricsServer(engine)
    policy = _policy([server.url])
    source = ScrapeSource(lambda p: p.target.endpoints, sli_window_s=30.0)  # type: ignore[union-attr]

    async def scenario() -> None:
        await source.observe([policy], 0.0)
        engine.requests([0.9] * 20, [0.05] * 20)  # a bad start: every TTFT and gap over its threshold
        burning = (await source.observe([policy], 10.0))["p"]
        assert burning.sli is not None and burning.sli.window_s == 30.0
        assert burning.sli.ttft_good_ratio == 0.0 and burning.sli.itl_good_ratio == 0.0
        engine.requests([0.1] * 40, [0.01] * 40)
        await source.observe([policy], 30.0)
        engine.requests([0.1] * 40, [0.01] * 40)
        later = (await source.observe([policy], 50.0))["p"]
        assert later.sli is not None
        # 30 s back from 50 s starts at the scrape at 10 s (the last at or before 20 s): the bad start
        # is out of the SLI window, and still in the 5-minute burn window.
        assert later.sli.ttft_good_ratio == 1.0 and later.sli.itl_good_ratio == 1.0
        assert later.sli.requests_in_window == 80
        assert later.sli.ttft_good_ratio_by_window["5m"] == pytest.approx(80 / 100)

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        asyncio.run(source.aclose())


def test_a_down_endpoint_is_reported_and_the_others_still_count() -> None:
    up = EngineMetrics(MODEL)
    server = MetricsServer(up)
    dead = MetricsServer(EngineMetrics(MODEL))
    dead_url = dead.url
    dead.stop()
    policy = _policy([server.url, dead_url])
    source = ScrapeSource(lambda p: p.target.endpoints, timeout_s=1.0)  # type: ignore[union-attr]

    async def scenario() -> None:
        await source.observe([policy], 0.0)
        up.requests([0.1] * 30)
        obs = (await source.observe([policy], 10.0))["p"]
        assert obs.ready_replicas == 1
        assert len(obs.errors) == 1 and obs.errors[0].startswith(f"scrape {dead_url}: ConnectError")
        assert obs.sli is not None and obs.sli.ttft_good_ratio == 1.0

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        asyncio.run(source.aclose())


def test_a_trickling_endpoint_fails_its_own_scrape_within_the_timeout() -> None:
    """An endpoint that sends a byte every 0.2 s never trips a per-read timeout: the whole read is bounded, so
    it is that endpoint's failed scrape, and the other policy's observation comes on time."""
    fast, slow = MetricsServer(EngineMetrics(MODEL)), TrickleServer()
    policies = [_policy([fast.url]), _policy([slow.url], name="slow")]
    source = ScrapeSource(lambda p: p.target.endpoints, timeout_s=0.5)  # type: ignore[union-attr]

    async def scenario() -> tuple[dict[str, tuple[str, ...]], float]:
        started = asyncio.get_running_loop().time()
        seen = await asyncio.wait_for(source.observe(policies, 0.0), 5.0)
        return {name: obs.errors for name, obs in seen.items()}, asyncio.get_running_loop().time() - started

    try:
        errors, took_s = asyncio.run(scenario())
    finally:
        fast.stop()
        slow.stop()
        asyncio.run(source.aclose())
    assert took_s < 2.0
    assert errors["p"] == ()
    assert errors["slow"] == (f"scrape {slow.url}: no complete answer within 0.5 s",)


def test_all_endpoints_down_gives_no_values_never_zeros() -> None:
    dead = MetricsServer(EngineMetrics(MODEL))
    url = dead.url
    dead.stop()
    source = ScrapeSource(lambda p: p.target.endpoints, timeout_s=1.0)  # type: ignore[union-attr]
    obs = asyncio.run(source.observe([_policy([url])], 0.0))["p"]
    asyncio.run(source.aclose())
    assert obs.queue_depth is None and obs.running_requests is None and obs.sli is None
    assert obs.errors


def test_stock_vllm_itl_without_a_0_02_edge_is_interpolated() -> None:
    engine = EngineMetrics(MODEL, stock_vllm_itl=True)  # edges 0.01, 0.025: no 0.02
    server = MetricsServer(engine)
    policy = _policy([server.url])
    source = ScrapeSource(lambda p: p.target.endpoints)  # type: ignore[union-attr]

    async def scenario() -> None:
        await source.observe([policy], 0.0)
        engine.requests([0.1], [0.005] * 50 + [0.02] * 50)  # 50 at <= 0.01, 50 in (0.01, 0.025]
        obs = (await source.observe([policy], 10.0))["p"]
        assert obs.errors == ()
        assert obs.sli is not None
        # 50 + 50 * (0.02 - 0.01) / (0.025 - 0.01) = 83.3 of 100
        assert obs.sli.itl_good_ratio == pytest.approx((50 + 50 * 2 / 3) / 100)

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
        asyncio.run(source.aclose())


def test_histogram_math_matches_prometheus() -> None:
    buckets = {0.1: 10.0, 0.5: 60.0, 1.0: 100.0, math.inf: 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (50 - 10) / 50)
    assert histogram_quantile(0.99, {0.1: 0.0, math.inf: 10.0}) == 0.1
    assert histogram_quantile(0.5, {0.1: 0.0, math.inf: 0.0}) is None
    assert good_count_at(buckets, 0.5) == 60.0
    assert good_count_at(buckets, 0.3) == pytest.approx(10 + 50 * 0.5)
    assert good_count_at(buckets, 0.05) == pytest.approx(5.0)
    assert good_count_at(buckets, 2.0) is None


def test_the_router_queue_is_read_from_the_routers_page() -> None:
    page = RouterPage()
    assert parse_router_queue(page.render().decode()) == 0.0
    page.hold(3)
    assert parse_router_queue(page.render().decode()) == 3.0
    assert parse_router_queue(EngineMetrics(MODEL).render().decode()) is None  # not a router


def test_a_policy_naming_its_router_gets_the_router_queue() -> None:
    engine, routers = EngineMetrics(MODEL), [RouterPage(), RouterPage()]
    servers = [MetricsServer(engine), *(MetricsServer(r) for r in routers)]  # type: ignore[arg-type]
    engine_url, router_urls = servers[0].url, [s.url for s in servers[1:]]
    routed = Policy.model_validate({"name": "p", "target": {"kind": "local", "model": MODEL, "endpoints": [engine_url]},
                                    "router": {"endpoints": router_urls}})  # fmt: skip
    unrouted = _policy([engine_url], name="q")
    assert routed.router is not None
    empty = routed.model_copy(update={"name": "r", "router": routed.router.model_copy(update={"endpoints": ()})})
    source = ScrapeSource(lambda p: p.target.endpoints)  # type: ignore[union-attr]

    async def scenario() -> None:
        routers[0].hold(2)
        routers[1].hold(1)
        seen = await source.observe([routed, unrouted, empty], 0.0)
        assert seen["p"].router_queued == 3.0 and seen["p"].errors == ()
        assert seen["p"].ready_replicas == 1  # the routers are not engines
        assert seen["q"].router_queued is None and seen["q"].errors == ()
        assert seen["r"].router_queued is None and "router.endpoints is empty" in seen["r"].errors[0]
        servers[2].stop()  # one router down: the sum would understate the demand, so it is unknown
        down = (await source.observe([routed], 15.0))["p"]
        assert down.router_queued is None and down.queue_depth == 0
        assert len(down.errors) == 1 and down.errors[0].startswith(f"router {router_urls[1]}:")
        # An engine page where a router is expected is an error too, not a zero.
        assert routed.router is not None
        wrong = routed.model_copy(update={"router": routed.router.model_copy(update={"endpoints": (engine_url,)})})
        mistaken = (await source.observe([wrong], 30.0))["p"]
        assert mistaken.router_queued is None and "no moeslo_router_queued_requests series" in mistaken.errors[0]

    try:
        asyncio.run(scenario())
    finally:
        for server in servers[:2]:
            server.stop()
        asyncio.run(source.aclose())


def test_an_endpoint_whose_read_raises_anything_is_that_endpoints_failure() -> None:
    """A URL httpx cannot even build a request for (a port past 65535 raised OverflowError) fails its own
    endpoint, not the tick that reads every policy."""
    import asyncio

    from controller.sources.scrape import _read_all

    async def read(url: str) -> str:
        if "80800" in url:
            raise OverflowError("port must be 0-65535.")
        return "page"

    ok, failures = asyncio.run(_read_all(read, ["http://a:1", "http://a:80800"], "engine", 1.0))  # type: ignore[arg-type]
    assert ok == {"http://a:1": "page"}
    assert failures == {"http://a:80800": "engine http://a:80800: OverflowError: port must be 0-65535."}
