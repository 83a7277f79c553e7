"""The end of ``moeslo up``: the summary counts what the stack saw, and the plots are written."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.loadgen import RequestRecord
from stack.plots import write_plots
from stack.report import recent_requests, request_rows, summarize
from stack.state import Sample, StackOptions, StackState
from stack.view import print_status_line, render


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
    state.decisions = [{"action": "scale_up", "reason": "slo_burn", "outcome": "applied"}]
    state.events = [(5.0, "rebalance applied: test")]
    return state


def test_summary_counts_requests_slos_and_decisions() -> None:
    summary = summarize(_state())
    assert (summary["requests"], summary["ok"], summary["failed"]) == (3, 2, 1)
    assert summary["ttft_good_ratio"] == 1 / 3  # of all three: the failed one had no first token within
    assert summary["requests_within_both_slos"] == 1 / 3  # the failed request counts, as not within
    assert summary["imbalance_cv_max_first"] == 0.4
    assert summary["decisions"] == {"scale_up:slo_burn": 1}
    assert summary["alerts_seen"] == ["MoesloTTFTBurn"]
    assert summary["events"] == ["   5.0s rebalance applied: test"]


def test_plots_are_written(tmp_path: Path) -> None:
    (path,) = write_plots(_state(), tmp_path)
    assert path == tmp_path / "moeslo-up.png"
    assert path.stat().st_size > 10_000
    assert write_plots(StackState(StackOptions()), tmp_path) == []


def test_requests_during_the_fault_are_counted_apart() -> None:
    """Within both objectives outside the fault: TTFT and the mean gap, for requests clear of the fault."""
    state = StackState(StackOptions(duration_s=60.0))
    state.load_started_s = 10.0
    state.fault = (30.0, 40.0)  # stack seconds: load seconds 20..30, plus a 5 s margin
    def record(arrival: float, ttft: float, gaps: list[float]) -> RequestRecord:
        return RequestRecord(arrival_s=arrival, prompt_tokens=8, max_tokens=4, status=200, ttft_s=ttft,
                             itls_s=gaps, output_tokens=len(gaps) + 1)
    state.records = [
        record(1.0, 0.1, [0.01, 0.03]),  # mean gap 20 ms: within; one gap over: not within every gap
        record(5.0, 0.6, [0.01]),  # TTFT over
        record(21.0, 2.0, [0.3]),  # in the fault
        record(33.0, 0.2, [0.2]),  # in the margin after it
        record(40.0, 0.1, [0.01]),
    ]
    state.done_at_s = [12.0, 16.0, 33.0, 44.0, 51.0]
    summary = summarize(state)
    assert summary["requests_outside_fault"] == 3
    assert summary["requests_within_both_slos_outside_fault"] == 2 / 3
    assert summary["requests_within_both_slos_outside_fault_every_gap"] == 1 / 3
    assert summary["fault_window_s"] == [20.0, 30.0]
    rows = request_rows(state)
    assert [r["arrival_s"] for r in rows] == [1.0, 5.0, 21.0, 33.0, 40.0]
    # As the summary's keys read them: every gap within (the key of the same name), and the mean gap.
    assert [r["within_both_slos"] for r in rows] == [False, False, False, False, True]
    assert [r["within_both_slos_mean_gap"] for r in rows] == [True, False, False, False, True]
    clear = [r for r in rows if r["outside_fault"]]
    assert sum(r["within_both_slos_mean_gap"] for r in clear) / len(clear) == \
        summary["requests_within_both_slos_outside_fault"]
    assert sum(r["within_both_slos"] for r in clear) / len(clear) == \
        summary["requests_within_both_slos_outside_fault_every_gap"]
    assert [r["outside_fault"] for r in rows] == [True, True, False, False, True]
    assert rows[0]["itl_mean_s"] == 0.02 and rows[0]["itl_max_s"] == 0.03


def test_the_csv_column_reads_within_both_slos_as_the_summary_key_does() -> None:
    """One request with a mean gap of 18.3 ms and one gap of 45 ms: the summary's ``requests_within_both_slos``
    (every gap within) said 0.0, and requests.csv's ``within_both_slos`` (the mean gap) said True."""
    state = StackState(StackOptions(duration_s=10.0))
    state.records = [RequestRecord(arrival_s=0.0, prompt_tokens=8, max_tokens=4, status=200, ttft_s=0.1,
                                   itls_s=[0.005, 0.005, 0.045], output_tokens=4)]
    state.done_at_s = [1.0]
    (row,) = request_rows(state)
    assert summarize(state)["requests_within_both_slos"] == 0.0
    assert (row["within_both_slos"], row["within_both_slos_mean_gap"]) == (False, True)


def test_failed_requests_count_against_the_within_both_slos_shares() -> None:
    """8 fast requests and 2 refused by the router read 1.0 within both SLOs (over the 8 that succeeded), where
    requests.csv said 0.8: the shares are of all requests, a failed one not within."""
    state = StackState(StackOptions(duration_s=60.0))
    fast = [RequestRecord(arrival_s=float(i), prompt_tokens=10, max_tokens=5, status=200, ttft_s=0.1,
                          itls_s=[0.01] * 4, output_tokens=5) for i in range(8)]
    refused = [RequestRecord(arrival_s=10.0 + i, prompt_tokens=10, max_tokens=5, status=503, error="no replica")
               for i in range(2)]
    state.records = [*fast, *refused]
    state.done_at_s = [r.arrival_s + 0.2 for r in state.records]
    summary = summarize(state)
    assert summary["requests_within_both_slos"] == 0.8
    assert summary["requests_within_both_slos_outside_fault"] == 0.8
    assert summary["requests_within_both_slos_outside_fault_every_gap"] == 0.8
    assert summary["requests_outside_fault"] == 10
    rows = request_rows(state)
    assert sum(r["within_both_slos"] for r in rows) / len(rows) == summary["requests_within_both_slos"]
    assert sum(r["outside_fault"] for r in rows) == summary["requests_outside_fault"]


def test_the_ttft_and_gap_shares_count_failed_requests() -> None:
    """Five requests served and five refused (429) read ``ttft_good_ratio: 1.0``, of the five served, where the
    docs say every share is of all the requests it covers, a failed one not within.  The gap shares are of token
    gaps (the controller's ITL SLI): a refused request has none, and a stream cut short counts the gaps it had."""
    state = StackState(StackOptions(duration_s=10.0))
    served = [RequestRecord(arrival_s=float(i), prompt_tokens=8, max_tokens=4, status=200, ttft_s=0.1,
                            itls_s=[0.01] * 3, output_tokens=4) for i in range(5)]
    refused = [RequestRecord(arrival_s=5.0 + i, prompt_tokens=8, max_tokens=4, status=429, error="queue full")
               for i in range(4)]
    cut = RequestRecord(arrival_s=9.0, prompt_tokens=8, max_tokens=4, status=200, ttft_s=0.1, itls_s=[0.05],
                        output_tokens=2, error="stream ended early")
    state.records = [*served, *refused, cut]
    state.done_at_s = [r.arrival_s + 0.5 for r in state.records]
    summary = summarize(state)
    assert summary["ttft_good_ratio"] == 0.5  # the cut stream's first token was in time, but it failed
    assert summary["itl_good_ratio"] == summary["itl_good_ratio_outside_fault"] == 15 / 16


def test_decisions_not_carried_out_are_counted_apart() -> None:
    """Two forecast scale-ups the actuator failed to carry out read ``forecast_scale_ups: 2`` and
    ``decisions: {scale_up:forecast: 2}``: the figures count what the controller did, the rest apart."""
    state = _state()

    def decision(action: str, reason: str, outcome: str) -> dict[str, object]:
        return {"action": action, "reason": reason, "outcome": outcome}

    state.decisions = [
        decision("scale_up", "forecast", "failed"), decision("scale_up", "forecast", "failed"),
        decision("scale_up", "forecast", "applied"), decision("hold", "slo_burn", "held"),
        decision("rebalance", "rebalance", "failed"), decision("rebalance", "rebalance", "applied"),
        decision("verify_rebalance", "verified", "verified"),
        decision("verify_rebalance", "worse_than_predicted", "unverified"),
        decision("scale_down", "low_load", "advisory"),
    ]
    summary = summarize(state)
    assert summary["decisions"] == {"scale_up:forecast": 1, "hold:slo_burn": 1, "rebalance:rebalance": 1,
                                    "verify_rebalance:verified": 1, "verify_rebalance:worse_than_predicted": 1}
    assert summary["forecast_scale_ups"] == 1
    assert summary["rebalances_verified"] == 1
    assert summary["decisions_not_applied"] == {"scale_up:forecast failed": 2, "rebalance:rebalance failed": 1,
                                                "scale_down:low_load advisory": 1}


def test_the_live_p99s_say_when_the_fault_is_in_their_window() -> None:
    """After the fault, the requests it delayed finish and set the last 30 s's p99s: the status line says so."""
    state = StackState(StackOptions(duration_s=60.0))
    state.load_started_s, state.fault = 10.0, (30.0, 40.0)
    state.records = [RequestRecord(arrival_s=a, prompt_tokens=8, max_tokens=2, status=200, ttft_s=t, itls_s=[0.01],
                                   output_tokens=2) for a, t in ((25.0, 9.0), (29.0, 0.1), (38.0, 0.1))]  # fmt: skip
    state.done_at_s = [44.0, 39.5, 48.2]
    records, met = recent_requests(state, 50.0, 30.0)
    assert (len(records), met) == (3, 2)  # the first arrived in the fault; the second finished in it
    assert recent_requests(state, 75.0, 30.0)[1] == 0  # 45..75 s: only the third, clear of it
    console = Console(record=True, width=200)
    state.samples = [Sample(t_s=50.0, ttft_p99_s=8.8, itl_p99_s=0.01, requests_ok=3, requests_failed=0,
                            imbalance_cv=[], current_replicas=1, desired_replicas=1, ready_engines=1, alerts=[],
                            fault_requests=met)] * 5  # fmt: skip
    print_status_line(state, console)
    assert "(2 of the p99s' requests met the fault)" in console.export_text()
    slo_table = render(state).renderables[1]
    assert isinstance(slo_table, Table) and "; 2 of the window's requests met the fault" in str(slo_table.title)
    state.samples = [*state.samples[:4], replace(state.samples[0], fault_requests=0)]
    print_status_line(state, console)
    assert "met the fault" not in console.export_text()  # the buffer holds the second line only


def test_pages_delivered_counts_pages_and_tickets_apart() -> None:
    """A run whose alerts only opened tickets said ``pages_delivered: 1`` beside an empty ``pages`` list (every
    webhook post counted as a page); the committed demo said 4 pages for its 2."""
    state = _state()

    def post(receiver: str, at_s: float) -> dict[str, object]:
        return {"receiver": receiver, "status": "firing", "delivered_at_s": at_s,
                "alerts": [{"labels": {"alertname": "MoesloTTFTErrorBudgetBurn"}}]}

    state.pages = [post("ticket", 5.0)]
    summary = summarize(state)
    assert (summary["pages_delivered"], summary["tickets_delivered"], summary["pages"]) == (0, 1, [])
    state.pages = [post("page", 6.0), post("ticket", 7.0), post("page", 8.0)]
    summary = summarize(state)
    assert (summary["pages_delivered"], summary["tickets_delivered"]) == (2, 1)
    assert summary["pages_delivered"] == len(summary["pages"])


def test_a_resolved_notification_is_no_page() -> None:
    """Alertmanager posts again when an alert resolves (``send_resolved``): a page that fired and resolved read
    ``pages_delivered: 2``, and a resolved ticket counted as a ticket."""
    state = _state()

    def post(receiver: str, status: str, at_s: float) -> dict[str, object]:
        return {"receiver": receiver, "status": status, "delivered_at_s": at_s,
                "alerts": [{"labels": {"alertname": "MoesloITLErrorBudgetBurn"}}]}

    state.pages = [post("page", "firing", 70.0), post("ticket", "firing", 72.0), post("page", "resolved", 100.0),
                   post("ticket", "resolved", 101.0)]
    summary = summarize(state)
    assert (summary["pages_delivered"], summary["pages_resolved"], summary["tickets_delivered"]) == (1, 1, 1)
    assert [p["status"] for p in summary["pages"]] == ["firing", "resolved"]  # the list keeps both, by status


def test_the_summary_and_the_live_view_count_the_load_from_its_start() -> None:
    """``--duration 30`` after 46 s of set-up (checkpoint, profile, Prometheus, controller) said ``duration_s: 76``,
    output tokens per second over 76 s, and ``76 / 30 s`` in the live view's header."""
    state = _state()
    state.started_s -= 76.0 - state.elapsed()  # the stack was made 76 s ago
    state.load_started_s = 46.0
    state.samples = [replace(state.samples[-1], t_s=76.0)]
    summary = summarize(state)
    assert summary["duration_s"] == 30.0
    assert summary["output_tokens_per_s"] == 8 / 30.0  # two ok requests of 4 tokens
    console = Console(record=True, width=120)
    console.print(render(state))
    assert console.export_text().splitlines()[0].startswith("moeslo up: 30 / 10 s ")


def test_the_forecasters_models_are_listed_in_the_order_they_served() -> None:
    state = _state()
    state.load_started_s = 2.0
    fc = {"request_rate_rps": 1.0, "sized_request_rate_rps": 1.2, "in_use": True}
    models = [None, "moving_average_8", "moving_average_8", "holt_damped", "moving_average_8"]
    state.samples = [replace(state.samples[0], t_s=2.0 + 10.0 * i, forecast=None if m is None else {**fc, "model": m})
                     for i, m in enumerate(models)]  # fmt: skip
    assert summarize(state)["forecast_models"] == [
        {"model": "moving_average_8", "from_s": 10.0}, {"model": "holt_damped", "from_s": 30.0},
        {"model": "moving_average_8", "from_s": 40.0},
    ]
    console = Console(width=200, record=True)
    console.print(render(state))
    assert "moving_average_8" in console.export_text()


def test_alerts_paged_counts_each_alert_once_across_a_groups_notifications() -> None:
    """A second burn window joining a firing page notifies the group again, repeating the alert already paged:
    ``pages_delivered`` counts the two posts, ``alerts_paged`` the two alerts."""
    state = _state()

    def alert(window: str, status: str = "firing") -> dict[str, object]:
        return {"status": status, "fingerprint": f"itl-{window}",
                "labels": {"alertname": "MoesloITLErrorBudgetBurn", "window": window}}

    state.pages = [
        {"receiver": "page", "status": "firing", "delivered_at_s": 70.0, "alerts": [alert("5m")]},
        {"receiver": "page", "status": "firing", "delivered_at_s": 80.0, "alerts": [alert("5m"), alert("30m")]},
        {"receiver": "page", "status": "resolved", "delivered_at_s": 99.0, "alerts": [alert("5m", "resolved")]},
        {"receiver": "ticket", "status": "firing", "delivered_at_s": 71.0, "alerts": [alert("6h")]},
    ]
    summary = summarize(state)
    assert (summary["pages_delivered"], summary["alerts_paged"], summary["pages_resolved"]) == (2, 2, 1)
