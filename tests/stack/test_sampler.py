"""The stack's looks: decisions and pages are placed at their own times, not at the look that saw them."""

from __future__ import annotations

import asyncio
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
    return {"id": 7, "action": "scale_up", "reason": "below_min", "outcome": "applied", "at": at.isoformat(),
            "current_replicas": 0, "desired_replicas": 1, "inputs": {"reasons": ["scale_up", "below_min"]}}


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
    assert events[0].startswith(" -20.0s scale_up:below_min") or events[0].startswith(" -19.9s scale_up")
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


class _DecisionLog:
    """The controller's ``/v1/decisions`` as it pages (newest first, ``cursor``: the ids below it)."""

    def __init__(self, count: int) -> None:
        self.decisions: list[dict[str, object]] = []
        self.add(count)

    def add(self, count: int) -> None:
        for _ in range(count):
            n = len(self.decisions) + 1
            action = "scale_up" if n == 1 else "hold"  # the scale-up from zero, then a hold every tick
            self.decisions.append({"id": n, "action": action, "reason": "below_min" if n == 1 else "steady",
                                   "outcome": "applied" if n == 1 else "held",
                                   "at": dt.datetime.now(dt.UTC).isoformat(), "inputs": {"reasons": [action]}})

    def handler(self, request: httpx.Request) -> httpx.Response:
        if not request.url.path.startswith("/v1/decisions"):
            return httpx.Response(200, json={})
        limit = min(int(request.url.params.get("limit", 50)), 500)
        cursor = request.url.params.get("cursor")
        older = [d for d in reversed(self.decisions) if cursor is None or int(str(d["id"])) < int(cursor)]
        items = older[:limit]
        return httpx.Response(200, json={"items": items,
                                         "next_cursor": items[-1]["id"] if len(items) == limit else None})


def test_every_decision_since_the_last_look_is_read_however_many() -> None:
    """Decisions were read 50 at a time: a start-up of over 100 s (a hold every 2 s tick) pushed the scale-up from
    zero out of the first look's page, and the summary never counted it."""
    state = StackState(StackOptions())
    state.controller_url = "http://controller"
    log = _DecisionLog(1200)
    sampler = Sampler(state, "p", None, list)

    async def look() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(log.handler)) as client:
            await sampler._controller(client)

    asyncio.run(look())
    assert [d["id"] for d in state.decisions] == list(range(1, 1201))  # oldest first, none twice
    assert summarize(state)["decisions"]["scale_up:below_min"] == 1
    log.add(3)
    asyncio.run(look())
    assert [d["id"] for d in state.decisions[-4:]] == [1200, 1201, 1202, 1203]
    assert len(state.decisions) == 1203
