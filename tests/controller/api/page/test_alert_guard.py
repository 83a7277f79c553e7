"""The page's "burning" agrees with the generated alert rules at low traffic: each pair is held back by the TTFT
requests over its own short window (20 at least, as the rules' guard is), not by the controller's last minute."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from controller.api.page.verdict import Level, pair_states, verdict
from controller.api.schemas import PolicyStatus
from controller.policy import Policy
from tests.controller.api.page.fakes import burning_runtime

POLICY = Policy.model_validate({"name": "p", "target": {"kind": "model", "model": "m"}})
AFTERNOON = {"5m": 0.5, "30m": 0.8, "1h": 1.2, "2h": 4.0, "6h": 5.0, "1d": 3.5, "3d": 1.5}
"""Burn rates after six hours at 2 requests/s with 5 % slow TTFTs, then a lull: 1d/2h (3x) and 3d/6h (1x) burn."""


def lull(seen_rps: float) -> PolicyStatus:
    return PolicyStatus(
        name="p", mode="advisory", policy_version=1, current_replicas=2, desired_replicas=2, stale=False,
        observed_at=None, sli={"ttft_good_ratio": 0.99}, error_budget_remaining={"ttft": 0.4, "itl": 0.9},
        burn_rates={"ttft": AFTERNOON, "itl": {}}, errors=[], seen={"request_rate_rps": seen_rps}, last_decisions=[],
    )  # fmt: skip


def test_a_lull_in_the_last_minute_does_not_hide_a_ticket_whose_short_windows_were_busy() -> None:
    """0.001 requests/s in the last minute and the last half hour, 2 over the last 2 h and 6 h: the rules'
    ticket pairs fire."""
    rates = {"5m": 0.001, "30m": 0.001, "2h": 2.0, "6h": 2.0}
    pairs = pair_states(lull(0.001), POLICY, rates)
    assert [(p.window.short_window, p.quiet) for p in pairs if p.slo == "ttft"] == [
        ("5m", True), ("30m", True), ("2h", False), ("6h", False)]  # fmt: skip
    assert verdict(lull(0.001), POLICY, pairs).level == Level.TICKET


def test_the_guard_counts_requests_over_each_short_window() -> None:
    """5 requests a minute: 25 in 5m pass the guard, as do 600 in 2h; the rules tick over at 20 requests."""
    assert not any(p.quiet for p in pair_states(lull(5 / 60), POLICY, dict.fromkeys(("5m", "30m", "2h", "6h"), 5 / 60)))
    below, at = pair_states(lull(0.0), POLICY, {"5m": 19 / 300}), pair_states(lull(0.0), POLICY, {"5m": 20 / 300})
    assert [p.quiet for p in below if p.window.short_window == "5m"] == [True, True]
    assert [p.quiet for p in at if p.window.short_window == "5m"] == [False, False]
    # A slow trickle still tickets: 0.05 requests/s is 15 in 5 minutes (no page) but 360 in 2 hours.
    trickle = pair_states(lull(0.05), POLICY, dict.fromkeys(("5m", "30m", "2h", "6h"), 0.05))
    assert [(p.window.short_window, p.quiet) for p in trickle if p.slo == "ttft"] == [
        ("5m", True), ("30m", False), ("2h", False), ("6h", False)]  # fmt: skip
    assert verdict(lull(0.05), POLICY, trickle).level == Level.TICKET


def test_a_pair_whose_short_window_was_quiet_does_not_fire_however_busy_the_last_minute() -> None:
    rates = {"5m": 0.0005, "30m": 0.0005, "2h": 0.0005, "6h": 0.0005}  # under 11 requests in 6 h
    assert verdict(lull(3.0), POLICY, pair_states(lull(3.0), POLICY, rates)).level == Level.OK


def test_without_the_windows_rates_the_guard_falls_back_to_the_controllers_own_rate() -> None:
    assert verdict(lull(0.0005), POLICY, pair_states(lull(0.0005), POLICY)).level == Level.OK
    assert verdict(lull(0.0005), POLICY, pair_states(lull(0.0005), POLICY, {"5m": 0.5})).level == Level.OK
    assert verdict(lull(2.0), POLICY, pair_states(lull(2.0), POLICY)).level == Level.TICKET


def test_the_overview_asks_prometheus_for_each_short_windows_request_rate(make_page: Any) -> None:
    page = make_page(prometheus=True)
    page.store.create_policy(POLICY)
    page.view.runtimes["p"] = replace(burning_runtime(), seen={"request_rate_rps": 0.05})
    page.upstream.requests_rps = {"5m": 0.5}  # 1h/5m burns 15.2x/18.8x over 14.4x, on enough requests
    html = page.client.get("/ui/").text
    assert 'data-policy="p" data-level="PAGE"' in html
    assert any("time_to_first_token_seconds_count" in q and "[5m]" in q for q in page.upstream.queries)
    assert 'data-verdict="PAGE"' in page.client.get("/ui/policies/p").text
    page.upstream.requests_rps = {"5m": 0.05, "30m": 0.05, "2h": 0.05, "6h": 0.05}
    assert 'data-level="PAGE"' not in page.client.get("/ui/").text
    assert 'data-verdict="PAGE"' not in page.client.get("/ui/policies/p").text


def test_the_guard_counts_the_requests_ended_before_a_first_token(make_page: Any) -> None:
    """6 served and 300 timed out before a first token in 5 minutes: the rules' guard sees 306 and the page
    fires; the page counted the histogram's 6, called 1h/5m quiet and showed BUDGET_SPENT."""
    page = make_page(prometheus=True)
    page.store.create_policy(POLICY)
    page.view.runtimes["p"] = replace(burning_runtime(), seen={"request_rate_rps": 1.02})
    page.upstream.requests_rps, page.upstream.unserved_rps = {"5m": 0.02}, 1.0
    assert 'data-policy="p" data-level="PAGE"' in page.client.get("/ui/").text
    guard = next(q for q in page.upstream.queries if "[5m]" in q)
    assert 'moeslo_requests_without_first_token_total{model_name="m",finished_reason=~"deadline|error"}' in guard


def test_prometheus_down_falls_back_and_the_overview_says_so(make_page: Any) -> None:
    page = make_page(prometheus=True)
    page.store.create_policy(POLICY)
    page.view.runtimes["p"] = replace(burning_runtime(), seen={"request_rate_rps": 0.05})
    page.upstream.prometheus_down = True
    html = page.client.get("/ui/").text
    assert 'data-banner="prometheus"' in html and "low-traffic guard" in html
    assert 'data-policy="p" data-level="PAGE"' not in html  # the controller's 0.05 requests/s: quiet


def test_a_pair_held_back_by_the_guard_says_so_in_the_verdict() -> None:
    """0.05 requests/s is 15 in 5 minutes: 1h/5m burns 15.2x/18.8x over 14.4x and its page is held back."""
    status = lull(0.05).model_copy(update={"burn_rates": {"ttft": {"1h": 15.2, "5m": 18.77}, "itl": {}}})
    pairs = pair_states(status, POLICY)
    assert [(p.window.short_window, p.held) for p in pairs if p.slo == "ttft"] == [
        ("5m", True), ("30m", False), ("2h", False), ("6h", False)]  # fmt: skip
    judged = verdict(status, POLICY, pairs)
    assert judged.level == Level.OK
    assert "TTFT 1h/5m burning 15.2x/18.8x, held: fewer than 20 requests in 5m" in judged.why


def test_the_pages_draw_a_held_pair_as_held_not_burning(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(POLICY)
    page.view.runtimes["p"] = replace(burning_runtime(), seen={"request_rate_rps": 0.05},
                                      error_budget_remaining={"ttft": 0.8, "itl": 0.9})
    overview = page.client.get("/ui/").text
    row = re.search(r'<tr [^>]*data-policy="p".*?</tr>', overview, re.S)
    assert row is not None and 'data-level="OK"' in row.group(0)
    assert re.search(r'<span class="chip held"[^>]*data-held="true"[^>]*>TTFT 1h/5m [^<]* held<', row.group(0))
    assert "held: fewer than 20 requests in 5m" in row.group(0)
    policy_page = page.client.get("/ui/policies/p").text
    chip = re.search(r'<span class="chip held" data-pair="ttft:1h/5m"[^>]*>([^<]*)</span>', policy_page)
    assert chip is not None and chip.group(1).endswith("held: fewer than 20 requests in 5m")
    assert re.search(r'data-field="why">[^<]*held: fewer than 20 requests in 5m', policy_page)
