"""The request fleet's tick samples: what the engines' counters would have recorded in each tick."""

from __future__ import annotations

import numpy as np

from contracts.traces import RequestTrace
from controller.capacity import DEFAULT_PROFILE, Targets
from controller.replay.fleet import RequestFleet
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
