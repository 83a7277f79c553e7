"""The end of ``moeslo up``: the summary counts what the stack saw, and the plots are written."""

from __future__ import annotations

from pathlib import Path

from harness.loadgen import RequestRecord
from stack.report import summarize, write_plots
from stack.state import Sample, StackOptions, StackState


def _state() -> StackState:
    state = StackState(StackOptions(duration_s=10.0))
    state.records = [
        RequestRecord(arrival_s=0.0, prompt_tokens=8, max_tokens=4, status=200, ttft_s=0.1, itls_s=[0.01] * 3,
                      output_tokens=4),
        RequestRecord(arrival_s=1.0, prompt_tokens=8, max_tokens=4, status=200, ttft_s=0.9, itls_s=[0.03] * 3,
                      output_tokens=4),
        RequestRecord(arrival_s=2.0, prompt_tokens=8, max_tokens=4, status=503, error="down"),
    ]
    state.samples = [
        Sample(t_s=t, ttft_p99_s=0.2, itl_p99_s=0.02, requests_ok=2, requests_failed=1,
               imbalance_cv=[0.4, 0.2 - t / 100], current_replicas=1, desired_replicas=2, ready_engines=1,
               alerts=["MoesloTTFTBurn"] if t else [])
        for t in (0.0, 10.0)
    ]
    state.decisions = [{"action": "scale_up", "reason": "slo_burn"}]
    state.events = [(5.0, "rebalance applied: test")]
    return state


def test_summary_counts_requests_slos_and_decisions() -> None:
    summary = summarize(_state())
    assert (summary["requests"], summary["ok"], summary["failed"]) == (3, 2, 1)
    assert summary["ttft_good_ratio"] == 0.5
    assert summary["requests_within_both_slos"] == 0.5
    assert summary["imbalance_cv_max_first"] == 0.4
    assert summary["decisions"] == {"scale_up:slo_burn": 1}
    assert summary["alerts_seen"] == ["MoesloTTFTBurn"]
    assert summary["events"] == ["   5.0s rebalance applied: test"]


def test_plots_are_written(tmp_path: Path) -> None:
    (path,) = write_plots(_state(), tmp_path)
    assert path == tmp_path / "moeslo-up.png"
    assert path.stat().st_size > 10_000
    assert write_plots(StackState(StackOptions()), tmp_path) == []
