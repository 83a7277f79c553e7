"""The request fleet's tick samples: what the engines' counters would have recorded in each tick."""

from __future__ import annotations

import numpy as np

from contracts.catalogue import ITL_BUCKETS_S, TTFT_BUCKETS_S
from contracts.traces import RequestTrace
from controller.capacity import DEFAULT_PROFILE, Targets
from controller.replay.fleet import RequestFleet
from controller.replay.signals import cumulative_counts
from controller.replay.world import ProfileCache, World


def test_a_prompt_is_counted_in_the_tick_of_its_first_token() -> None:
    # Three long prompts arrive together: each waits for the one before it, so its queue wait is not its TTFT.
    trace = RequestTrace("t", np.zeros(3), np.array([24_000, 24_000, 24_000]), np.array([2, 2, 2]))
    truth = ProfileCache(DEFAULT_PROFILE, World(startup_s=0.0), Targets())
    fleet = RequestFleet(trace, truth, initial_replicas=1, tick_s=1.0)
    fleet.advance(1e-6)
    first_token = trace.arrival_s + fleet.ttft_s  # TTFT runs from arrival
    counted = [fleet.sample(float(k + 1)).prompt_tokens for k in range(8)]
    expected = [24_000.0 * np.count_nonzero((first_token > k) & (first_token <= k + 1)) for k in range(8)]
    assert counted == expected
    assert sum(counted) == 72_000.0


def test_a_tick_sample_holds_the_latency_histograms_of_what_finished() -> None:
    trace = RequestTrace("t", np.array([0.0, 0.1, 0.2, 0.3]), np.array([100, 200, 300, 400]), np.array([1, 5, 9, 2]))
    truth = ProfileCache(DEFAULT_PROFILE, World(startup_s=0.0), Targets())
    fleet = RequestFleet(trace, truth, initial_replicas=1, tick_s=60.0)
    fleet.advance(60.0)
    tick = fleet.sample(60.0)
    assert tick.finished == 4
    assert tick.ttft_le == cumulative_counts(fleet.ttft_s, TTFT_BUCKETS_S)
    # Each request's token gaps (output less one) at its mean gap; a one-token answer has none.
    assert tick.itl_le == cumulative_counts(fleet.itl_s, ITL_BUCKETS_S, np.array([0.0, 4.0, 8.0, 1.0]))
    assert tick.itl_le[-1] == 13.0


def test_a_removed_replica_is_paid_for_until_it_has_served_what_it_held() -> None:
    """It finishes its requests after the scale-down, and those seconds were free: a policy that scaled down
    often drained for nothing."""
    trace = RequestTrace("t", np.array([0.0, 0.0]), np.array([100, 100]), np.array([2000, 2000]))
    truth = ProfileCache(DEFAULT_PROFILE, World(startup_s=0.0), Targets())
    fleet = RequestFleet(trace, truth, initial_replicas=2, tick_s=1.0)
    fleet.advance(1.0)
    assert fleet.billed(1.0) == 2
    fleet.scale_to(1, 1.0)  # one of the two decoding replicas leaves at once
    last = float(fleet.finish_s.min())  # the removed replica's request, settled at the scale-down
    assert last > 5.0  # 2,000 tokens at a few ms each
    assert [fleet.billed(float(t)) for t in (2, 3, int(last), int(last) + 2)] == [2, 2, 2, 1]
    assert fleet.provisioned == 1  # the spec the controller sees counts it out at once
