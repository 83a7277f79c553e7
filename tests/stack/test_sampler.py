"""The stack's looks: decisions and pages are placed at their own times, not at the look that saw them."""

from __future__ import annotations

import datetime as dt
import time

import httpx
import pytest

from harness.webhook import WebhookReceiver
from stack.plots import decision_time
from stack.report import summarize
from stack.sampler import Sampler
from stack.state import StackOptions, StackState


def _decision(at: dt.datetime) -> dict[str, object]:
    return {"id": 7, "action": "scale_up", "reason": "min_replicas", "outcome": "applied", "at": at.isoformat(),
            "current_replicas": 0, "desired_replicas": 1, "inputs": {"reasons": ["scale_up", "min_replicas"]}}


def test_a_decision_is_placed_at_its_own_time() -> None:
    """The scale-up from zero, made 20 s before the load began, showed at 0 s: where the first look saw it."""
    state = StackState(StackOptions())
    time.sleep(0.3)
    state.load_started_s = state.elapsed()
    state.event("the load begins")
    decision = _decision(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=20))
    Sampler(state, "p", None, list).see_decision(decision)
    at_s = float(decision["at_s"]) - state.load_started_s  # type: ignore[arg-type]
    assert at_s == pytest.approx(-20.0, abs=0.2)
    events = summarize(state)["events"]
    assert events[0].startswith(" -20.0s scale_up:min_replicas") or events[0].startswith(" -19.9s scale_up")
    assert events[1].endswith("the load begins")  # the summary's events are in time order
    assert decision_time(decision, state.load_started_s) == (0.0, " (at -20.0 s)")  # the plot's axis starts at 0


def test_a_decision_without_a_time_is_placed_where_it_was_seen() -> None:
    state = StackState(StackOptions())
    decision = _decision(dt.datetime.now(dt.UTC))
    del decision["at"]
    Sampler(state, "p", None, list).see_decision(decision)
    assert decision["at_s"] == decision["seen_at_s"]


def test_a_page_is_placed_when_it_was_delivered_not_when_it_was_read() -> None:
    state = StackState(StackOptions())
    pager = WebhookReceiver()
    try:
        posted = state.elapsed()
        httpx.post(f"{pager.url}/page", json={"status": "firing", "alerts": [{"labels": {"alertname": "Burn"}}]})
        time.sleep(0.6)  # the next look comes a while later
        Sampler(state, "p", pager, list).read_pages()
    finally:
        pager.stop()
    (page,) = state.pages
    assert page["delivered_at_s"] == pytest.approx(posted, abs=0.3)
    assert state.events[-1][0] == page["delivered_at_s"]
