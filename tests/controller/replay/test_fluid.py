"""The fluid fleet's per-tick arithmetic: arrivals kept to the trace's end, a backlog worked off while idle."""

from __future__ import annotations

import numpy as np
import pytest

from controller.capacity import Targets
from controller.replay.fluid import FluidFleet, count_loads
from controller.replay.world import ProfileCache, World
from controller.replica_profile import DEFAULT_PROFILE


@pytest.mark.parametrize("tick_s", [15.0, 60.0, 70.0])
def test_count_loads_keeps_the_last_partial_ticks_arrivals(tick_s: float) -> None:
    counts = np.full(7, 100.0)  # seven 10 s bins: 70 s, not a whole number of most ticks
    rates, prompt, output = count_loads(counts, 10.0, tick_s, 200.0, 50.0)
    assert float(rates.sum() * tick_s) == pytest.approx(700.0)  # as request by request, which rounds up
    assert np.allclose(prompt, rates * 200.0) and np.allclose(output, rates * 50.0)


def test_a_prefill_backlog_is_worked_off_in_ticks_with_no_arrivals() -> None:
    truth = ProfileCache(DEFAULT_PROFILE, World(startup_s=0.0), Targets())
    tick_s, capacity = 15.0, DEFAULT_PROFILE.prefill_tokens_per_s
    prompt = np.array([3 * capacity] + [0.0] * 8 + [200.0])  # tick 0: three replicas' prefill for one
    rates = np.array([3 * capacity / 1000] + [0.0] * 8 + [1.0 / tick_s])
    fleet = FluidFleet(rates, prompt, rates * 100, truth, initial_replicas=1, tick_s=tick_s)
    backlog = []
    for k in range(len(rates)):
        fleet.advance((k + 1) * tick_s)
        backlog.append(fleet.sample((k + 1) * tick_s).waiting)
    assert backlog[0] > 0
    assert backlog[1] < backlog[0] and backlog[8] == 0.0  # served while nothing arrived, not left for tick 9
    assert fleet.good_ttft[9] > 0.9 * rates[9] * tick_s  # the late arrival does not pay the stale wait
