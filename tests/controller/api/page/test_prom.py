"""The policy page's series from Prometheus: good ratios from its bucket series, its windows and steps."""

from __future__ import annotations

import asyncio
import re

import pytest

from controller.api.page.prom import (
    ChartWindows,
    Matrix,
    PromSeries,
    _good_ratio,
    chart_series,
    prometheus_series,
    range_step_s,
)
from controller.policy import Policy


def test_bucket_edges_spelt_two_ways_are_summed_into_one() -> None:
    """Two exporters behind one model: vLLM writes le="1.0", another le="1"; both are the 1 s edge."""
    good = [({"le": "1"}, [(0.0, 30.0)]), ({"le": "1.0"}, [(0.0, 60.0)]), ({"le": "+Inf"}, [(0.0, 100.0)])]
    total: Matrix = [({}, [(0.0, 100.0)])]
    assert _good_ratio(good, total, 1.0) == [(0.0, 0.9)]


class _Recording:
    """A Prometheus whose series begin at ``since_s`` (a fleet that started then); records each range query."""

    def __init__(self, since_s: float) -> None:
        self.since_s = since_s
        self.asked: list[tuple[str, float, float]] = []

    async def query_range(self, promql: str, *, start_s: float, end_s: float, step_s: float) -> Matrix:
        self.asked.append((promql, start_s, step_s))
        times = [start_s + i * step_s for i in range(int((end_s - start_s) // step_s) + 1)]
        points = [(t, 1.0) for t in times if t >= self.since_s]
        return [({"le": "+Inf"} if "_bucket" in promql else {}, points)] if points else []


def _series(client: _Recording, **windows: float) -> PromSeries:
    policy = Policy.model_validate({"name": "p", "target": {"kind": "model", "model": "m"}})
    settings = {"rate_window_s": 10.0, "sli_window_s": 30.0, "tick_interval_s": 2.0} | windows
    return asyncio.run(chart_series(client, policy, selector="", start_s=0.0, end_s=6 * 3600.0,  # type: ignore[arg-type]
                                    windows=ChartWindows(**settings)))


def test_the_charts_read_the_controllers_windows() -> None:
    """The charts asked for 5-minute good ratios and 1-minute rates while the controller (``moeslo up``) acted on
    30 s SLIs and forecast 10 s rates: the "actual" drawn against the forecast was not what it learnt."""
    client = _Recording(since_s=6 * 3600.0 - 170.0)  # ``moeslo up``'s few minutes: asked again at 2 s steps
    series = _series(client)
    queries = [q for q, _, step in client.asked if "layer" not in q and step == 2.0]
    assert all("[30s]" in q for q in queries if "seconds" in q) and all("[5m]" not in q for q in queries)
    load = 'sum(rate(vllm:request_success_total{model_name="m"}[10s]))'
    assert [q for q in queries if "request_success" in q] == [load]
    assert series.step_s == 2.0 and series.queries["load"].endswith("[10s]))")
    assert (series.windows.sli_window, series.windows.rate_window) == ("30s", "10s")


def test_a_series_that_began_late_in_the_range_is_asked_again_at_a_finer_step() -> None:
    """Six hours at 90 s steps gave a three-minute run two points; the smallest step follows the tick."""
    end_s = 6 * 3600.0
    client = _Recording(since_s=end_s - 170.0)
    series = _series(client)
    assert series.step_s == 2.0 and len(series.load) >= 80
    # Asked again from a coarse step before its first point.
    assert {start for _, start, step in client.asked if step == 2.0} == {end_s - 180.0}
    assert _series(_Recording(since_s=end_s - 170.0), tick_interval_s=15.0).step_s == 15.0
    assert range_step_s(3600.0, 15.0) == 15.0 and range_step_s(600.0, 2.0) == 4.0


class _Unserved:
    """6 TTFTs under the threshold and 300 requests ended by their deadline before a first token, in 5 minutes."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def query_range(self, promql: str, *, start_s: float, end_s: float, step_s: float) -> Matrix:
        self.asked.append(promql)
        if "_bucket" in promql:
            return [({"le": "0.5"}, [(end_s, 6.0)]), ({"le": "+Inf"}, [(end_s, 6.0)])]
        if "_count" in promql:  # the total's value as Prometheus would evaluate the query asked
            return [({}, [(end_s, 306.0 if "without_first_token" in promql else 6.0)])]
        return []


def test_the_ttft_good_ratio_counts_the_requests_ended_before_a_first_token() -> None:
    """The chart drew 100 % while the controller and the alert rules saw 6 good of 306 events."""
    policy = Policy.model_validate({"name": "p", "target": {"kind": "model", "model": "m"}})
    client = _Unserved()
    series = asyncio.run(prometheus_series(client, policy, selector='job="x"', start_s=0.0,  # type: ignore[arg-type]
                                           end_s=300.0, step_s=300.0, windows=ChartWindows(60.0, 300.0, 15.0)))
    assert series.ttft_good == [(300.0, 6 / 306)]
    unserved = 'moeslo_requests_without_first_token_total{model_name="m",job="x",finished_reason=~"deadline|error"}'
    assert unserved in series.queries["ttft:total"] and unserved not in series.queries["itl:total"]


class _Outage:
    """10 TTFTs a second, every one slow from ``start_s`` to ``end_s``; increases evaluated over the query's window."""

    def __init__(self, start_s: float, end_s: float) -> None:
        self.outage = (start_s, end_s)
        self.asked: list[str] = []

    async def query_range(self, promql: str, *, start_s: float, end_s: float, step_s: float) -> Matrix:
        self.asked.append(promql)
        if "time_to_first_token" not in promql:
            return []
        number, unit = re.findall(r"\[(\d+)([smhd])\]", promql)[-1]
        window = int(number) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
        times = [start_s + i * step_s for i in range(int((end_s - start_s) // step_s) + 1)]
        if "_count" in promql:
            return [({}, [(t, 10.0 * window) for t in times])]
        slow = [max(0.0, min(t, self.outage[1]) - max(t - window, self.outage[0])) for t in times]
        return [({"le": "0.5"}, [(t, 10.0 * (window - s)) for t, s in zip(times, slow, strict=True)]),
                ({"le": "+Inf"}, [(t, 10.0 * window) for t in times])]


def test_a_step_longer_than_a_window_widens_the_window_to_the_step() -> None:
    """At 3 d (18-minute steps) each point was a 5-minute increase: 13 minutes of every 18 went unseen, and a
    13-minute outage between two points was drawn as 100 %."""
    policy = Policy.model_validate({"name": "p", "target": {"kind": "model", "model": "m"}})
    end_s = 1_000_000_000.0
    start_s = end_s - 3 * 86400.0
    sample_s = start_s + 200 * 1080.0
    client = _Outage(sample_s + 1.0, sample_s + 780.0)
    series = asyncio.run(chart_series(client, policy, selector="", start_s=start_s, end_s=end_s,  # type: ignore[arg-type]
                                      windows=ChartWindows(rate_window_s=60.0, sli_window_s=300.0,
                                                           tick_interval_s=15.0)))
    assert series.step_s == 1080.0
    assert (series.windows.sli_window, series.windows.rate_window) == ("18m", "18m")
    assert min(v for _, v in series.ttft_good if v is not None) == pytest.approx(1 - 779 / 1080)
    assert series.queries["load"].endswith("[18m]))") and "[5m]" not in series.queries["ttft:good"]
