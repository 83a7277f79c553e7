"""A TTFT objective with a long-prompt allowance whose series the engines do not write: both SLI sources say
which series is missing and how to have it written, and the missing SLI never drives a scale-up."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qs

import httpx
import pytest
from prometheus_client import CollectorRegistry

from contracts.ttft_objective import EXPORTED_BY_DEFAULT, TtftAllowance
from controller.core import DecisionCore, PolicyState
from controller.policy import STORED, Policy
from controller.sources import PrometheusClient, PrometheusSource
from controller.sources.scrape import ScrapeSource
from controller.types import PolicyObservation
from engine.stats import FinishedRequestStats, StepStats
from exporters.prometheus import PrometheusStatsSink
from tests.controller.sources.engine_page import EngineMetrics, MetricsServer
from tests.controller.sources.test_prometheus import Prometheus, prometheus_scraping

MODEL = "long-context"


def _policy(reference: int, per_1k: float, name: str = "long") -> Policy:
    return Policy.model_validate({
        "name": name, "target": {"kind": "model", "model": MODEL},
        "objectives": {"ttft": {"threshold_s": 0.5, "target": 0.99, "reference_prompt_tokens": reference,
                                "per_1k_prompt_tokens_s": per_1k}},
    })  # fmt: skip


UNEXPORTED = _policy(2000, 0.1)
"""An allowance no engine here was told to write."""
EXPORTED = _policy(1000, 0.05, name="default")
"""The allowance every moeslo engine writes."""
UNEXPORTED_SERIES = 'moeslo_ttft_normalized_seconds{model_name="long-context",reference_prompt_tokens="2000",' \
    'per_1k_prompt_tokens_s="0.1"}'


class _MoesloPage:
    """A moeslo engine's /metrics page, written at the default allowance only."""

    def __init__(self, allowances: tuple[TtftAllowance, ...] = EXPORTED_BY_DEFAULT) -> None:
        self.sink = PrometheusStatsSink(CollectorRegistry(), model_name=MODEL, ttft_allowances=allowances)

    def record(self, count: int = 20) -> None:
        finished = tuple(
            FinishedRequestStats(request_id=str(i), finish_reason="stop", prompt_tokens=3000, generation_tokens=2,
                                 e2e_s=0.4, queue_s=0.0, prefill_s=0.3, decode_s=0.02, ttft_s=0.3, mean_itl_s=0.01)
            for i in range(count)
        )
        step = StepStats(now_s=1.0, step_duration_s=0.01, num_running=0, num_waiting=0, kv_cache_usage=0.0,
                         prompt_tokens=0, generation_tokens=0, finished=finished)
        self.sink.record(step)

    def render(self) -> bytes:
        return self.sink.render()


def _scrape(page: _MoesloPage | EngineMetrics, policies: list[Policy]) -> dict[str, PolicyObservation]:
    """What the scrape source says after a baseline scrape and some served requests."""
    server = MetricsServer(page)  # type: ignore[arg-type]

    async def scenario() -> dict[str, PolicyObservation]:
        source = ScrapeSource(lambda _policy: [server.url])
        try:
            await source.observe(policies, 0.0)
            if isinstance(page, EngineMetrics):
                page.requests([0.3] * 20, [0.01] * 20)
            else:
                page.record()
            return await source.observe(policies, 30.0)
        finally:
            await source.aclose()

    try:
        return asyncio.run(scenario())
    finally:
        server.stop()


def _assert_names_the_series_and_the_fix(obs: PolicyObservation) -> str:
    assert obs.sli is not None and obs.sli.ttft_good_ratio is None and obs.sli.requests_in_window is None
    problem = next((e for e in obs.errors if "moeslo_ttft_normalized_seconds" in e), None)
    assert problem is not None, obs.errors
    assert UNEXPORTED_SERIES in problem
    assert "moeslo serve --ttft-allowances 2000:0.1" in problem and "MOESLO_TTFT_ALLOWANCES=2000:0.1" in problem
    return problem


def test_scrape_names_the_allowance_series_a_moeslo_engine_does_not_write() -> None:
    observations = _scrape(_MoesloPage(), [UNEXPORTED, EXPORTED])
    problem = _assert_names_the_series_and_the_fix(observations["long"])
    assert "1000:0.05" in problem  # what the engine does write
    default = observations["default"]
    assert default.errors == () and default.sli is not None and default.sli.ttft_good_ratio == 1.0


def test_scrape_names_the_allowance_series_a_vllm_without_the_plugin_does_not_write() -> None:
    problem = _assert_names_the_series_and_the_fix(_scrape(EngineMetrics(MODEL), [UNEXPORTED])["long"])
    assert "MOESLO_VLLM_PLUGIN=1" in problem


def test_scrape_reports_nothing_missing_where_the_engine_writes_the_allowance() -> None:
    obs = _scrape(_MoesloPage((*EXPORTED_BY_DEFAULT, TtftAllowance(2000, 0.1))), [UNEXPORTED])["long"]
    assert obs.errors == () and obs.sli is not None and obs.sli.ttft_good_ratio == 1.0


def test_a_stored_allowance_finer_than_its_label_reads_the_series_its_label_names() -> None:
    """A policy stored before the six-digit rule reads the series labelled 0.123457; the check compared floats, so
    its engines, told ``2000:0.123457`` as the error itself said, were reported as not writing it, for good."""
    spec = _policy(2000, 0.1).model_dump(mode="json")
    spec["objectives"]["ttft"]["per_1k_prompt_tokens_s"] = 0.1234567
    stored = Policy.model_validate(spec, context={STORED: True})
    page = _MoesloPage((*EXPORTED_BY_DEFAULT, TtftAllowance(2000, 0.123457)))
    obs = _scrape(page, [stored])["long"]
    assert obs.errors == () and obs.sli is not None and obs.sli.ttft_good_ratio == 1.0


def test_a_missing_allowance_series_holds_a_scale_down_with_its_cause_and_never_scales_up() -> None:
    obs = _scrape(_MoesloPage(), [UNEXPORTED])["long"]
    core = DecisionCore()
    core.state["long"] = PolicyState(last_observed_replicas=4)
    # An idle fleet of 4: the ITL SLI and the load alone would scale it down.
    idle = replace(obs, current_replicas=4, ready_replicas=4, queue_depth=0.0, running_requests=1.0,
                   kv_cache_usage=0.05)  # fmt: skip
    decision = core.decide(UNEXPORTED, idle, 30.0)
    assert decision.action == "hold" and "partial_data" in decision.reasons
    assert UNEXPORTED_SERIES in decision.detail
    # A busy fleet: the queue may grow it, the missing TTFT SLI never does.
    busy = replace(obs, current_replicas=4, ready_replicas=4, queue_depth=0.0, running_requests=8.0,
                   kv_cache_usage=0.5)  # fmt: skip
    assert core.decide(UNEXPORTED, busy, 31.0).action == "hold"


@pytest.mark.integration
def test_prometheus_names_the_allowance_series_no_engine_writes(tmp_path: Path) -> None:
    async def observe(prom: Prometheus) -> dict[str, PolicyObservation]:
        source = PrometheusSource(PrometheusClient(prom.url))
        try:
            return await source.observe([UNEXPORTED, EXPORTED], 100.0)
        finally:
            await source.aclose()

    page = _MoesloPage()
    with prometheus_scraping(page, tmp_path) as prom:
        prom.wait_for_scrapes(2)  # a baseline at zero
        page.record()
        prom.wait_for_scrapes(2)
        observations = asyncio.run(observe(prom))
    assert "1000:0.05" in _assert_names_the_series_and_the_fix(observations["long"])
    default = observations["default"]
    assert default.errors == () and default.sli is not None and default.sli.ttft_good_ratio == 1.0


def _answering(vectors: dict[str, list[dict[str, object]]]) -> PrometheusSource:
    """A Prometheus stand-in: each query's answer is the vector of the first key the query contains."""

    def handle(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        result = next((vector for key, vector in vectors.items() if key in query), [])
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    return PrometheusSource(PrometheusClient("http://prom.invalid", client=httpx.AsyncClient(
        transport=httpx.MockTransport(handle))))  # fmt: skip


def test_prometheus_asks_which_allowances_are_written_only_for_a_policy_with_one() -> None:
    source = PrometheusSource(PrometheusClient("http://prom.invalid"))
    flat = Policy.model_validate({"name": "flat", "target": {"kind": "model", "model": MODEL}})
    assert "ttft_allowances" not in source.queries([flat])
    assert source.queries([UNEXPORTED])["ttft_allowances"] == (
        "group by (model_name, reference_prompt_tokens, per_1k_prompt_tokens_s) "
        f'(moeslo_ttft_normalized_seconds_count{{model_name="{MODEL}"}})'
    )
    asyncio.run(source.aclose())


def test_prometheus_claims_no_missing_series_for_a_model_without_engines() -> None:
    written = [{"metric": {"model_name": MODEL, "reference_prompt_tokens": "1000", "per_1k_prompt_tokens_s": "0.05"},
                "value": [0, "1"]}]  # fmt: skip
    engines = [{"metric": {"model_name": MODEL}, "value": [0, "2"]}]
    with_engines = _answering({"group by": written, "count by": engines})
    obs = asyncio.run(with_engines.observe([UNEXPORTED], 10.0))["long"]
    assert "1000:0.05" in _assert_names_the_series_and_the_fix(obs)
    asyncio.run(with_engines.aclose())
    # The series linger in Prometheus after the engines are gone: nothing is claimed about engines not there.
    without = _answering({"group by": written})
    assert asyncio.run(without.observe([UNEXPORTED], 10.0))["long"].errors == ()
    asyncio.run(without.aclose())


def test_prometheus_judges_whether_engines_served_by_the_sli_window_alone() -> None:
    """A lone engine just restarted has written no allowance series yet and served nothing since; a month's flat
    TTFT total still counts the requests before the restart, and read as "served" it claimed the series missing."""
    from controller.sources.prometheus import ALLOWANCES_KEY, _missing_allowance

    restarted = {ALLOWANCES_KEY: [], "engines": [({"model_name": MODEL}, 1.0)],
                 "ttft:total:5m": [({"model_name": MODEL}, 0.0)], "ttft:total:30d": [({"model_name": MODEL}, 5000.0)]}
    assert _missing_allowance(UNEXPORTED, restarted, "5m") is None
    serving = {**restarted, "ttft:total:5m": [({"model_name": MODEL}, 20.0)]}
    assert UNEXPORTED_SERIES in (_missing_allowance(UNEXPORTED, serving, "5m") or "")
