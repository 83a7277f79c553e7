"""The live rebalance benchmark: its phase schedule and policy, and one tiny run on the embedded engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.live_rebalance import LiveOptions, PhasedLoad, _policy, run_live


def test_phases_alternate_between_the_two_prompt_kinds() -> None:
    load = PhasedLoad("http://unused", LiveOptions(phase_s=2.0))
    start = load.start_s
    assert [load.kind(start + t) for t in (0.0, 1.9, 2.0, 3.9, 4.0, 6.5)] == [0, 0, 1, 1, 0, 1]


def test_policy_holds_the_issue_objective_in_whole_seconds() -> None:
    objective = _policy(2.4).objectives.imbalance
    assert objective.max_cv == 0.15 and objective.sustain_s == 2
    assert _policy(0.2).objectives.imbalance.sustain_s == 1


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
    assert trials["rebalances_verified"] <= applied <= trials["rebalances_verified"] + 1
    assert trials["held_out_predictions"] == applied
    assert trials["within_noise_of_prediction"] <= trials["rebalances_verified"]
    assert trials["failed_requests"] == 0
