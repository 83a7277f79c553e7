"""The page of one policy: where it stands now, its charts, its decisions and its history."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from controller.api.page.html import Child, Markup, el, join
from controller.api.page.layout import (
    NO_VALUE,
    budget_bar,
    fmt_ago,
    fmt_budget,
    fmt_good,
    fmt_num,
    fmt_pct,
    fmt_time,
    num,
    outcome_badge,
    page,
    with_refresh,
)
from controller.api.page.overview import tick_banner
from controller.api.page.policy_charts import (
    fmt_at,
    good_ratio_chart,
    imbalance_chart,
    load_chart,
    rebalance_chart,
    replica_chart,
)
from controller.api.page.policy_data import EVENTS_MAX, RANGES, PolicyData
from controller.api.page.verdict import SLOS, PairState, chip_css, compliance, pair_states, verdict
from controller.api.status import tick_overdue
from controller.slo import MIN_ALERT_REQUESTS

__all__ = ["render_policy"]

DECISION_ROWS = 50


def _banners(data: PolicyData) -> list[Markup]:
    out = []
    if tick_overdue(data.last_tick_at, data.now, data.tick_interval_s, data.started_at):
        out.append(tick_banner(data.last_tick_at, data.now, data.tick_interval_s))
    if data.prometheus.error:
        out.append(el("div", el("b", "Prometheus unreachable: "), data.prometheus.error,
                      " — charts fall back to the decision log.", class_="banner bad", data_banner="prometheus"))
    elif data.prom is not None and data.prom.errors:
        failed = ", ".join(sorted(data.prom.errors))
        out.append(el("div", f"Some Prometheus queries failed ({failed}); their charts use the decision log.",
                      class_="banner warn", data_banner="prometheus"))
    if data.alertmanager.error:
        out.append(el("div", el("b", "Alertmanager unreachable: "), data.alertmanager.error,
                      class_="banner bad", data_banner="alertmanager"))
    if not data.leader:
        out.append(el("div", el("b", "standby: "), "another controller acts — this one observes and logs its "
                      "decisions but scales nothing", class_="banner warn", data_banner="standby"))
    return out


def _pair_chips(pairs: list[PairState], slo: str) -> Markup:
    chips = []
    for p in pairs:
        if p.slo != slo:
            continue
        w = p.window
        rates = f"{fmt_num(p.long_rate)}× / {fmt_num(p.short_rate)}×"
        chips.append(el("span", f"{w.long_window}/{w.short_window} {rates} (≥{w.burn_rate:g}×, {w.severity})",
                        f" — {p.held_text}" if p.held else "",
                        class_=chip_css(p), data_pair=f"{slo}:{w.long_window}/{w.short_window}",
                        data_firing="true" if p.firing else "false", data_held="true" if p.held else None,
                        title=f"{w.severity} when both the {w.long_window} and {w.short_window} burn rates exceed "
                              f"{w.burn_rate:g} on {MIN_ALERT_REQUESTS} requests or more in {w.short_window} "
                              "(the alert's low-traffic guard)"))
    return join(chips) if chips else el("span", "no alerting pair for this window", class_="muted")


def _slo_table(data: PolicyData) -> Markup:
    policy, status = data.stored.policy, data.status
    pairs = pair_states(status, policy, data.request_rates)
    rows = []
    for slo in SLOS:
        objective = getattr(policy.objectives, slo)
        remaining = status.error_budget_remaining.get(slo)
        now = status.sli.get(f"{slo}_good_ratio")
        p99 = status.sli.get(f"{slo}_p99_seconds")
        rows.append(el(
            "tr",
            el("td", el("b", slo.upper()),
               el("div", f"{objective.target * 100:g} % ≤ {objective.threshold_s * 1000:g} ms", class_="small muted")),
            num(now, fmt_good(now, objective.target), data_field=f"sli.{slo}_good_ratio"),
            num(p99, NO_VALUE if p99 is None else f"{p99 * 1000:.0f} ms", data_field=f"sli.{slo}_p99_seconds"),
            num(compliance(status, policy, slo), fmt_good(compliance(status, policy, slo), objective.target, 3),
                data_field=f"compliance.{slo}"),
            el("td", num(remaining, fmt_budget(remaining), tag="span", data_field=f"error_budget_remaining.{slo}"),
               " ", budget_bar(remaining), class_="num"),
            el("td", _pair_chips(pairs, slo)),
        ))
    titles = ("SLO", f"good now ({data.sli_window})", "p99", f"compliance ({policy.window})", "budget left",
              "burn rate long / short (alert threshold)")
    head = el("tr", *(el("th", h) for h in titles))
    return el("table", el("thead", head), el("tbody", rows), data_table="slos")


def _kv(items: list[tuple[str, Child]]) -> Markup:
    return el("dl", [(el("dt", k), el("dd", v)) for k, v in items], class_="kv")


def _now_panel(data: PolicyData) -> Markup:
    status = data.status
    decision = status.decision or {}
    reasons = decision.get("reasons") or []
    errors = status.errors
    state = "failing" if errors else "stale" if status.stale else "ok"  # a failed scrape is not "ok"
    source_state: Child = state if status.observed_at else "no observation yet"
    return _kv([
        ("replicas", el("span", num(status.current_replicas, fmt_num(status.current_replicas, 0), tag="span",
                                    data_field="current_replicas"), " → ",
                        num(status.desired_replicas, fmt_num(status.desired_replicas, 0), tag="span",
                            data_field="desired_replicas"), " (current → desired)")),
        ("last decision", el("span", el("b", str(decision.get("action", NO_VALUE))),
                             f" ({', '.join(str(r) for r in reasons)})" if reasons else "",
                             el("div", str(decision.get("detail", "")), class_="small muted"),
                             _outcome(decision))),
        ("SLI source", el("span", source_state, f", observed {fmt_ago(status.observed_at, data.now)}",
                          el("div", "; ".join(errors), class_="small", data_field="errors") if errors else None)),
        ("load seen", _seen(status.seen)),
    ])


def _outcome(decision: dict[str, Any]) -> Markup | None:
    """A decision that did not take effect (failed, standby, advisory, interrupted), with what the actuator
    answered (otherwise visible only in the decision log)."""
    badge = outcome_badge(decision)
    if badge is None:
        return None
    said = str(decision.get("actuation") or "")
    return el("div", badge, f" {said}" if said else None, class_="small", data_field="actuation")


_SEEN = (("request_rate_rps", "{} req/s"), ("request_rate_peak_rps", "busiest half-minute {} req/s"),
         ("queue_depth", "queue {}"), ("router_queued", "{} held at the router"),
         ("router_refused_rps", "{} req/s refused at the router"), ("kv_cache_usage", "KV cache {}"),
         ("ready_replicas", "{} ready"), ("replica_budget", "room for {} replicas"))


def _seen(seen: dict[str, Any]) -> Markup:
    shown = []
    for key, text in _SEEN:
        value = seen.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            shown.append(text.format(fmt_pct(value, 0) if key == "kv_cache_usage" else fmt_num(value)))
    return el("span", ", ".join(shown) or NO_VALUE, class_="small")


def _forecast_panel(data: PolicyData) -> Markup:
    fc = data.status.forecast
    if not fc:
        settings = data.stored.policy.forecast
        why = ("forecasting is off for this policy" if not settings.enabled else
               f"the forecaster is warming up (it needs {settings.min_history_s} s of history) or the controller "
               "has not ticked")  # fmt: skip
        return el("div", f"No forecast yet: {why}.", class_="muted")
    in_use = bool(fc.get("in_use"))

    def v(key: str, digits: int = 2) -> Markup:
        value = fc.get(key)
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        return num(number, fmt_num(number, digits), tag="span", data_field=f"forecast.{key}")

    return _kv([
        ("sizing", el("span", el("b", "forecast in use" if in_use else "not in use (reactive)"),
                      class_="ok badge" if in_use else "off badge", data_field="forecast.in_use")),
        ("in", el("span", v("horizon_s", 0), " s: ", v("request_rate_rps"), " req/s [", v("request_rate_lower_rps"),
                  " … ", v("request_rate_upper_rps"), "], sized for ", v("sized_request_rate_rps"))),
        ("accuracy", el("span", "WAPE ", v("wape", 3), ", interval coverage ", v("coverage", 3), ", ",
                        "reliable" if fc.get("reliable") else "not reliable", f" ({fc.get('model', '')})")),
    ])


def _alerts(data: PolicyData) -> Markup:
    if data.alertmanager.url is None:
        return el("div", "Alertmanager is not configured (alertmanager_url): the burn-rate pairs above are the "
                         "controller's own evaluation of the alert rules.", class_="muted small")
    if data.alertmanager.error:
        return el("div", "Alerts unknown: Alertmanager did not answer.", class_="muted")
    if not data.alerts:
        return el("div", "No alert firing for this policy.", class_="muted", data_alerts="0")
    rows = [el("tr", el("td", el("span", a.severity or "?", class_="badge page" if a.severity == "page" else
                                 "badge ticket")), el("td", el("b", a.name)), el("td", a.slo or ""),
               el("td", a.summary), el("td", fmt_ago(a.starts_at, data.now))) for a in data.alerts]
    return el("table", el("tbody", rows), data_alerts=str(len(data.alerts)))


def _decisions(data: PolicyData) -> Markup:
    if not data.events:
        return el("div", f"No scaling or rebalancing decision in the last {data.range_key} (holds are not listed).",
                  class_="empty")
    rows = []
    for e in data.events[:DECISION_ROWS]:
        reasons = e.inputs.get("reasons") or [e.action, e.reason]
        change = "" if e.current_replicas is None else f"{e.current_replicas} → {e.desired_replicas}"
        rows.append(el("tr", el("td", fmt_at(e.at), class_="mono"), el("td", el("b", e.action)), el("td", e.outcome),
                       el("td", change, class_="num"), el("td", ", ".join(str(r) for r in reasons)),
                       el("td", e.detail, class_="small"), data_decision=str(e.id)))
    head = el("tr", *(el("th", h) for h in ("time (UTC)", "action", "outcome", "replicas", "reasons", "detail")))
    table = el("table", el("thead", head), el("tbody", rows), data_table="decisions")
    if len(data.events) <= DECISION_ROWS:
        return table
    shown = len(data.events) if len(data.events) < EVENTS_MAX else f"{EVENTS_MAX} or more"
    log = f"/v1/decisions?policy={quote(data.stored.policy.name)}"
    note = el("div", f"The newest {DECISION_ROWS} of {shown} decisions in the last {data.range_key}; the whole log, "
              "holds too, in pages of up to 500: ", el("a", log, href=log, class_="mono"), class_="muted small")
    return join((table, note))


def _history(data: PolicyData) -> Markup:
    items = [el("li", f"v{v.version} {v.operation} at {fmt_time(v.at)} UTC") for v in reversed(data.history)]
    return el("ul", items, class_="small")


def _range_links(data: PolicyData, refresh: int | None) -> Markup:
    name = quote(data.stored.policy.name)
    return el("span", "range: ", join((el("b", key) if key == data.range_key else
                                       el("a", key, href=with_refresh(f"/ui/policies/{name}?range={key}", refresh))
                                       for key in RANGES), " · "))  # fmt: skip


def _zoomed(data: PolicyData) -> Markup | None:
    if data.t0_s <= data.now.timestamp() - data.span_s:
        return None
    return el("span", f"data since {fmt_time(datetime.fromtimestamp(data.t0_s, UTC))} UTC", class_="source")


def render_policy(data: PolicyData, *, refresh_s: int | None, refresh_asked: int | None = None) -> str:
    policy, status = data.stored.policy, data.status
    v = verdict(status, policy, pair_states(status, policy, data.request_rates))
    title = el("h1", policy.name, " ", el("span", v.text, class_=f"badge {v.css}", data_verdict=v.level.name),
               " ", el("span", f"mode {policy.mode}", class_="badge off"))
    body = [
        el("div", el("a", "← all policies", href=with_refresh("/ui/", refresh_asked)), " · ",
           _range_links(data, refresh_asked), class_="small"),
        title,
        el("div", v.why, class_="muted", data_field="why"),
        el("div", f"model {policy.model_name} · target {policy.target.kind} · version {data.stored.version} · "
                  f"window {policy.window}", class_="small muted"),
        el("p", policy.description, class_="small", data_field="description") if policy.description else None,
        _banners(data),
        el("h2", "Objectives now"), _slo_table(data),
        el("div", el("div", el("h2", "Now"), _now_panel(data)), el("div", el("h2", "Forecast"), _forecast_panel(data)),
           class_="grid2"),
        el("h2", "Alerts firing"), _alerts(data),
        el("h2", f"Last {data.range_key}", _zoomed(data)),
        el("div", good_ratio_chart(data), load_chart(data), replica_chart(data), imbalance_chart(data),
           rebalance_chart(data), class_="charts"),
        el("h2", "Decisions (newest first)"), _decisions(data),
        el("h2", "Policy history"), _history(data),
    ]
    return page(f"{v.text} · {policy.name} · moeslo", body, refresh_s=refresh_s, now=data.now,
                nav=el("span", policy.name, class_="sep"), refresh_asked=refresh_asked)
