"""The page shell (head, style, self-refresh, navigation) and number formatting shared by the pages.

Every figure a page shows is written twice: as text for people and as the exact
value in ``data-value`` (``repr`` of the float), so a test can compare a page
with ``/v1/status`` without parsing rounded text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

from controller.api.page.html import Child, Markup, el, esc

__all__ = [
    "NO_VALUE",
    "budget_bar",
    "fmt_ago",
    "fmt_budget",
    "fmt_good",
    "fmt_num",
    "fmt_pct",
    "fmt_time",
    "num",
    "outcome_badge",
    "page",
    "problem_page",
    "unreadable_fix",
]

NO_VALUE = "–"

_STYLE = """
:root{--fg:#202124;--muted:#5f6368;--line:#dadce0;--bg:#fff;--panel:#f8f9fa;--link:#1a56c4;
--page:#c5221f;--page-bg:#fce8e6;--ticket:#a35200;--ticket-bg:#fef3d6;--stale:#3c4043;--stale-bg:#e8eaed;
--spent:#8430ce;--spent-bg:#f3e8fd;--ok:#137333;--ok-bg:#e6f4ea;--nodata:#5f6368;--nodata-bg:#f1f3f4}
*{box-sizing:border-box}
body{margin:0;font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);
background:var(--bg)}
a{color:var(--link);text-decoration:none}a:hover{text-decoration:underline}
header.top{display:flex;gap:14px;align-items:baseline;flex-wrap:wrap;padding:8px 16px;background:#202124;
color:#e8eaed}
header.top a{color:#fff;font-weight:600}header.top .sep{color:#9aa0a6}
main{padding:12px 16px 32px;max-width:1500px}
h1{font-size:20px;margin:4px 0 6px}h2{font-size:15px;margin:22px 0 6px}h3{font-size:13px;margin:12px 0 2px}
.muted{color:var(--muted)}.small{font-size:12px}.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace}
.banner{padding:8px 12px;border-radius:6px;margin:8px 0;border:1px solid var(--line);background:var(--panel)}
.banner.warn{border-color:#f9ab00;background:#fef7e0}.banner.bad{border-color:var(--page);background:var(--page-bg)}
.summary{display:flex;gap:8px;flex-wrap:wrap;margin:6px 0 10px}
.summary a,.summary span{padding:3px 10px;border-radius:12px;font-weight:600}
table{border-collapse:collapse;width:100%}
th,td{padding:5px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{font-size:12px;color:var(--muted);font-weight:600;background:var(--panel);position:sticky;top:0}
tr.row-page{background:#fff6f5}tr.row-ticket{background:#fffbf0}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:700;font-size:12px;white-space:nowrap}
.page{color:var(--page);background:var(--page-bg)}.ticket{color:var(--ticket);background:var(--ticket-bg)}
.blind{color:var(--stale);background:var(--stale-bg)}.budget-spent{color:var(--spent);background:var(--spent-bg)}
.ok{color:var(--ok);background:var(--ok-bg)}.no-data{color:var(--nodata);background:var(--nodata-bg)}
.off{color:var(--muted);background:var(--panel);border:1px solid var(--line)}
.bar{display:inline-block;width:64px;height:7px;background:#e8eaed;border-radius:4px;vertical-align:middle;
overflow:hidden}.bar>span{display:block;height:100%;background:var(--ok)}
.bar.low>span{background:#f9ab00}.bar.spent>span{background:var(--page)}
.chip{display:inline-block;padding:0 6px;border-radius:8px;margin:1px 2px 1px 0;font-size:12px;white-space:nowrap;
border:1px solid var(--line)}
.chip.firing{border-color:var(--page);color:var(--page);background:var(--page-bg);font-weight:700}
.chip.warm{border-color:#f9ab00;background:#fef7e0}.chip.held{border-style:dashed;color:var(--muted)}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:10px 24px}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(600px,1fr));gap:12px 16px}
.panel{border:1px solid var(--line);border-radius:8px;padding:8px 12px;background:#fff}
.chart{width:100%;height:auto;display:block}
.chart .grid{stroke:#eceff1;stroke-width:1}.chart .frame{fill:none;stroke:#bdc1c6}
.chart text{font-size:10px;fill:#5f6368}.chart .ylab{text-anchor:end}.chart .xlab{text-anchor:middle}
.chart .reflab{text-anchor:end;font-size:10px}.chart .mark{text-anchor:middle;font-size:11px;font-weight:700}
.legend{display:flex;gap:12px;flex-wrap:wrap;font-size:12px;color:var(--muted);margin:2px 0}
.legend i{display:inline-block;width:14px;height:3px;vertical-align:middle;margin-right:4px}
.legend i.box{height:10px;opacity:.35}.heat+.legend i.box{opacity:1;border:1px solid #dadce0}
.source{font-size:11px;color:var(--muted);font-weight:400;margin-left:6px}
.empty{padding:18px;text-align:center;color:var(--muted);background:var(--panel);border-radius:6px}
form.filter{display:flex;gap:6px;align-items:center;margin:6px 0}
form.filter input[type=search]{padding:4px 8px;border:1px solid var(--line);border-radius:6px;width:260px}
.pager{margin:10px 0;display:flex;gap:10px;align-items:center}
.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px}.kv dt{color:var(--muted)}.kv dd{margin:0}
"""


def with_refresh(href: str, refresh: int | None) -> str:
    """``href`` keeping the ``?refresh=`` the page was asked with (None: it was not), so a reader who turned the
    reloads off does not get them back on the next page."""
    if refresh is None:
        return href
    return f"{href}{'&' if '?' in href else '?'}refresh={refresh}"


def page(title: str, body: Child, *, refresh_s: int | None, nav: Child = None, now: datetime,
         refresh_asked: int | None = None) -> str:  # fmt: skip
    """A whole HTML document; ``refresh_s`` reloads it (None or 0: never); ``refresh_asked``: the page's own
    ``?refresh=``, which its links keep."""
    head = el(
        "head",
        el("meta", charset="utf-8"),
        el("meta", name="viewport", content="width=device-width, initial-scale=1"),
        el("meta", http_equiv="refresh", content=str(refresh_s)) if refresh_s else None,
        el("title", title),
        el("link", rel="icon", href="data:,"),
        el("style", Markup(_STYLE)),
    )
    top = el(
        "header",
        el("a", "moeslo status", href=with_refresh("/ui/", refresh_asked)),
        nav,
        el("span", f"rendered {fmt_time(now)} UTC", class_="sep"),
        el("span", f"refreshes every {refresh_s} s" if refresh_s else "auto-refresh off", class_="sep"),
        el("a", "API", href="/docs", class_="sep"),
        class_="top",
    )
    document = el("html", head, el("body", top, el("main", body), data_rendered_at=now.isoformat()), lang="en")
    return "<!doctype html>\n" + document


def problem_page(status: int, problems: list[tuple[str, str]], now: datetime) -> str:
    """What a page that cannot be shown says instead: each (field, message) (no field: the message alone), and
    the way back.  A 4xx was asked for wrongly (a bad query value); a 5xx fails on the controller's side."""
    heading = "This page cannot be shown as asked" if status < 500 else "This page cannot be shown now"
    items = [el("li", (el("code", field), ": ") if field else None, message) for field, message in problems]
    body = [el("h1", heading), el("ul", items), el("p", el("a", "All policies", href="/ui/"))]
    return page(f"{status}: {HTTPStatus(status).phrase.lower()}", body, refresh_s=None, now=now)


def unreadable_fix(name: str, version: int) -> Markup:
    """How to fix a stored policy this controller cannot read: replace it or delete it (neither reads it)."""
    return el("span", "Replace it with ", el("code", f"PUT /v1/policies/{name}"), " and ",
              el("code", f'If-Match: "{version}"'), " (a policy this version reads), or delete it with ",
              el("code", f"DELETE /v1/policies/{name}"), ".")  # fmt: skip


def fmt_time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_ago(at: datetime | None, now: datetime) -> str:
    if at is None:
        return "never"
    seconds = (now - at).total_seconds()
    if seconds < 0:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def fmt_pct(value: float | None, digits: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return NO_VALUE
    return f"{value * 100:.{digits}f} %"


def fmt_good(value: float | None, target: float, digits: int = 2) -> str:
    """A good ratio beside its objective: at least the objective's decimals, rounded down, so a missed target
    never reads as met (0.99986 against 99.99 % is 99.98 %, not 99.99 %)."""
    if value is None or not math.isfinite(value):
        return NO_VALUE
    percent = target * 100
    digits = max(digits, next((d for d in range(9) if math.isclose(round(percent, d), percent, abs_tol=1e-9)), 9))
    scale = 10**digits
    # round() first: 0.9999 * 100 * 100 is 9998.999999999998, which is the target met, not missed
    return f"{math.floor(round(value * 100 * scale, 6)) / scale:.{digits}f} %"


def fmt_budget(value: float | None) -> str:
    """Error budget left: ``+42 %`` of it left, ``-120 %`` overspent."""
    if value is None or not math.isfinite(value):
        return NO_VALUE
    return f"{value * 100:+.0f} %"


def fmt_num(value: float | None, digits: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return NO_VALUE
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def num(value: float | int | None, text: str, *, tag: str = "td", **attrs: str | None) -> Markup:
    """A cell (or span) showing ``text`` with the exact value in ``data-value`` (empty when None)."""
    exact = "" if value is None else repr(value)
    css = attrs.pop("class_", None)
    return el(tag, text, data_value=exact, **attrs, class_=css or ("num" if tag == "td" else None))


def budget_bar(value: float | None) -> Markup:
    """A small bar of the budget left (empty when spent)."""
    if value is None:
        return esc("")
    width = max(0.0, min(1.0, value)) * 100
    css = "bar spent" if value <= 0 else ("bar low" if value < 0.25 else "bar")
    return el("span", el("span", style=f"width:{width:.0f}%"), class_=css, title=f"{fmt_budget(value)} left")


CARRIED_OUT = ("applied", "held")
"""Decision outcomes shown as the action alone; any other (failed, standby, advisory, interrupted) is named."""


def outcome_badge(decision: Mapping[str, Any], text: str = "{}", *, titled: bool = False) -> Markup | None:
    """The outcome of a decision that did not take effect as shown, as a badge (``text`` formats it; ``titled``:
    what the actuator said as its tooltip), so a scale a standby only logged never reads as one applied."""
    outcome = decision.get("outcome")
    if outcome is None or outcome in CARRIED_OUT:
        return None
    said = str(decision.get("actuation") or "")
    return el("span", text.format(outcome), class_="badge page" if outcome == "failed" else "badge off",
              title=(said or None) if titled else None)
