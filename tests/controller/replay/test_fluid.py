"""The fluid fleet's per-tick arithmetic: a trace's arrivals are kept to its end, a backlog drains without them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from contracts.catalogue import TTFT_BUCKETS_S
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


def test_requests_that_waited_for_a_first_replica_finish_with_their_wait_as_ttft() -> None:
    """A cold start: they finished in a tick without arrivals with no TTFT observation at all (or an earlier
    tick's tails), which read as a fast fleet while the requests had waited a minute."""
    rates = np.r_[20.0, np.zeros(8)]
    truth = ProfileCache(DEFAULT_PROFILE, World(startup_s=60.0), Targets())
    fleet = FluidFleet(rates, rates * 1000.0, rates * 100.0, truth, initial_replicas=0, tick_s=15.0)
    fleet.scale_to(1, 0.0)
    samples = []
    for k in range(len(rates)):
        fleet.advance((k + 1) * 15.0)
        samples.append(fleet.sample((k + 1) * 15.0))
    served = [s for s in samples if s.finished > 0]
    assert sum(s.finished for s in served) == pytest.approx(300.0)
    for s in served:
        assert s.ttft_le[-1] == pytest.approx(s.finished)  # every one observed
        assert s.ttft_sum_s / s.finished >= 60.0  # it waited for the replica's start-up
        assert s.ttft_le[TTFT_BUCKETS_S.index(0.5)] == 0.0  # none within the objective, as judged on arrival
        assert s.running > 0 and s.kv_usage_sum > 0  # a fleet serving them is no idle fleet
    assert fleet.outcomes(len(rates)).good_ttft.sum() == 0.0


def test_a_fleet_that_drains_a_backlog_reports_itself_busy() -> None:
    samples = _overload_then_idle(idle_ticks=3)
    arrival, drain = samples[0], samples[1]
    assert drain.finished > 0 and drain.running == pytest.approx(arrival.running)
    assert drain.kv_usage_sum == pytest.approx(arrival.kv_usage_sum)
