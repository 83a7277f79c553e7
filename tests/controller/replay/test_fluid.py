"""The fluid fleet's per-tick arithmetic: a trace's arrivals are kept to its end, a backlog drains without them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from controller.capacity import DEFAULT_PROFILE, Targets
from controller.replay.fluid import FluidFleet, count_loads
from controller.replay.signals import TickSample
from controller.replay.world import ProfileCache, World


@pytest.mark.parametrize("tick_s", [15.0, 60.0, 70.0])
def test_count_loads_keeps_the_last_partial_ticks_arrivals(tick_s: float) -> None:
    counts = np.full(7, 100.0)  # seven 10 s bins: 70 s, not a whole number of most ticks
    rates, prompt, output = count_loads(counts, 10.0, tick_s, 200.0, 50.0)
    assert float(rates.sum() * tick_s) == pytest.approx(700.0)  # as request by request, which rounds up
    assert np.allclose(prompt, rates * 200.0) and np.allclose(output, rates * 50.0)


def _overload_then_idle(idle_ticks: int) -> list[TickSample]:
    """One tick at 20× what one replica prefills, then ``idle_ticks`` without arrivals, then a tick of 15 arrivals."""
    rates = np.r_[200.0, np.zeros(idle_ticks), 1.0]
    truth = ProfileCache(DEFAULT_PROFILE, World(), Targets())
    fleet = FluidFleet(rates, rates * 1000.0, rates * 100.0, truth, initial_replicas=1, tick_s=15.0)
    samples = []
    for k in range(len(rates)):
        fleet.advance((k + 1) * 15.0)
        samples.append(fleet.sample((k + 1) * 15.0))
    return samples


def test_a_backlog_drains_in_ticks_without_arrivals_and_every_request_finishes_once() -> None:
    samples = _overload_then_idle(idle_ticks=60)
    first, idle = samples[0], samples[1:-1]
    assert first.waiting > 100.0  # most of the 3,000 requests wait past the first tick
    assert all(later.waiting < earlier.waiting for earlier, later in itertools.pairwise(idle) if earlier.waiting > 0)
    assert idle[-1].waiting == 0.0 and samples[-1].waiting < 1.0
    assert sum(s.finished for s in samples) == pytest.approx(3015.0)
    assert sum(s.prompt_tokens for s in samples) == pytest.approx(3015.0 * 1000.0)
    for s in samples:  # each finished request's TTFT is one observation; its token gaps, output - 1 each
        assert (s.ttft_le[-1] if s.ttft_le else 0.0) == pytest.approx(s.finished)
        assert (s.itl_le[-1] if s.itl_le else 0.0) == pytest.approx(s.finished * 99.0)


def test_an_arrival_after_a_drained_backlog_does_not_pay_its_wait() -> None:
    short_gap, long_gap = _overload_then_idle(idle_ticks=2), _overload_then_idle(idle_ticks=60)
    assert long_gap[-1].ttft_sum_s < short_gap[-1].ttft_sum_s / 10
