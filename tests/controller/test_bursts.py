"""Bursts beyond Poisson noise, and the replicas the busiest half-minute asks for."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from controller.builder import build_decision_core
from controller.bursts import PEAK_STEP_S, POISSON_Z, burst_load, peak_beyond_noise_rps
from controller.capacity import CapacityModel, Load
from controller.predictive import PredictiveAdvisor
from controller.types import PolicyObservation, Reason, SliSnapshot, TickInput
from tests.controller.test_core import observe
from tests.controller.test_entry_demand import routed_policy

LAST_MINUTE = Load(request_rate_rps=10.0, prompt_tokens_per_s=10_000.0, output_tokens_per_s=2_000.0)


def observation(peak_rps: float | None, window_mean_rps: float) -> PolicyObservation:
    sli = SliSnapshot(observed_at_s=0.0, window_s=300.0, requests_in_window=window_mean_rps * 300.0)
    return PolicyObservation(policy="p", observed_at_s=0.0, request_rate_peak_rps=peak_rps, sli=sli)


def test_the_poisson_allowance_is_z_standard_deviations_of_a_half_minute_count() -> None:
    # 10 rps over 30 s: a count of 300, standard deviation sqrt(300) = 17.3 requests.
    assert peak_beyond_noise_rps(20.0, 10.0) == pytest.approx(20.0 - POISSON_Z * math.sqrt(300.0) / 30.0)
    assert peak_beyond_noise_rps(5.0, 0.0) == 5.0


def test_a_burst_is_sized_at_the_last_minutes_lengths() -> None:
    burst = burst_load(observation(60.0, 12.0), LAST_MINUTE)
    assert burst is not None
    factor = peak_beyond_noise_rps(60.0, 12.0) / 10.0
    assert burst.request_rate_rps == pytest.approx(10.0 * factor)
    assert burst.mean_prompt_tokens == pytest.approx(LAST_MINUTE.mean_prompt_tokens)
    assert burst.mean_output_tokens == pytest.approx(LAST_MINUTE.mean_output_tokens)
    model = CapacityModel()
    assert model.replicas_needed(burst) > model.replicas_needed(LAST_MINUTE)


@pytest.mark.parametrize("rate_rps", [1.0, 10.0, 100.0])
def test_poisson_half_minutes_are_rarely_a_burst_and_never_much_of_one(rate_rps: float) -> None:
    # Ten half-minutes of Poisson arrivals, a thousand times: the last minute's rate and the window's
    # mean are read from the same counts as the peak, each with its own noise.
    rng = np.random.default_rng(0)
    counts = rng.poisson(rate_rps * PEAK_STEP_S, size=(1000, 10)).astype(float)
    excess = []
    for window in counts:
        minute = window[-2:].sum() / 60.0
        served = Load(request_rate_rps=minute, prompt_tokens_per_s=minute * 1000.0,
                      output_tokens_per_s=minute * 200.0)  # fmt: skip
        burst = burst_load(observation(float(window.max()) / PEAK_STEP_S, float(window.mean()) / PEAK_STEP_S), served)
        if burst is not None:
            excess.append(burst.request_rate_rps / (window.mean() / PEAK_STEP_S))
    assert len(excess) <= 0.03 * len(counts)
    # At most about one more Poisson allowance over the window's mean (7 % at 10 rps, 30 % at 1 rps).
    assert max(excess, default=1.0) <= 1.0 + POISSON_Z / math.sqrt(rate_rps * PEAK_STEP_S)


@pytest.mark.parametrize(
    ("peak", "served_rps", "with_sli"),
    [(None, 10.0, True), (60.0, 0.0, True), (60.0, 10.0, False), (11.0, 10.0, True), (math.inf, 10.0, True)],
)
def test_no_burst_without_a_peak_lengths_a_window_or_a_peak_above_noise(
    peak: float | None, served_rps: float, with_sli: bool
) -> None:
    obs = observation(peak, 10.0)
    if not with_sli:
        obs = PolicyObservation(policy="p", observed_at_s=0.0, request_rate_peak_rps=peak)
    served = Load(request_rate_rps=served_rps, prompt_tokens_per_s=served_rps * 1000.0,
                  output_tokens_per_s=served_rps * 200.0)  # fmt: skip
    assert burst_load(obs, served) is None


def test_the_production_core_scales_up_for_a_burst_with_its_reason() -> None:
    policy = routed_policy(1)
    steady = observe(1000.0, 2, request_rate_rps=10.0, prompt_tokens_per_s=10_000.0, output_tokens_per_s=2_000.0)
    assert steady.sli is not None
    window = replace(steady.sli, requests_in_window=12.0 * 300.0)
    bursty = replace(steady, sli=window, request_rate_peak_rps=60.0)
    advisor = PredictiveAdvisor()
    assessed = advisor.assess(policy, bursty, 1000.0)
    assert assessed is not None
    needs = {reason: need for need, reason in assessed.needs}
    burst = burst_load(bursty, LAST_MINUTE)
    assert burst is not None
    model = advisor.capacity(policy)  # with the online corrections this observation made
    assert needs[Reason.ARRIVAL_BURST] == model.replicas_needed(burst, headroom=1.0) > needs[Reason.CURRENT_LOAD]
    decision = build_decision_core().tick(
        TickInput(now_s=1000.0, policies={"chat": policy}, observations={"chat": bursty})
    ).for_policy("chat")
    assert decision.action == "scale_up" and Reason.ARRIVAL_BURST in decision.reasons
    assert decision.inputs["request_rate_peak_rps"] == 60.0
