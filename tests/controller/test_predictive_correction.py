"""The predictive advisor corrects its capacity model on the fleet that made the SLI window's p99s, and counts
each window's requests once however often it reads them."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controller.capacity import Load
from controller.policy import LocalTarget, Policy, Scaling
from controller.predictive import PredictiveAdvisor
from controller.types import PolicyObservation, SliSnapshot

TICK_S = 15.0
WINDOW_S = 300.0
RATE, PROMPT, OUTPUT = 20.0, 1000.0, 200.0
LOAD = Load(request_rate_rps=RATE, prompt_tokens_per_s=RATE * PROMPT, output_tokens_per_s=RATE * OUTPUT)
POLICY = Policy(
    name="p", target=LocalTarget(), lead_time_s=60,
    scaling=Scaling(min_replicas=1, max_replicas=50, max_step=50, scale_down_cooldown_s=0),
)  # fmt: skip


def observe(t: float, ready: int, itl_p99_s: float) -> PolicyObservation:
    sli = SliSnapshot(observed_at_s=t, window_s=WINDOW_S, requests_in_window=RATE * WINDOW_S, itl_p99_s=itl_p99_s)
    return PolicyObservation(
        policy="p", observed_at_s=t, current_replicas=ready, ready_replicas=ready, queue_depth=0.0,
        running_requests=10.0, request_rate_rps=RATE, prompt_tokens_per_s=RATE * PROMPT,
        output_tokens_per_s=RATE * OUTPUT, kv_cache_usage=0.3, sli=sli,
    )  # fmt: skip


def itl_p99_of(advisor: PredictiveAdvisor, replicas: int) -> float:
    """The uncorrected model's ITL p99 for ``replicas`` under the test's load."""
    capacity = advisor.capacity(POLICY)
    assert capacity.itl_correction == 1.0
    return capacity.predict(LOAD, replicas).itl_p99_s


def test_a_p99_made_before_a_scale_up_corrects_against_the_fleet_that_made_it() -> None:
    """Four replicas serve exactly as the model predicts; the fleet doubles, and for a window the p99 is
    still the four replicas' (the window's requests were served by them): the model was right all along."""
    advisor = PredictiveAdvisor()
    four, eight = itl_p99_of(advisor, 4), itl_p99_of(advisor, 8)
    assert four > 1.2 * eight  # else the test could not tell the fleets apart
    for k in range(10):
        advisor.assess(POLICY, observe(k * TICK_S, 4, four), k * TICK_S)
    for k in range(10, 10 + round(WINDOW_S / TICK_S)):  # the window still holds the four replicas' stretch
        advisor.assess(POLICY, observe(k * TICK_S, 8, four), k * TICK_S)
    assert advisor.capacity(POLICY).itl_correction == pytest.approx(1.0)
    # Once the window holds only the eight replicas' requests, their p99 is the one corrected against.
    later = 10 + round(WINDOW_S / TICK_S) + 1
    advisor.assess(POLICY, observe(later * TICK_S, 8, 1.5 * eight), later * TICK_S)
    assert advisor.capacity(POLICY).itl_correction > 1.0


def test_one_window_of_ticks_moves_the_correction_all_but_a_third_of_the_way() -> None:
    """p99s 1.5x the prediction on a steady fleet: after ticks spanning one SLI window (the first read counts
    one tick) the correction is 1.5 - 0.5/e, whatever the tick: each read weighs the time it adds."""
    for tick_s in (TICK_S, 5.0):
        advisor = PredictiveAdvisor()
        slow = 1.5 * itl_p99_of(advisor, 6)
        ticks = round(WINDOW_S / tick_s)
        for k in range(ticks):
            advisor.assess(POLICY, observe(k * tick_s, 6, slow), k * tick_s)
        first_step_s = advisor.config.forecast.bin_s
        elapsed_s = first_step_s + (ticks - 1) * tick_s
        expected = 1.5 - 0.5 * math.exp(-elapsed_s / WINDOW_S)
        assert advisor.capacity(POLICY).itl_correction == pytest.approx(expected, rel=1e-9)
        if tick_s == TICK_S:
            assert expected == pytest.approx(1.5 - 0.5 / math.e)


def test_a_window_read_again_does_not_correct_again() -> None:
    """A source that has not refreshed its SLI hands the same window over several ticks: one read of it."""
    once, again = PredictiveAdvisor(), PredictiveAdvisor()
    slow = 1.8 * itl_p99_of(once, 6)
    itl_p99_of(again, 6)
    once.assess(POLICY, observe(0.0, 6, slow), 0.0)
    for k in range(5):
        again.assess(POLICY, observe(0.0, 6, slow), k * TICK_S)
    assert once.capacity(POLICY).itl_correction > 1.0
    assert again.capacity(POLICY).itl_correction == once.capacity(POLICY).itl_correction


def test_the_fleet_sizes_kept_span_one_window_even_without_corrections() -> None:
    """A policy whose windows never hold enough requests to correct on still forgets sizes older than its
    last SLI window: a day of ticks keeps about one window of them."""
    advisor = PredictiveAdvisor()
    for k in range(round(86400 / TICK_S)):
        t = k * TICK_S
        sli = SliSnapshot(observed_at_s=t, window_s=WINDOW_S, requests_in_window=5.0, itl_p99_s=0.01)
        advisor.assess(POLICY, replace(observe(t, 4 + k % 3, 0.01), sli=sli), t)
    kept = advisor._state[POLICY.name].ready_seen.seen
    assert len(kept) <= WINDOW_S / TICK_S + 2
    assert advisor.capacity(POLICY).itl_correction == 1.0  # five requests a window: never corrected on


def test_the_prefill_speed_correction_reads_each_window_once_too() -> None:
    """Finished requests prefilled at 0.8x the profile's speed, read every tick over one SLI window: the
    prefill speed correction moves all but a third of the way, as the latency corrections do (each reading
    is the window's prompt tokens over its prefill seconds, so a tick a twentieth of the window later adds a
    twentieth of news)."""
    advisor = PredictiveAdvisor()
    capacity = advisor.capacity(POLICY)
    steady = itl_p99_of(advisor, 6)  # the ITL the model predicts: the latency corrections stay at 1
    slow = 0.8 * capacity.profile.chunked_prefill_rate(10.0 / 6)  # 10 running on 6 replicas
    ticks = round(WINDOW_S / TICK_S)
    for k in range(ticks):
        advisor.assess(POLICY, replace(observe(k * TICK_S, 6, steady), prefill_tokens_per_s=slow), k * TICK_S)
    elapsed_s = advisor.config.forecast.bin_s + (ticks - 1) * TICK_S
    expected = 0.8 + 0.2 * math.exp(-elapsed_s / WINDOW_S)
    assert capacity.itl_correction == pytest.approx(1.0)
    assert capacity.prefill_speed_correction == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(0.8 + 0.2 / math.e)
