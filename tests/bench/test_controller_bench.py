"""The controller benchmark: every timed variant runs the core it names."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.controller import ControllerBenchConfig, run_controller_bench
from controller.core import DecisionCore
from controller.types import Effects, TickInput


@pytest.mark.parametrize("predictive", [False, True])
def test_core_tick_times_the_same_core_as_the_full_tick(monkeypatch: pytest.MonkeyPatch, predictive: bool) -> None:
    seen: Counter[tuple[str, ...]] = Counter()
    tick = DecisionCore.tick

    def counted(self: DecisionCore, inp: TickInput) -> Effects:
        seen[tuple(a.name for a in self.advisors)] += 1
        return tick(self, inp)

    monkeypatch.setattr(DecisionCore, "tick", counted)
    out = run_controller_bench(ControllerBenchConfig(policies=2, replicas=4, ticks=3, warmup_ticks=0,
                                                     predictive=predictive))  # fmt: skip
    advisors = out["advisors"]
    assert isinstance(advisors, list)
    assert dict(seen) == {tuple(advisors): 6}  # core_tick and the full tick, 3 ticks each
