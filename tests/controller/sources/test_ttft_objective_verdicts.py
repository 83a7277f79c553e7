"""One TTFT objective at a reference prompt length, one verdict: the definition, the engine's histogram,
the PromQL SLI of a real Prometheus, the direct scrape, the generated alert rules and the replay agree
request by request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from contracts.traces import RequestTrace
from contracts.ttft_objective import TtftAllowance
from controller.capacity import DEFAULT_PROFILE, Targets
from controller.policy import Policy
from controller.replay.fleet import RequestFleet
from controller.replay.world import ProfileCache, World
from controller.sources import PrometheusClient, PrometheusSource
from controller.sources.scrape import ScrapeSource
from controller.types import PolicyObservation
from engine.stats import FinishedRequestStats, StepStats
from exporters.prometheus import PrometheusStatsSink
from generators.alerts.rules import build_rule_groups
from tests.controller.sources.engine_page import MetricsServer
from tests.controller.sources.test_prometheus import Prometheus, prometheus_scraping

MODEL = "long-context"
ALLOWANCE = TtftAllowance(1000, 0.05)
THRESHOLD_S = 0.5
POLICY = Policy.model_validate({
    "name": "long", "target": {"kind": "model", "model": MODEL},
    "objectives": {"ttft": {"threshold_s": THRESHOLD_S, "target": 0.99, "reference_prompt_tokens": 1000,
                            "per_1k_prompt_tokens_s": 0.05}},
})  # fmt: skip
# (prompt tokens, TTFT): 50 ms either side of the objective at 800, 5,000, 20,000 and 40,000 tokens.
REQUESTS = [(800, 0.45), (800, 0.55), (5000, 0.65), (5000, 0.75), (20000, 1.4), (20000, 1.5), (40000, 2.4),
            (40000, 2.5), (3000, 0.58), (12000, 0.5)]  # fmt: skip
EXPECTED = [ALLOWANCE.is_good(ttft, prompt, THRESHOLD_S) for prompt, ttft in REQUESTS]


class _Page:
    """The engine exporter's /metrics page."""

    def __init__(self) -> None:
        self.sink = PrometheusStatsSink(CollectorRegistry(), model_name=MODEL, ttft_allowances=(ALLOWANCE,))

    def record(self) -> None:
        finished = tuple(
            FinishedRequestStats(request_id=str(i), finish_reason="stop", prompt_tokens=prompt, generation_tokens=2,
                                 e2e_s=ttft + 0.02, queue_s=0.0, prefill_s=ttft, decode_s=0.02, ttft_s=ttft,
                                 mean_itl_s=0.01)
            for i, (prompt, ttft) in enumerate(REQUESTS)
        )
        step = StepStats(now_s=1.0, step_duration_s=0.01, num_running=0, num_waiting=0, kv_cache_usage=0.0,
                         prompt_tokens=0, generation_tokens=0, finished=finished)
        self.sink.record(step)

    def render(self) -> bytes:
        return self.sink.render()


def test_the_definition_differs_from_the_flat_objective() -> None:
    assert EXPECTED == [True, False, True, False, True, False, True, False, True, True]
    flat = [ttft <= THRESHOLD_S for _, ttft in REQUESTS]
    assert flat != EXPECTED  # so agreement below cannot come from reading the plain TTFT


def test_engine_histogram_counts_the_same_good_requests() -> None:
    page = _Page()
    page.record()
    labels = {"model_name": MODEL, "engine": "0", **ALLOWANCE.labels()}
    registry = page.sink.registry
    good = registry.get_sample_value("moeslo_ttft_normalized_seconds_bucket", {**labels, "le": "0.5"})
    assert good == sum(EXPECTED)
    assert registry.get_sample_value("moeslo_ttft_normalized_seconds_count", labels) == len(REQUESTS)


def test_replay_gives_the_same_verdicts() -> None:
    prompts = np.array([p for p, _ in REQUESTS], dtype=np.int64)
    trace = RequestTrace("verdicts", np.zeros(len(REQUESTS)), prompts, np.full(len(REQUESTS), 2, dtype=np.int64))
    fleet = RequestFleet(trace, ProfileCache(DEFAULT_PROFILE, World(), Targets()), initial_replicas=1, tick_s=15.0,
                         ttft_target_s=THRESHOLD_S, ttft_allowance=ALLOWANCE)  # fmt: skip
    fleet.ttft_s = np.array([ttft for _, ttft in REQUESTS])
    fleet.itl_s = np.zeros(len(REQUESTS))
    assert (fleet.normalized_ttft_s() <= THRESHOLD_S).tolist() == EXPECTED
    assert fleet.outcomes(1).good_ttft.tolist() == [sum(EXPECTED)]


def test_direct_scrape_gives_the_same_good_ratio() -> None:
    page = _Page()
    server = MetricsServer(page)  # type: ignore[arg-type]

    async def scenario() -> None:
        source = ScrapeSource(lambda _policy: [server.url])
        await source.observe([POLICY], 0.0)  # the baseline, before any request
        page.record()
        obs = (await source.observe([POLICY], 10.0))["long"]
        await source.aclose()
        assert obs.sli is not None
        assert obs.sli.ttft_good_ratio == pytest.approx(sum(EXPECTED) / len(REQUESTS))
        assert obs.sli.prompt_tokens_buckets[-1] == (float("inf"), float(len(REQUESTS)))

    try:
        asyncio.run(scenario())
    finally:
        server.stop()


@pytest.fixture()
def prometheus_and_page(tmp_path: Path) -> Iterator[tuple[Prometheus, _Page]]:
    page = _Page()
    with prometheus_scraping(page, tmp_path) as prom:
        yield prom, page


@pytest.mark.integration
def test_promql_sli_and_alert_rules_give_the_same_good_ratio(prometheus_and_page: tuple[Prometheus, _Page]) -> None:
    prom, page = prometheus_and_page
    prom.wait_for_scrapes(2)  # a baseline at zero
    page.record()
    prom.wait_for_scrapes(2)
    expected = sum(EXPECTED) / len(REQUESTS)

    async def observe() -> PolicyObservation:
        source = PrometheusSource(PrometheusClient(prom.url))
        try:
            return (await source.observe([POLICY], 100.0))["long"]
        finally:
            await source.aclose()

    obs = asyncio.run(observe())
    assert obs.errors == ()
    assert obs.sli is not None and obs.sli.ttft_good_ratio == pytest.approx(expected, abs=1e-9)
    # The generated recording rules' good and total expressions, evaluated by the same Prometheus.
    rules = {r.record: r.expr for g in build_rule_groups([POLICY]) for r in g.rules
             if getattr(r, "record", None) and r.labels.get("slo") == "ttft"}  # type: ignore[union-attr]  # fmt: skip
    good_expr = rules["moeslo:slo_good_events:rate5m"]
    total_expr = rules["moeslo:slo_total_events:rate5m"]
    assert "moeslo_ttft_normalized_seconds_bucket" in good_expr and 'per_1k_prompt_tokens_s="0.05"' in good_expr
    answer = httpx.post(f"{prom.url}/api/v1/query", data={"query": f"({good_expr}) / ({total_expr})"}, timeout=5)
    result = answer.json()["data"]["result"]
    assert result and float(result[0]["value"][1]) == pytest.approx(expected, abs=1e-9)
