"""The live rebalance benchmark: its phase schedule and policy, and one tiny run on the embedded engine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import pytest

import bench.live_rebalance as live
from bench.live_rebalance import LiveOptions, PhasedLoad, _policy, run_live
from controller.actuators.placement import RebalanceEvent
from controller.rebalance.trigger import VerifyReason, VerifyResult


def test_phases_alternate_between_the_two_prompt_kinds() -> None:
    load = PhasedLoad("http://unused", LiveOptions(phase_s=2.0))
    start = load.start_s
    assert [load.kind(start + t) for t in (0.0, 1.9, 2.0, 3.9, 4.0, 6.5)] == [0, 0, 1, 1, 0, 1]


def test_policy_holds_the_issue_objective_in_whole_seconds() -> None:
    objective = _policy(2.4).objectives.imbalance
    assert objective.max_cv == 0.15 and objective.sustain_s == 2
    assert _policy(0.2).objectives.imbalance.sustain_s == 1


class _Rebalancer:
    """Verifies one trial per tick, with the reasons given in turn."""

    reasons: ClassVar[tuple[VerifyReason, ...]] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._left = list(self.reasons)

    async def tick(self, policy: Any, urls: Any, now: float) -> list[RebalanceEvent]:
        reason = self._left.pop(0)
        verify = VerifyResult(ok=reason == "verified", reason=reason, measured_cv=None, predicted_cv=0.05,
                              measured_minus_predicted=None)  # fmt: skip
        outcome: Any = "verified" if reason == "verified" else "unverified"
        return [RebalanceEvent(policy="live", endpoint="u", kind="verify", outcome=outcome, decision=None,
                               plan=None, verify=verify)]  # fmt: skip


class _Load:
    def __init__(self, *args: Any) -> None:
        self.start_s, self.requests, self.failures = -1e9, 0, 0

    async def run(self) -> None:
        return None

    def stop(self) -> None:
        return None


class _Control:
    async def apply_placement(self, *args: Any) -> None:
        return None

    async def aclose(self) -> None:
        return None


async def _from_contiguous(url: str) -> tuple[_Control, None]:
    return _Control(), None


def test_trials_count_verified_within_noise_and_undecided_by_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    reasons: list[VerifyReason] = ["verified", "still_violating", "worse_than_predicted", "insufficient_traffic",
                                   "no_observations", "superseded", "verified"]  # fmt: skip
    monkeypatch.setattr(_Rebalancer, "reasons", tuple(reasons))
    monkeypatch.setattr(live, "Rebalancer", _Rebalancer)
    monkeypatch.setattr(live, "PhasedLoad", _Load)
    monkeypatch.setattr(live, "_from_contiguous", _from_contiguous)
    out = asyncio.run(live.trials_run("u", LiveOptions(trials=len(reasons), tick_s=0.0), lambda _: None))
    assert out["verifications"] == 7
    assert out["rebalances_verified"] == 2  # reason "verified" only
    assert out["within_noise_of_prediction"] == 3  # verified, or still violating as predicted
    assert out["worse_than_predicted"] == 1
    assert out["undecided"] == 3  # too little traffic, no observations, another placement in force


@pytest.mark.integration
@pytest.mark.slow
def test_tiny_live_run_rebalances_and_reports_both_plans(tmp_path: Path) -> None:
    options = LiveOptions(phase_s=3.0, phases=4, trials=1, verify_after_s=2.0, concurrency=8)
    out = run_live(tmp_path, options)
    for name, windows in (("last_window", 1), ("history", options.history_windows)):
        run = out[name]
        assert run["history_windows"] == windows
        assert run["failed_requests"] == 0 and run["requests"] > 0
        assert [p["phase"] for p in run["phase_end_cv"]] == list(range(options.phases))
        assert run["rebalances"] <= 1  # the cooldown spans the whole run
        assert run["phases_after_with_cv_at_most_0.15"] <= run["phases_after_first_rebalance"]
        applied = [e for e in run["events"] if e["kind"] == "rebalance"]
        assert all(e["windows"] <= windows for e in applied)
    # Planned from the window it saw, the last-window plan's in-sample gain always clears the trigger.
    assert out["last_window"]["rebalances"] == 1
    assert out["last_window"]["events"][0]["prediction"] == "in_sample"
    assert all(e["prediction"] == "held_out" for e in out["history"]["events"] if e["kind"] == "rebalance")
    trials = out["trials"]
    applied = sum(e["kind"] == "rebalance" for e in trials["events"])
    assert trials["verifications"] <= applied <= trials["verifications"] + 1
    assert trials["held_out_predictions"] == applied
    assert trials["rebalances_verified"] <= trials["within_noise_of_prediction"] <= trials["verifications"]
    assert trials["failed_requests"] == 0
