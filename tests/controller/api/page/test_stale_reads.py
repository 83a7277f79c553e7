"""Data grows old when ticks stop succeeding: /v1/status and the pages judge its age when they are read, not only
when the last tick succeeded (which said "fresh" and then was never asked again)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from controller.policy import Policy
from controller.runtime import PolicyRuntime
from tests.controller.api.page.fakes import burning_runtime

TWO_HOURS = timedelta(hours=2)


def calm_runtime() -> PolicyRuntime:
    """Fresh at the last tick, within every objective."""
    return replace(burning_runtime(), error_budget_remaining={"ttft": 0.9, "itl": 0.9},
                   burn_rates={"ttft": {"1h": 0.1, "5m": 0.1}}, sli={"ttft_good_ratio": 0.999})  # fmt: skip


def _make(make_page: Any, *, ticks_ago: timedelta) -> Any:
    page = make_page()
    page.store.create_policy(Policy.model_validate({"name": "chat", "target": {"kind": "model", "model": "m"}}))
    runtime = calm_runtime()
    assert runtime.observed_at is not None
    runtime.observed_at -= ticks_ago
    page.view.runtimes["chat"] = runtime
    page.view.last_tick_at -= ticks_ago
    return page


def test_a_status_whose_last_tick_was_two_hours_ago_is_stale_and_says_the_tick_is_overdue(make_page: Any) -> None:
    body = _make(make_page, ticks_ago=TWO_HOURS).client.get("/v1/status").json()
    assert body["policies"][0]["stale"] is True
    assert body["tick_overdue"] is True


def test_a_fresh_status_is_neither(make_page: Any) -> None:
    body = _make(make_page, ticks_ago=timedelta(seconds=5)).client.get("/v1/status").json()
    assert body["tick_overdue"] is False
    assert body["policies"][0]["stale"] is False


def test_old_data_is_not_ok_on_the_overview_and_both_pages_say_the_ticks_stopped(make_page: Any) -> None:
    page = _make(make_page, ticks_ago=TWO_HOURS)
    overview = page.client.get("/ui/").text
    assert 'data-policy="chat" data-level="BLIND"' in overview
    assert 'data-banner="tick"' in overview and "No tick has succeeded for 2 h" in overview
    assert 'data-banner="tick"' in page.client.get("/ui/policies/chat").text


def test_a_burning_verdict_on_old_data_says_it_is_stale(make_page: Any) -> None:
    page = _make(make_page, ticks_ago=TWO_HOURS)
    runtime = burning_runtime()
    assert runtime.observed_at is not None
    runtime.observed_at -= TWO_HOURS
    page.view.runtimes["chat"] = runtime
    overview = page.client.get("/ui/").text
    assert "(alert at 14.4x; as last seen, the data is stale)" in overview


def test_the_status_reads_the_services_own_wall_clock(make_page: Any) -> None:
    """The service stamps its ticks with its wall clock (a replay's, a test's): the age is judged on it."""
    page = _make(make_page, ticks_ago=TWO_HOURS)
    last_tick_at = page.view.last_tick_at
    page.view.wall_clock = lambda: last_tick_at + timedelta(seconds=5)
    body = page.client.get("/v1/status").json()
    assert body["tick_overdue"] is False
    assert body["policies"][0]["stale"] is False


def test_both_pages_say_so_when_no_tick_has_succeeded_since_the_start(make_page: Any) -> None:
    """A first tick that never ends leaves no last tick to measure from: the overdue counts from the start."""
    page = make_page()
    page.store.create_policy(Policy.model_validate({"name": "chat", "target": {"kind": "model", "model": "m"}}))
    page.view.started_at = page.view.last_tick_at - TWO_HOURS
    page.view.last_tick_at = None
    overview = page.client.get("/ui/").text
    assert 'data-banner="tick"' in overview and "No tick has succeeded since the controller started" in overview
    assert 'data-banner="tick"' in page.client.get("/ui/policies/chat").text
    assert page.client.get("/v1/status").json()["tick_overdue"] is True
