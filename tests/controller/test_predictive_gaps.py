"""Ticks the predictive advisor never sees (the metrics source was down) still pass on its clock: the bins they
missed take the last value, so the season keeps its phase and each forecast is scored against its own bin."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controller.forecast import ForecastConfig
from controller.policy import LocalTarget, Policy, Scaling
from controller.predictive import PredictiveAdvisor, PredictiveConfig
from controller.types import LoadHistory, PolicyObservation

TICK_S, SEASON_S = 15.0, 3600.0
SEASON_BINS = round(SEASON_S / TICK_S)
POLICY = Policy(
    name="p", target=LocalTarget(), lead_time_s=60,
    scaling=Scaling(min_replicas=1, max_replicas=50, max_step=50, scale_down_cooldown_s=0),
)  # fmt: skip


def rate(t: float) -> float:
    return 10.0 + 8.0 * math.sin(2 * math.pi * t / SEASON_S)


def observe(t: float) -> PolicyObservation:
    r = rate(t)
    return PolicyObservation(
        policy="p", observed_at_s=t, current_replicas=4, ready_replicas=4, queue_depth=0.0, running_requests=1.0,
        request_rate_rps=r, prompt_tokens_per_s=r * 100, output_tokens_per_s=r * 50, kv_cache_usage=0.1,
    )  # fmt: skip


def advisor() -> PredictiveAdvisor:
    forecast = ForecastConfig(bin_s=TICK_S, season_s=SEASON_S, keep_s=6 * SEASON_S, refit_every_bins=SEASON_BINS)
    return PredictiveAdvisor(PredictiveConfig(forecast=forecast, refits_per_tick=5))


def test_a_gap_keeps_the_seasons_phase_and_the_audit_scores_by_the_clock() -> None:
    """A seasonal load the seasonal models forecast exactly; the source is down for 15 minutes (60 ticks) in the
    third season.  The history still holds one bin per tick of the clock, and the forecasts made after the gap
    are scored against their own bins' actuals (made before it, they are dropped): the audit's WAPE stays near 0.
    Counting observations instead shifted the season by 15 minutes for good, and scored the forecasts made
    before the gap against the load 15 minutes later."""
    adv = advisor()
    gap = range(2 * SEASON_BINS + 60, 2 * SEASON_BINS + 120)
    wapes = []
    end = 2 * SEASON_BINS + 200
    for k in range(end):
        if k in gap:
            continue
        advice = adv.advise(POLICY, observe(k * TICK_S), k * TICK_S)
        if k > gap.stop + 60:
            assert advice.forecast is not None and advice.forecast.wape is not None
            wapes.append(advice.forecast.wape)
    assert adv.history_bins("p") == end
    assert max(wapes) < 0.02  # counting observations: 0.075


def test_ticks_late_by_whole_bins_fill_them_and_jitter_fills_none() -> None:
    adv = advisor()
    for k in range(20):
        adv.assess(POLICY, observe(k * TICK_S + (k % 3) * 3.0), k * TICK_S)  # up to 6 s late: no bin missed
    assert adv.history_bins("p") == 20
    adv.assess(POLICY, observe(25 * TICK_S + 2.0), 25 * TICK_S + 2.0)  # five ticks later: four bins missed
    assert adv.history_bins("p") == 26


def test_ticks_further_or_closer_than_a_bin_keep_the_history_on_the_clock() -> None:
    """Ticks 20 s apart at 15 s bins (a slow source) held 180 bins for an hour's 240, so a daily season lost
    six hours a day; ticks 10 s apart counted 60 bins for 40."""
    slow = advisor()
    for k in range(180):
        slow.assess(POLICY, observe(k * 20.0), k * 20.0)
    assert slow.history_bins("p") == round(179 * 20.0 / TICK_S) + 1
    fast = advisor()
    for k in range(60):
        fast.assess(POLICY, observe(k * 10.0), k * 10.0)
    assert fast.history_bins("p") == round(59 * 10.0 / TICK_S) + 1


def test_a_gap_longer_than_a_season_restarts_the_forecaster_rather_than_making_up_a_day() -> None:
    adv = advisor()
    for k in range(100):
        adv.advise(POLICY, observe(k * TICK_S), k * TICK_S)
    later = 100 + SEASON_BINS + 1
    advice = adv.advise(POLICY, observe(later * TICK_S), later * TICK_S)
    assert adv.history_bins("p") == 1
    assert "warming_up" in advice.reasons


def test_a_warm_start_after_the_first_live_tick_leaves_the_live_history_alone() -> None:
    """A warm start that timed out on the policy's first tick and landed on a later one: its history would go
    after the live bins, and the bins counter jumped ahead of the clock, so every live observation was dropped
    for as many bins as it held while the audit scored none and the stale forecast sized the fleet."""
    adv = advisor()
    flat = [100.0] * (2 * SEASON_BINS)
    live = 10.0
    adv.assess(POLICY, flat_observation(0.0, live), 0.0)
    adv.warm_start(POLICY, LoadHistory(flat, [r * 100 for r in flat], [r * 50 for r in flat]))
    for k in range(1, 121):
        assessment = adv.assess(POLICY, flat_observation(k * TICK_S, live), k * TICK_S)
    assert assessment is not None and assessment.forecast is not None
    assert assessment.forecast.request_rate_rps == pytest.approx(live, rel=0.1)
    assert adv.history_bins("p") == 121


def flat_observation(t: float, r: float) -> PolicyObservation:
    return replace(observe(t), request_rate_rps=r, prompt_tokens_per_s=r * 100, output_tokens_per_s=r * 50)
