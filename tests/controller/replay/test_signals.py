"""What the controllers can see: scraped late, rates over windows, served (not offered) load."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.catalogue import ITL_BUCKETS_S, TTFT_BUCKETS_S
from contracts.histograms import histogram_quantile
from controller.capacity import DEFAULT_PROFILE, Targets
from controller.replay.fluid import FluidFleet
from controller.replay.signals import MetricsPipeline, TickSample, cumulative_counts
from controller.replay.world import ProfileCache, World
from controller.sources.base import good_count_at

TTFT_LE = cumulative_counts(np.full(15, 0.2), TTFT_BUCKETS_S)
"""15 requests a tick, each 0.2 s to its first token."""
ITL_LE = cumulative_counts(np.r_[np.full(14, 0.01), 0.03], ITL_BUCKETS_S, np.full(15, 199.0))
"""Their 199 token gaps each: 14 at 10 ms, one at 30 ms."""


def sample(**values: object) -> TickSample:
    base = dict(
        ready=2, waiting=0.0, running=10.0, kv_usage_sum=0.6, finished=15.0, prompt_tokens=15_000.0,
        output_tokens=3_000.0, ttft_sum_s=3.0, itl_sum_s=0.15, duration_sum_s=30.0, ttft_le=TTFT_LE, itl_le=ITL_LE,
    )  # fmt: skip
    base.update(values)
    return TickSample(**base)  # type: ignore[arg-type]


def test_the_prefill_speed_is_over_the_requests_finished_in_the_sli_window() -> None:
    pipeline = MetricsPipeline(tick_s=15.0, ticks=40, scrape_s=15.0)
    for k in range(40):
        # The first 20 ticks prefill at 10,000 tokens/s, the rest at 20,000: only the last 5 minutes count.
        seconds = 1.0 if k < 20 else 0.5
        pipeline.record(k, sample(finished_prompt_tokens=10_000.0, prefill_s_sum=seconds))
    assert pipeline.observation(39, 600.0, current_replicas=2).prefill_tokens_per_s == pytest.approx(20_000)
    assert pipeline.observation(29, 450.0, current_replicas=2).prefill_tokens_per_s == pytest.approx(200_000 / 15)
    empty = MetricsPipeline(tick_s=15.0, ticks=2, scrape_s=15.0)
    empty.record(0, sample())
    assert empty.observation(0, 15.0, current_replicas=2).prefill_tokens_per_s is None


def test_a_query_sees_the_newest_scrape() -> None:
    pipeline = MetricsPipeline(tick_s=15.0, ticks=6, scrape_s=30.0)
    seen = []
    for k in range(6):
        pipeline.record(k, sample(waiting=float(k)))
        seen.append(pipeline.gauge(k, "waiting"))
    # Scrapes at 30, 60, 90 s: the ends of ticks 1, 3, 5.
    assert seen == [None, 1.0, 1.0, 3.0, 3.0, 5.0]
    assert pipeline.gauge(4, "waiting", scrape_s=15.0) == 4.0


def test_rates_and_the_observation_of_the_production_source() -> None:
    pipeline = MetricsPipeline(tick_s=15.0, ticks=8, scrape_s=30.0)
    for k in range(8):
        pipeline.record(k, sample())
    obs = pipeline.observation(7, 120.0, current_replicas=3)
    assert obs.request_rate_rps == pytest.approx(1.0)  # 15 per 15 s, over rate(...[1m])
    assert obs.prompt_tokens_per_s == pytest.approx(1000.0)
    assert obs.kv_cache_usage == pytest.approx(0.3)  # mean over the 2 replicas with series
    assert obs.current_replicas == 3 and obs.ready_replicas == 2
    assert obs.sli is not None
    assert obs.sli.requests_in_window == pytest.approx(120.0)  # 8 ticks so far, under the 5-minute window
    assert obs.sli.itl_good_ratio == pytest.approx(14 / 15)
    assert obs.sli.itl_events_in_window == pytest.approx(8 * 15 * 199)  # token gaps, as the live source counts
    window = pipeline.frontend_window(7, 60.0)
    assert window.requests == pytest.approx(60.0) and window.ttft_mean_s == pytest.approx(0.2)
    assert window.prompt_mean_tokens == pytest.approx(1000.0)


def test_an_overloaded_fleet_reports_what_it_serves() -> None:
    ticks = 20
    rates = np.full(ticks, 100.0)
    truth = ProfileCache(DEFAULT_PROFILE, World(), Targets())
    fleet = FluidFleet(rates, rates * 1000.0, rates * 200.0, truth, initial_replicas=1, tick_s=15.0)
    pipeline = MetricsPipeline(tick_s=15.0, ticks=ticks, scrape_s=15.0)
    for k in range(ticks):
        fleet.advance((k + 1) * 15.0)
        pipeline.record(k, fleet.sample((k + 1) * 15.0))
    obs = pipeline.observation(ticks - 1, ticks * 15.0, current_replicas=1)
    assert obs.request_rate_rps is not None and obs.request_rate_rps < 30.0  # 100 offered
    assert obs.queue_depth is not None and obs.queue_depth > 1000.0
    assert obs.kv_cache_usage is not None and obs.kv_cache_usage <= 1.0


def test_the_peak_rate_is_the_busiest_half_minute_between_scrapes_of_the_sli_window() -> None:
    pipeline = MetricsPipeline(tick_s=15.0, ticks=40, scrape_s=30.0)
    finished = [0.0] * 40
    finished[5] = 600.0  # 600 requests in tick 5 (75-90 s): scraped between 60 s and 90 s
    for k in range(40):
        pipeline.record(k, sample(finished=finished[k]))
    assert pipeline.peak_rate(0, "finished", 300.0) is None  # one scrape is no rate
    assert pipeline.peak_rate(7, "finished", 300.0) == pytest.approx(600.0 / 30.0)
    obs = pipeline.observation(7, 120.0, current_replicas=1)
    assert obs.request_rate_peak_rps == pytest.approx(20.0) and obs.request_rate_rps == pytest.approx(10.0)
    # Five minutes on, the burst has left the SLI window.
    assert pipeline.peak_rate(27, "finished", 300.0) == 0.0


@pytest.mark.parametrize(("tick_s", "scrape_s"), [(15.0, 30.0), (60.0, 30.0), (15.0, 5.0), (15.0, 10.0), (10.0, 15.0),
                                                  (5.0, 15.0)])  # fmt: skip
def test_a_steady_rate_peaks_at_itself_whatever_the_tick_and_scrape(tick_s: float, scrape_s: float) -> None:
    ticks = 60
    pipeline = MetricsPipeline(tick_s=tick_s, ticks=ticks, scrape_s=scrape_s)
    for k in range(ticks):
        pipeline.record(k, sample(finished=10.0 * tick_s))
    assert pipeline.peak_rate(ticks - 1, "finished", 300.0) == pytest.approx(10.0)


def test_the_slis_are_read_from_bucket_counts_as_the_prometheus_source_reads_them() -> None:
    # Every request 0.32 s to its first token: its exact p99 is 0.32 s, histogram_quantile's lies inside (0.3, 0.35].
    ttft_le = cumulative_counts(np.full(100, 0.32), TTFT_BUCKETS_S)
    itl_le = cumulative_counts(np.r_[np.full(90, 0.02), np.full(10, 0.04)], ITL_BUCKETS_S, np.full(100, 9.0))
    pipeline = MetricsPipeline(tick_s=15.0, ticks=4, scrape_s=15.0, ttft_threshold_s=0.33, itl_threshold_s=0.03)
    for k in range(4):
        pipeline.record(k, sample(finished=100.0, ttft_le=ttft_le, itl_le=itl_le))
    sli = pipeline.observation(3, 60.0, current_replicas=2).sli
    assert sli is not None
    window_ttft = {edge: 4 * count for edge, count in zip((*TTFT_BUCKETS_S, np.inf), ttft_le, strict=True)}
    window_itl = {edge: 4 * count for edge, count in zip((*ITL_BUCKETS_S, np.inf), itl_le, strict=True)}
    assert sli.ttft_p99_s == pytest.approx(histogram_quantile(0.99, window_ttft))
    assert sli.ttft_p99_s == pytest.approx(0.3 + 0.05 * 0.99)
    assert sli.itl_p99_s == pytest.approx(histogram_quantile(0.99, window_itl))
    # Neither threshold is an edge: the good counts are interpolated inside the bucket that holds it.
    good_ttft = good_count_at(window_ttft, 0.33)
    good_itl = good_count_at(window_itl, 0.03)
    assert good_ttft is not None and good_itl is not None
    assert sli.ttft_good_ratio == pytest.approx(good_ttft / 400) and sli.ttft_good_ratio == pytest.approx(0.6)
    assert sli.itl_good_ratio == pytest.approx(good_itl / 3600) and sli.itl_good_ratio == pytest.approx(0.92)
    assert sli.requests_in_window == 400.0 and sli.itl_events_in_window == 3600.0
    assert sli.ttft_good_ratio_by_window["5m"] == sli.ttft_good_ratio


def test_counts_at_and_under_each_edge_weighted() -> None:
    counts = cumulative_counts(np.array([0.5, 0.01, 0.3, 5.0]), (0.01, 0.5, 1.0), np.array([1.0, 2.0, 3.0, 4.0]))
    assert counts == (2.0, 6.0, 6.0, 10.0)  # at or under each edge (Prometheus's le), then +Inf
    assert cumulative_counts(np.zeros(0), (0.01, 0.5)) == (0.0, 0.0, 0.0)
