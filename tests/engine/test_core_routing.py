"""The engine core's routing reads around a placement swap: each placement's window holds only its own routing."""

from __future__ import annotations

import numpy as np
import torch

from contracts.placement import Placement
from engine.batch import StepPlan
from engine.core import EngineCore
from engine.engine_types import EngineConfig
from engine.expert_load import ExpertLoadTracker, publish_step
from engine.sampling import SamplingParams
from engine.stats import PlacementSwapStats, RoutingDelta, StepStats
from tests.engine.fake_executor import FakeExecutor

OLD = Placement.contiguous(2, 4, 2)
NEW = Placement(np.array([[0, 2, 1, 3], [0, 2, 1, 3]], dtype=np.int64), 2)


class TwoRanks(FakeExecutor):
    """Per step, 10 assignments per layer: all on rank 0 under the old placement, 5 and 5 under the new one."""

    def __init__(self) -> None:
        super().__init__(num_blocks=128)
        self._placement = OLD
        self._counted: RoutingDelta | None = None

    @property
    def num_ranks(self) -> int:
        return 2

    def execute(self, plan: StepPlan) -> torch.Tensor:
        out = super().execute(plan)
        ranks = [10, 0] if self._placement == OLD else [5, 5]
        delta = RoutingDelta(np.array([[5, 5, 0, 0]] * 2), np.array([ranks] * 2))
        held = self._counted
        self._counted = delta if held is None else RoutingDelta(
            held.expert_tokens + delta.expert_tokens, held.rank_tokens + delta.rank_tokens, held.steps + 1)
        return out

    def take_routing(self) -> RoutingDelta | None:
        delta, self._counted = self._counted, None
        return delta

    def apply_placement(self, placement: Placement) -> PlacementSwapStats:
        self._placement = placement
        return PlacementSwapStats(duration_s=0.0, experts_moved=2, bytes_moved=1)


def _busy_core(now: list[float], max_tokens: int) -> tuple[EngineCore, TwoRanks]:
    executor = TwoRanks()
    core = EngineCore(executor, EngineConfig(routing_interval_s=0.1875), clock=lambda: now[0])
    for i in range(2):
        core.add_request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    return core, executor


def _step(core: EngineCore, now: list[float], tracker: ExpertLoadTracker, published: list[StepStats]) -> None:
    now[0] += 0.0625  # three steps per routing read
    stats = core.step().stats
    if stats is not None:
        publish_step(stats, tracker, [])
        published.append(stats)


def test_routing_held_back_at_a_swap_goes_out_with_it_and_the_new_window_holds_only_the_new_placement() -> None:
    now = [0.0]
    (core, executor), tracker, published = _busy_core(now, max_tokens=9), ExpertLoadTracker(256), list[StepStats]()
    for _ in range(4):  # the fourth step's routing is not read yet, and the fifth step's read is not due
        _step(core, now, tracker, published)
    core.apply_placement(NEW)
    while core.has_work() or core.has_news():
        _step(core, now, tracker, published)
    swap = next(s for s in published if s.placement_swap is not None)
    assert swap.routing is not None
    assert swap.routing.rank_tokens.tolist() == [[10, 0], [10, 0]]  # the old placement's fourth step, nothing else
    window = tracker.snapshot()
    assert window is not None
    assert window.steps_in_window == 5  # steps five to nine, all under the new placement
    assert window.rank_tokens.tolist() == [[25, 25], [25, 25]]
    assert window.imbalance_cv == [0.0, 0.0]
    assert sum(s.routing.steps for s in published if s.routing is not None) == executor.steps == 9


def test_a_swap_on_the_last_busy_step_still_publishes_that_step_under_the_new_placement() -> None:
    now = [0.0]
    (core, _), tracker, published = _busy_core(now, max_tokens=2), ExpertLoadTracker(256), list[StepStats]()
    _step(core, now, tracker, published)
    core.apply_placement(NEW)
    _step(core, now, tracker, published)  # the requests finish: the swap goes out with the first step's routing
    assert not core.has_work()
    assert published[-1].placement_swap is not None
    assert published[-1].routing is not None and published[-1].routing.rank_tokens.tolist() == [[10, 0], [10, 0]]
    assert core.has_news()  # the second step's routing is still owed
    _step(core, now, tracker, published)
    window = tracker.snapshot()
    assert window is not None
    assert window.steps_in_window == 1
    assert window.rank_tokens.tolist() == [[5, 5], [5, 5]]
    assert not core.has_news()


def test_the_window_reports_the_steps_its_counts_cover() -> None:
    """Read every three steps into a window of four, the counts cover six steps (the oldest read leaves only once
    the others cover four): reported as four, the counts were half again too many for the steps stated."""
    tracker = ExpertLoadTracker(4)
    for _ in range(3):
        tracker.add(RoutingDelta(expert_tokens=np.array([[6, 0]]), rank_tokens=np.array([[6, 0]]), steps=3))
    window = tracker.snapshot()
    assert window is not None
    assert window.steps_in_window == 6 and window.expert_tokens.tolist() == [[12, 0]]
