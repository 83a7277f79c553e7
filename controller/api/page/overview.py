"""The overview: every policy on one line, the most urgent first, filtered and paged.

The numbers are those of ``/v1/status`` at the same instant: the rows render the
:class:`ControllerStatus` that :func:`build_controller_status` builds for the API.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime
from urllib.parse import quote, urlencode

from starlette.requests import Request

from controller.api.page.html import Markup, el, join
from controller.api.page.layout import (
    NO_VALUE,
    budget_bar,
    fmt_ago,
    fmt_budget,
    fmt_good,
    fmt_num,
    num,
    outcome_badge,
    page,
    with_refresh,
)
from controller.api.page.layout import unreadable_fix as unreadable_fix_text
from controller.api.page.policy_data import Outside, outside_client, read_alerts, read_request_rates
from controller.api.page.verdict import (
    SLOS,
    Level,
    PairState,
    Verdict,
    chip_css,
    compliance,
    pair_states,
    verdict,
    worst_pair,
)
from controller.api.schemas import ControllerStatus, PolicyStatus
from controller.api.status import build_controller_status, read_now, runtime_view
from controller.config import ControllerSettings
from controller.runtime import FORECAST_NOT_IN_USE
from controller.store import PolicyListing, Store, StoredPolicy

__all__ = ["OverviewQuery", "gather_overview", "render_overview", "tick_banner"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OverviewQuery:
    q: str = ""
    """Substring of a policy's name or model (case-insensitive)."""
    state: str = ""
    """Only policies in this state (a :class:`Level` name, lower case)."""
    sort: str = "urgency"
    page: int = 1
    per_page: int = 50
    refresh: int | None = None
    """The ``?refresh=`` asked for (None: the default), kept by every link of the page."""

    def link(self, **changes: str | int) -> str:
        values = {"q": self.q, "state": self.state, "sort": self.sort, "page": self.page, "per_page": self.per_page,
                  "refresh": self.refresh, **changes}
        defaults = OverviewQuery()
        kept = {k: v for k, v in values.items() if v != getattr(defaults, k)}
        return "/ui/" + (f"?{urlencode(kept)}" if kept else "")


@dataclass(frozen=True, slots=True)
class Row:
    stored: StoredPolicy
    status: PolicyStatus
    pairs: list[PairState]
    verdict: Verdict
    alerts: int | None

    @property
    def pressure(self) -> float:
        return max((p.pressure or 0.0 for p in self.pairs), default=0.0)


@dataclass(frozen=True, slots=True)
class OverviewData:
    rows: list[Row]
    """This page's rows."""
    matching: int
    counts: Counter[Level]
    """Of every policy matching the text filter (before the state filter)."""
    controller: ControllerStatus
    query: OverviewQuery
    source: str
    alertmanager: Outside
    now: datetime
    prometheus: Outside
    """Where the low-traffic guard of the burn-rate pairs came from (an error: the controller's own rate)."""

    @property
    def pages(self) -> int:
        return max(1, -(-self.matching // self.query.per_page))


def _matches(stored: StoredPolicy, text: str) -> bool:
    needle = text.strip().lower()
    return not needle or needle in stored.policy.name.lower() or needle in stored.policy.model_name.lower()


def _matching(request: Request, text: str) -> PolicyListing:
    """The stored policies the filter's text matches: those this controller reads, and by name those it cannot."""
    store: Store = request.app.state.store
    listing = store.read_policies()
    needle = text.strip().lower()
    return PolicyListing([s for s in listing.readable if _matches(s, text)],
                         [u for u in listing.unreadable if needle in u.name.lower()])  # fmt: skip


async def gather_overview(request: Request, query: OverviewQuery) -> OverviewData:
    settings: ControllerSettings = request.app.state.settings
    now = read_now(runtime_view(request))
    listing = await asyncio.to_thread(_matching, request, query.q)
    policies = listing.readable
    async with outside_client(request) as client:
        controller, (alerts, alertmanager), (request_rates, prometheus) = await asyncio.gather(
            asyncio.to_thread(build_controller_status, request, policies, unreadable=listing.unreadable, now=now,
                              last=0),
            read_alerts(client, settings.alertmanager_url),
            read_request_rates(client, settings, [s.policy for s in policies]),
        )
    firing = Counter(a.policy for a in alerts)
    known = settings.alertmanager_url is not None and alertmanager.error is None
    rows = []
    for stored, status in zip(policies, controller.policies, strict=True):
        pairs = pair_states(status, stored.policy, None if request_rates is None else request_rates[stored.policy.name])
        rows.append(Row(stored, status, pairs, verdict(status, stored.policy, pairs),
                        firing.get(stored.policy.name, 0) if known else None))
    counts = Counter(r.verdict.level for r in rows)
    if query.state:
        rows = [r for r in rows if r.verdict.level.name.lower() == query.state]
    if query.sort == "name":
        rows.sort(key=lambda r: r.stored.policy.name)
    else:
        rows.sort(key=lambda r: (r.verdict.level, -r.pressure, r.stored.policy.name))
    last_page = max(1, -(-len(rows) // query.per_page))
    query = replace(query, page=min(query.page, last_page))  # past the end (policies deleted): the last page
    start = (query.page - 1) * query.per_page
    return OverviewData(
        rows=rows[start:start + query.per_page], matching=len(rows), counts=counts, controller=controller,
        query=query, source="Prometheus" if settings.prometheus_url else "direct scrape", alertmanager=alertmanager,
        now=now, prometheus=prometheus,
    )


def _slo_cell(row: Row, slo: str) -> Markup:
    policy, status = row.stored.policy, row.status
    objective = getattr(policy.objectives, slo)
    remaining = status.error_budget_remaining.get(slo)
    ratio = compliance(status, policy, slo)
    return el(
        "td",
        num(ratio, fmt_good(ratio, objective.target, 3), tag="span", data_field=f"compliance.{slo}"),
        el("div", num(remaining, fmt_budget(remaining), tag="span", data_field=f"error_budget_remaining.{slo}"),
           " left ", budget_bar(remaining), class_="small"),
        el("div", f"obj {objective.target * 100:g} % ≤ {objective.threshold_s * 1000:g} ms", class_="small muted"),
        class_="num",
    )


def _burn_cell(row: Row) -> Markup:
    chips = []
    for slo in SLOS:
        pairs = [p for p in row.pairs if p.slo == slo and p.pressure is not None]
        worst = worst_pair(pairs)
        if worst is None:
            continue
        w = worst.window
        every = "; ".join(f"{p.window.long_window}/{p.window.short_window}: {fmt_num(p.long_rate)}x/"
                          f"{fmt_num(p.short_rate)}x vs {p.window.burn_rate:g}x"
                          f"{f' ({p.held_text})' if p.held else ''}" for p in pairs)
        chips.append(el("span", f"{slo.upper()} {w.long_window}/{w.short_window} {fmt_num(worst.long_rate)}×/"
                        f"{fmt_num(worst.short_rate)}× ≥{w.burn_rate:g}", " held" if worst.held else "",
                        class_=chip_css(worst), title=every, data_firing="true" if worst.firing else "false",
                        data_held="true" if worst.held else None))
    return el("td", join(chips) if chips else el("span", NO_VALUE, class_="muted"))


def _source_cell(row: Row, now: datetime) -> Markup:
    status = row.status
    if status.observed_at is None:
        return el("td", "no observation", class_="muted small")
    state = "stale" if status.stale else ("errors" if status.errors else "ok")
    css = "badge blind" if state != "ok" else "badge ok"
    return el("td", el("span", state, class_=css), el("div", fmt_ago(status.observed_at, now), class_="small muted"),
              title="; ".join(status.errors) or None)


def _forecast_cell(status: PolicyStatus) -> Markup:
    fc = status.forecast
    if not fc:
        return el("td", NO_VALUE, class_="muted")
    reasons = [str(r) for r in (status.decision or {}).get("reasons") or []]
    why = next((r.replace("_", " ") for r in reasons if r in FORECAST_NOT_IN_USE), "not sizing")
    return el("td", "in use" if fc.get("in_use") else f"not in use ({why})", class_="small",
              data_field="forecast.in_use", data_value="true" if fc.get("in_use") else "false")


def _row(row: Row, data: OverviewData) -> Markup:
    policy, status = row.stored.policy, row.status
    decision = status.decision or {}
    reasons = [str(r) for r in decision.get("reasons") or []]
    href = with_refresh(f"/ui/policies/{quote(policy.name)}", data.query.refresh)
    return el(
        "tr",
        el("td", el("a", el("b", policy.name), href=href), el("div", f"{policy.model_name} · {policy.mode}",
                                                                  class_="small muted")),
        el("td", el("span", row.verdict.text, class_=f"badge {row.verdict.css}"),
           el("div", row.verdict.why, class_="small muted")),
        *(_slo_cell(row, slo) for slo in SLOS),
        _burn_cell(row),
        el("td", num(status.current_replicas, fmt_num(status.current_replicas, 0), tag="span",
                     data_field="current_replicas"), " → ",
           num(status.desired_replicas, fmt_num(status.desired_replicas, 0), tag="span", data_field="desired_replicas"),
           class_="num"),
        _source_cell(row, data.now),
        _forecast_cell(status),
        el("td", NO_VALUE if row.alerts is None else str(row.alerts), class_="num", data_field="alerts"),
        el("td", el("b", str(decision.get("action", NO_VALUE))),
           outcome_badge(decision, " {}", titled=True),
           el("div", ", ".join(reasons[1:3]), class_="small muted")),
        class_=f"row-{row.verdict.css}", data_policy=policy.name, data_level=row.verdict.level.name,
    )


_SUMMARY = ((Level.PAGE, "paging"), (Level.TICKET, "ticket"), (Level.BLIND, "stale"),
            (Level.BUDGET_SPENT, "budget spent"), (Level.NO_DATA, "no data"), (Level.OK, "ok"))


def _summary(data: OverviewData) -> Markup:
    chips = []
    for level, text in _SUMMARY:
        count = data.counts.get(level, 0)
        state = level.name.lower()
        css = f"{level.name.lower().replace('_', '-')}" if count else "off"
        chips.append(el("a", f"{count} {text}", href=data.query.link(state="" if data.query.state == state else state,
                                                                    page=1),
                        class_=css, data_count=state, data_value=str(count)))
    return el("div", chips, class_="summary")


def _controller_line(data: OverviewData) -> Markup:
    c = data.controller
    return el("div", f"controller {c.mode} · last tick {fmt_ago(c.last_tick_at, data.now)} · tick every "
                     f"{c.tick_interval_s:g} s · SLIs from {data.source}", class_="small muted",
              data_leader="true" if c.leader else "false")


def _filter(data: OverviewData) -> Markup:
    q = data.query
    return el(
        "form",
        el("input", type="search", name="q", value=q.q, placeholder="filter by policy or model",
           aria_label="filter by policy or model"),
        el("input", type="hidden", name="state", value=q.state) if q.state else None,
        el("input", type="hidden", name="sort", value=q.sort) if q.sort != "urgency" else None,
        el("input", type="hidden", name="per_page", value=str(q.per_page))
        if q.per_page != OverviewQuery().per_page else None,
        el("input", type="hidden", name="refresh", value=str(q.refresh)) if q.refresh is not None else None,
        el("button", "filter", type="submit"),
        el("a", "clear", href=q.link(q="", state="", page=1)) if q.q or q.state else None,
        el("span", "sort: ", el("b", "most urgent first") if q.sort != "name" else
           el("a", "most urgent first", href=q.link(sort="urgency")), " · ",
           el("b", "name") if q.sort == "name" else el("a", "name", href=q.link(sort="name")), class_="small"),
        method="get", action="/ui/", class_="filter",
    )


def _pager(data: OverviewData) -> Markup | None:
    q = data.query
    if data.pages <= 1:
        return None
    return el("div", el("a", "← newer", href=q.link(page=q.page - 1)) if q.page > 1 else None,
              el("span", f"page {q.page} of {data.pages} ({data.matching} policies)"),
              el("a", "more →", href=q.link(page=q.page + 1)) if q.page < data.pages else None, class_="pager")


def _table(data: OverviewData) -> Markup:
    if not data.rows:
        none_at_all = not data.query.q and not sum(data.counts.values())
        text = ("No policy yet: create one with `moeslo policy apply -f policy.yaml` or PUT /v1/policies/{name}."
                if none_at_all else "No policy matches the filter.")
        return el("div", text, class_="empty", data_empty="true")
    head = el("tr", *(el("th", h) for h in ("policy", "state", "TTFT compliance / budget", "ITL compliance / budget",
                                            "worst burn pair (long/short)", "replicas", "SLI source", "forecast",
                                            "alerts", "last decision")))
    return el("table", el("thead", head), el("tbody", [_row(r, data) for r in data.rows]), data_table="policies")


def tick_banner(last_tick_at: datetime | None, now: datetime, tick_interval_s: float) -> Markup:
    """Says that no tick has succeeded for several tick intervals, or none since the controller started (the
    overview and the policy page alike)."""
    since = ("since the controller started" if last_tick_at is None
             else f"for {fmt_ago(last_tick_at, now).removesuffix(' ago')}")  # fmt: skip
    return el("div", el("b", f"No tick has succeeded {since}"), f" (the controller ticks every "
              f"{tick_interval_s:g} s): its ticks fail or hang, so what this page shows is that old.",
              class_="banner bad", data_banner="tick")


def _unreadable_banner(data: OverviewData) -> Markup | None:
    """The stored policies this controller cannot read: it does not run them, and they have no row."""
    unreadable = data.controller.unreadable
    if not unreadable:
        return None
    items = [el("li", el("a", el("b", u.name), href=with_refresh(f"/ui/policies/{quote(u.name)}", data.query.refresh)),
                f" (version {u.version}): ",
                u.problem, el("div", unreadable_fix_text(u.name, u.version), class_="small"), data_unreadable=u.name)
             for u in unreadable]  # fmt: skip
    return el("div", el("b", f"{len(unreadable)} stored {'policy' if len(unreadable) == 1 else 'policies'} this "
                             "controller cannot read, so does not run:"),
              el("ul", items), class_="banner bad", data_banner="unreadable")  # fmt: skip


def render_overview(data: OverviewData, *, refresh_s: int | None) -> str:
    c = data.controller
    banners = [_unreadable_banner(data)]
    if c.tick_overdue:
        banners.append(tick_banner(c.last_tick_at, data.now, c.tick_interval_s))
    if data.alertmanager.error:
        banners.append(el("div", el("b", "Alertmanager unreachable: "), data.alertmanager.error,
                          " — the alerts column is unknown.", class_="banner bad", data_banner="alertmanager"))
    if data.prometheus.error:
        banners.append(el("div", el("b", "Prometheus unreachable: "), data.prometheus.error,
                          " — the burn-rate pairs' low-traffic guard uses the controller's last 1-minute request "
                          "rate, not each pair's short window as the alert rules do.", class_="banner warn",
                          data_banner="prometheus"))
    firing = data.counts.get(Level.PAGE, 0)
    title = f"{firing} paging · moeslo" if firing else "moeslo status"
    body = [el("h1", "SLO status"), _controller_line(data), banners, _summary(data), _filter(data), _table(data),
            _pager(data)]
    return page(title, body, refresh_s=refresh_s, now=data.now, refresh_asked=data.query.refresh)
