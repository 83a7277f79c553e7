"""The charts of a policy page, each saying which source drew it.

Prometheus (range queries) draws the good ratios, the load and the per-layer heatmap when
``prometheus_url`` is set and it answers with samples; otherwise the decision log draws what
it holds (every tick records what the core saw).  Forecasts, replicas, decisions and
rebalances always come from the decision log: the controller's own record of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from controller.api.page.html import Child, Markup, el
from controller.api.page.policy_data import LOG_FIELDS, PolicyData
from controller.api.page.svg import Band, Heatmap, HLine, Marker, Series, heat_legend, heatmap, time_chart
from controller.store import DecisionRecord

__all__ = ["good_ratio_chart", "imbalance_chart", "load_chart", "rebalance_chart", "replica_chart"]

Point = tuple[float, float | None]
LOG = "decision log (what the core saw each tick)"
PROM = "Prometheus range query"
COLORS = {"ttft": "#1a73e8", "itl": "#e8710a", "load": "#202124", "forecast": "#9334e6", "current": "#1a73e8",
          "desired": "#188038", "scale_up": "#188038", "scale_down": "#d93025", "rebalance": "#9334e6",
          "failed": "#d93025", "version": "#5f6368", "objective": "#d93025", "noise": "#80868b"}
GLYPHS = {"scale_up": "▲", "scale_down": "▼", "rebalance": "◆", "verify_rebalance": "✓"}


def _has(points: Sequence[Point]) -> bool:
    return any(v is not None for _, v in points)


def _widened(over: str, controllers: str) -> str:
    """Says why a chart's window is not the controller's: the step is longer, and a shorter window would skip
    the time between two points."""
    return "" if over == controllers else f"; one step, not the controller's {controllers}, so no time is skipped"


def panel(key: str, title: str, source: str, body: Child, *, legend: Child = None, note: Child = None) -> Markup:
    return el(
        "section",
        el("h3", title, el("span", f"source: {source}", class_="source", data_source=source)),
        el("div", note, class_="small muted") if note else None,
        body,
        legend,
        class_="panel", data_panel=key,
    )


def legend(*items: tuple[str, str, bool]) -> Markup:
    """(label, colour, is_area) entries."""
    return el("div", [el("span", el("i", class_="box" if area else None, style=f"background:{color}"), label)
                      for label, color, area in items], class_="legend")


def empty(text: str) -> Markup:
    return el("div", text, class_="empty")


def _pct_digits(low: float, high: float) -> int:
    """Decimals a percent axis from ``low`` to ``high`` needs to tell its ticks apart."""
    return 2 if high - low < 0.02 else (1 if high - low < 0.2 else 0)


def good_ratio_chart(data: PolicyData) -> Markup:
    policy = data.stored.policy
    prom = data.prom
    use_prom = prom is not None and (_has(prom.ttft_good) or _has(prom.itl_good))
    ttft = prom.ttft_good if use_prom and prom is not None else data.log_series("ttft_good")
    itl = prom.itl_good if use_prom and prom is not None else data.log_series("itl_good")
    over = prom.windows.sli_window if use_prom and prom is not None else data.sli_window
    if not (_has(ttft) or _has(itl)):
        return panel("good_ratio", f"TTFT and ITL good ratio ({over}) against the objective", LOG,
                     empty(f"No SLI samples in the last {data.range_key}: no requests seen yet, or the SLI "
                           "source had nothing to say (see the source status above)."))
    targets = {policy.objectives.ttft.target, policy.objectives.itl.target}
    values = [v for _, v in (*ttft, *itl) if v is not None] + list(targets)
    low = min(values)
    y_min = max(0.0, low - (1.0 - low) * 0.3 - 1e-4)
    digits = _pct_digits(y_min, 1.0)
    gap = (prom.step_s if use_prom and prom is not None else data.tick_interval_s) * 3.5
    hlines = [HLine(t, f"objective {t * 100:g} %", COLORS["objective"]) for t in sorted(targets)]
    chart = time_chart(
        "good_ratio", t0=data.t0_s, t1=data.now.timestamp(),
        series=[Series("itl", f"ITL ≤ {policy.objectives.itl.threshold_s * 1000:g} ms", itl, COLORS["itl"], gap_s=gap),
                Series("ttft", f"TTFT ≤ {policy.objectives.ttft.threshold_s * 1000:g} ms", ttft, COLORS["ttft"],
                       gap_s=gap)],
        hlines=hlines, y_min=y_min, y_max=1.0, y_format=lambda v: f"{v * 100:.{digits}f}%",
        label="good ratio of TTFT and ITL",
    )
    source = f"{PROM} (good/total over {over}, at the threshold{_widened(over, data.sli_window)})" if use_prom else LOG
    return panel("good_ratio", f"TTFT and ITL good ratio ({over}) against the objective", source, chart,
                 legend=legend((f"TTFT ≤ {policy.objectives.ttft.threshold_s * 1000:g} ms", COLORS["ttft"], False),
                               (f"ITL ≤ {policy.objectives.itl.threshold_s * 1000:g} ms", COLORS["itl"], False),
                               ("objective", COLORS["objective"], False)))


SIZED_BAND = "forecast: the interval's lower bound up to the rate sized for"
"""The band's upper edge is the rate the fleet was sized for (the sizing quantile, with any burst
headroom), which is what a reader weighs the actual rate against; its lower edge is the interval's."""


def _forecast_band(data: PolicyData) -> tuple[list[Point], list[Point], list[Point]]:
    """Point, lower and sized-for forecasts, each drawn at the time it was for (decision time + horizon)."""
    point: list[Point] = []
    lower: list[Point] = []
    upper: list[Point] = []
    names = list(LOG_FIELDS)
    f, lo, hi, h = (names.index(n) for n in ("forecast", "forecast_lower", "forecast_upper", "horizon_s"))
    for p in data.log:
        value = p.values[f]
        if value is None:
            continue
        at = p.at_s + (p.values[h] or 0.0)
        point.append((at, value))
        lower.append((at, p.values[lo] if p.values[lo] is not None else value))
        upper.append((at, p.values[hi] if p.values[hi] is not None else value))
    return point, lower, upper


def load_chart(data: PolicyData) -> Markup:
    prom = data.prom
    use_prom = prom is not None and _has(prom.load)
    actual = prom.load if use_prom and prom is not None else data.log_series("load")
    point, lower, upper = _forecast_band(data)
    if not (_has(actual) or point):
        return panel("load", "Request rate against the forecast band", LOG,
                     empty(f"No load observed and no forecast made in the last {data.range_key}."))
    over = prom.windows.rate_window if use_prom and prom is not None else data.rate_window
    now_s = data.now.timestamp()
    horizon = max((t for t, _ in point), default=now_s) - now_s
    gap = (prom.step_s if use_prom and prom is not None else data.tick_interval_s) * 3.5
    chart = time_chart(
        "load", t0=data.t0_s, t1=now_s + max(0.0, horizon),
        series=[Series("actual", "actual", actual, COLORS["load"], gap_s=gap),
                Series("forecast", "forecast", point, COLORS["forecast"], dash=True, gap_s=data.tick_interval_s * 3.5)],
        bands=[Band("forecast_band", SIZED_BAND, lower, upper, COLORS["forecast"])],
        markers=[Marker(now_s, "now", "now", "#5f6368")], y_min=0.0, y_format=lambda v: f"{v:g}",
        label="request rate and forecast",
    )
    note = None if point else "No forecast in range: forecasting is off for this policy, or still warming up."
    actual_source = f"{PROM} (over {over}{_widened(over, data.rate_window)})" if use_prom else LOG
    source = f"actual: {actual_source}; forecast: {LOG} (drawn one lead time after it was made)"
    return panel("load", f"Request rate (req/s over {over}) against the forecast band", source, chart,
                 note=note,
                 legend=legend(("actual", COLORS["load"], False), ("forecast (point)", COLORS["forecast"], False),
                               (SIZED_BAND, COLORS["forecast"], True)))


def _decision_markers(events: Sequence[DecisionRecord]) -> list[Marker]:
    out = []
    for record in events[:300]:
        color = COLORS["failed"] if record.outcome == "failed" else COLORS.get(record.action, "#5f6368")
        reasons = record.inputs.get("reasons") or [record.action, record.reason]
        title = (f"{record.at:%H:%M:%S} {record.action} {record.current_replicas} -> {record.desired_replicas} "
                 f"({record.outcome}); reasons: {', '.join(str(r) for r in reasons)}; {record.detail}")
        out.append(Marker(record.at.timestamp(), GLYPHS.get(record.action, "•"), title, color))
    return out


def replica_chart(data: PolicyData) -> Markup:
    policy = data.stored.policy
    current: list[Point] = [(p.at_s, p.current_replicas) for p in data.log]
    desired: list[Point] = [(p.at_s, p.desired_replicas) for p in data.log]
    scaling = [e for e in data.events if e.action in ("scale_up", "scale_down")]
    if not (_has(current) or _has(desired)):
        return panel("replicas", "Replicas and decisions", LOG,
                     empty(f"No decisions in the last {data.range_key}: the controller logs one per tick once it "
                           "evaluates this policy."))
    t0 = data.t0_s
    versions = [Marker(v.at.timestamp(), f"v{v.version}", f"policy version {v.version} ({v.operation}) at "
                       f"{v.at:%Y-%m-%d %H:%M:%S}", COLORS["version"]) for v in data.history if v.at.timestamp() >= t0]
    gap = data.tick_interval_s * 3.5
    chart = time_chart(
        "replicas", t0=t0, t1=data.now.timestamp(),
        series=[Series("current", "current", current, COLORS["current"], kind="step", gap_s=gap),
                Series("desired", "desired", desired, COLORS["desired"], kind="step", dash=True, gap_s=gap)],
        hlines=[HLine(policy.scaling.max_replicas, f"max {policy.scaling.max_replicas}")],
        markers=[*versions, *_decision_markers(scaling)], y_min=0.0, y_format=lambda v: f"{v:g}",
        label="replicas and decisions",
    )
    return panel("replicas", "Replicas and decisions (hover a mark for its reasons)", LOG, chart,
                 legend=legend(("current", COLORS["current"], False), ("desired", COLORS["desired"], False),
                               ("▲ scale up", COLORS["scale_up"], False), ("▼ scale down", COLORS["scale_down"], False),
                               ("v policy change", COLORS["version"], False)))


def imbalance_chart(data: PolicyData) -> Markup:
    policy = data.stored.policy
    max_cv = policy.objectives.imbalance.max_cv
    t0, t1 = data.t0_s, data.now.timestamp()
    prom = data.prom
    if prom is not None and prom.layer_cv:
        times = sorted({t for points in prom.layer_cv.values() for t, _ in points})
        index = {t: i for i, t in enumerate(times)}
        rows, values = [], []
        for layer, points in prom.layer_cv.items():
            row: list[float | None] = [None] * len(times)
            for t, v in points:
                row[index[t]] = v
            rows.append(f"L{layer}")
            values.append(row)
        chart = heatmap(Heatmap("imbalance", rows, times, values, vmax=max_cv, step_s=prom.step_s), t0=t0, t1=t1,
                        label="per-layer expert imbalance CV")
        scale = legend(*((f"CV {text}", color, True) for text, color in heat_legend(max_cv)))
        return panel("imbalance", f"Expert imbalance CV per layer (red at the objective, {max_cv:g})",
                     f"{PROM} (moe_layer_imbalance_cv)", chart, legend=scale)
    worst = data.log_series("imbalance_cv_max")
    note = ("The per-layer heatmap needs Prometheus with the engine's moe_layer_imbalance_cv series; "
            "this is the worst layer's CV as the core saw it.")
    if not _has(worst):
        return panel("imbalance", "Expert imbalance (worst layer's CV)", LOG,
                     empty(f"No imbalance measured in the last {data.range_key} (the engines export no expert series, "
                           "or nothing was routed)."), note=note)
    chart = time_chart("imbalance", t0=t0, t1=t1,
                       series=[Series("worst_cv", "worst layer", worst, COLORS["forecast"],
                                      gap_s=data.tick_interval_s * 3.5)],
                       hlines=[HLine(max_cv, f"objective CV {max_cv:g}", COLORS["objective"])], y_min=0.0,
                       label="worst layer imbalance CV")
    return panel("imbalance", "Expert imbalance (worst layer's CV)", LOG, chart, note=note)


def _predicted_cv(plan: dict[str, Any]) -> float | None:
    """The worst-layer CV a rebalance predicted, as its trigger and verification judge it: on a window the
    plan was not planned from where there is one (``held_out``), else on the windows it was planned from."""
    held_out = plan.get("held_out")
    if isinstance(held_out, dict) and held_out.get("worst_cv_after") is not None:
        return float(held_out["worst_cv_after"])
    return None if plan.get("imbalance_after_cv") is None else float(plan["imbalance_after_cv"])


def _rebalance_points(events: Sequence[DecisionRecord]) -> dict[str, list[Point]]:
    out: dict[str, list[Point]] = {"predicted": [], "measured": [], "noise": []}
    for record in reversed(events):
        t = record.at.timestamp()
        verify: dict[str, Any] = record.inputs.get("verify") or {}
        plan: dict[str, Any] = record.inputs.get("plan") or {}
        predicted = _predicted_cv(plan)
        if record.action == "rebalance" and predicted is not None:
            out["predicted"].append((t, predicted))
        if record.action == "verify_rebalance":
            for key, field in (("measured", "measured_cv"), ("noise", "noise_cv")):
                if verify.get(field) is not None:
                    out[key].append((t, float(verify[field])))
    return out


def rebalance_chart(data: PolicyData) -> Markup:
    events = [e for e in data.events if e.action in ("rebalance", "verify_rebalance")]
    if not events:
        return panel("rebalances", "Rebalances: predicted against measured CV", LOG,
                     empty(f"No expert rebalance in the last {data.range_key}."))
    points = _rebalance_points(events)
    max_cv = data.stored.policy.objectives.imbalance.max_cv
    chart = time_chart(
        "rebalances", t0=data.t0_s, t1=data.now.timestamp(),
        series=[Series("predicted", "predicted after", points["predicted"], COLORS["forecast"], kind="points"),
                Series("measured", "measured", points["measured"], COLORS["scale_down"], kind="points"),
                Series("noise", "noise floor", points["noise"], COLORS["noise"], kind="points")],
        hlines=[HLine(max_cv, f"objective CV {max_cv:g}", COLORS["objective"])], y_min=0.0,
        label="rebalances: predicted and measured worst-layer CV",
    )
    return panel("rebalances", "Rebalances: predicted against measured worst-layer CV", LOG, chart,
                 legend=legend(("predicted after the move", COLORS["forecast"], False),
                               ("measured after", COLORS["scale_down"], False),
                               ("sampling-noise floor", COLORS["noise"], False)))


def fmt_at(at: datetime) -> str:
    return f"{at:%H:%M:%S}" if at.date() == datetime.now(at.tzinfo).date() else f"{at:%d %b %H:%M:%S}"
