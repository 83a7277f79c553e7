"""Server-rendered SVG charts: lines, steps, bands, markers and a heatmap (no JavaScript).

Each chart is one ``<svg>`` whose root names its scale, so a test (or a reader
of the HTML) can map any drawn point back to its value::

    <svg data-chart="load" data-t0=... data-t1=... data-y0=... data-y1=... data-plot="x,y,w,h">
      <path data-series="actual" data-n="412" data-last-t=... data-last-v=... d="M..."/>

Times are Unix seconds (UTC); long series are thinned to a min and a max per
pixel column, so a spike survives and a day of 15-second ticks draws fast.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from controller.api.page.html import AttrValue, Markup, el, join

__all__ = [
    "Band",
    "HLine",
    "Heatmap",
    "Marker",
    "Series",
    "changes",
    "decimate",
    "heat_legend",
    "heatmap",
    "mark_gaps",
    "nice_ticks",
    "time_chart",
]

Point = tuple[float, float | None]
"""(Unix seconds, value); a None value breaks the line."""

WIDTH, HEIGHT = 880, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 14, 10, 24
_TIME_STEPS_S = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800)


@dataclass(frozen=True, slots=True)
class Series:
    key: str
    """Machine-readable name (``data-series``)."""
    label: str
    points: Sequence[Point]
    color: str
    kind: Literal["line", "step", "points"] = "line"
    dash: bool = False
    gap_s: float | None = None
    """Break the line where two points are further apart than this."""


@dataclass(frozen=True, slots=True)
class Band:
    key: str
    label: str
    lower: Sequence[Point]
    upper: Sequence[Point]
    """Same times as ``lower``."""
    color: str


@dataclass(frozen=True, slots=True)
class HLine:
    value: float
    label: str
    color: str = "#5f6368"


@dataclass(frozen=True, slots=True)
class Marker:
    t: float
    label: str
    """Short text drawn at the top (a glyph such as ``+`` or ``-``)."""
    title: str
    """Tooltip: what happened and why."""
    color: str


@dataclass(frozen=True, slots=True)
class Heatmap:
    key: str
    rows: Sequence[str]
    """Row labels, top to bottom."""
    times: Sequence[float]
    """Column start times (Unix seconds), ascending."""
    values: Sequence[Sequence[float | None]]
    """``values[row][column]``."""
    vmax: float
    """The value drawn darkest (the objective, say); larger values saturate."""
    step_s: float
    label_format: Callable[[float], str] = field(default=lambda v: f"{v:.3f}")


@dataclass(frozen=True, slots=True)
class _Scale:
    t0: float
    t1: float
    y0: float
    y1: float

    def x(self, t: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * (t - self.t0) / ((self.t1 - self.t0) or 1.0)

    def y(self, v: float) -> float:
        frac = (v - self.y0) / ((self.y1 - self.y0) or 1.0)
        return TOP + (HEIGHT - TOP - BOTTOM) * (1.0 - min(1.02, max(-0.02, frac)))


def decimate(points: Sequence[Point], columns: int = (WIDTH - LEFT - RIGHT) // 2) -> list[Point]:
    """At most about two points per column: each column's lowest and highest, in time order; the last
    point always stays (it is what "now" shows).  A column with only gaps keeps one None."""
    if len(points) <= 2 * columns or columns < 1:
        return list(points)
    t0 = points[0][0]
    width = (points[-1][0] - t0) / columns or 1.0
    out: list[Point] = []
    column = -1
    low: Point | None = None
    high: Point | None = None
    gap: Point | None = None
    for point in points:  # one pass, no per-point calls: a day of ticks is thousands of points
        index = int((point[0] - t0) / width)
        if index != column:
            _flush(out, low, high, gap)
            column, low, high, gap = index, None, None, None
        value = point[1]
        if value is None:
            gap = gap or point
        elif low is None or high is None:
            low = high = point
        elif value < (low[1] or 0.0):
            low = point
        elif value > (high[1] or 0.0):
            high = point
    _flush(out, low, high, gap)
    if out[-1] != points[-1]:
        out.append(points[-1])
    return out


def _flush(out: list[Point], low: Point | None, high: Point | None, gap: Point | None) -> None:
    kept = [p for p in (low, high, gap) if p is not None]
    if low is not None and low is high:
        kept = kept[1:]
    out.extend(sorted(kept, key=lambda p: p[0]))


def mark_gaps(points: Sequence[Point], gap_s: float | None) -> list[Point]:
    """``points`` with a None after each point followed by silence longer than ``gap_s`` (the line breaks)."""
    if gap_s is None:
        return list(points)
    out: list[Point] = []
    for point in points:
        if out and point[0] - out[-1][0] > gap_s:
            out.append((out[-1][0], None))
        out.append(point)
    return out


def changes(points: Sequence[Point], gap_s: float | None = None) -> list[Point]:
    """A step series reduced to the points where it changes, plus the last point; a gap longer than
    ``gap_s`` ends the step at its last point and breaks the line (a None)."""
    out: list[Point] = []
    last: Point | None = None
    for point in points:
        if last is not None and gap_s is not None and point[0] - last[0] > gap_s:
            if out[-1] is not last:
                out.append(last)
            out.append((last[0], None))
            out.append(point)
        elif not out or point[1] != out[-1][1]:
            out.append(point)
        last = point
    if last is not None and out[-1] is not last:
        out.append(last)
    return out


def nice_ticks(low: float, high: float, count: int = 4) -> list[float]:
    """Round values (1, 2 or 5 times a power of ten) from ``low`` to ``high``."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low]
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((high - first) / step + 1e-9) + 1)]


def _time_ticks(t0: float, t1: float) -> list[float]:
    span = t1 - t0
    step = next((s for s in _TIME_STEPS_S if span / s <= 7), _TIME_STEPS_S[-1])
    first = math.ceil(t0 / step) * step
    return [first + i * step for i in range(int((t1 - first) // step) + 1)]


def _time_label(t: float, span_s: float) -> str:
    fmt = "%H:%M" if span_s <= 86400 else "%d %b %H:%M"
    return time.strftime(fmt, time.gmtime(t))


def _axes(scale: _Scale, y_format: Callable[[float], str], ticks: Sequence[float]) -> Markup:
    parts = []
    bottom = HEIGHT - BOTTOM
    for v in ticks:
        y = scale.y(v)
        parts.append(el("line", x1=LEFT, x2=WIDTH - RIGHT, y1=f"{y:.1f}", y2=f"{y:.1f}", class_="grid"))
        parts.append(el("text", y_format(v), x=LEFT - 4, y=f"{y + 3:.1f}", class_="ylab"))
    for t in _time_ticks(scale.t0, scale.t1):
        x = scale.x(t)
        parts.append(el("line", x1=f"{x:.1f}", x2=f"{x:.1f}", y1=TOP, y2=bottom, class_="grid"))
        parts.append(el("text", _time_label(t, scale.t1 - scale.t0), x=f"{x:.1f}", y=bottom + 15, class_="xlab"))
    parts.append(el("rect", x=LEFT, y=TOP, width=WIDTH - LEFT - RIGHT, height=bottom - TOP, class_="frame"))
    return join(parts)


def _path_data(series: Series, scale: _Scale, points: Sequence[Point]) -> str:
    out: list[str] = []
    pen_up = True
    last_y = 0.0
    for t, v in points:
        if v is None:
            pen_up = True
        if v is None:
            continue
        x, y = scale.x(t), scale.y(v)
        if pen_up:
            out.append(f"M{x:.1f} {y:.1f}")
            pen_up = False
        elif series.kind == "step":
            out.append(f"H{x:.1f}" if y == last_y else f"H{x:.1f}V{y:.1f}")
        else:
            out.append(f"L{x:.1f} {y:.1f}")
        last_y = y
    return "".join(out)


def _series(series: Series, scale: _Scale) -> Markup:
    if series.kind == "line":
        points = decimate(mark_gaps(series.points, series.gap_s))
    elif series.kind == "step":
        points = changes(series.points, series.gap_s)
    else:
        points = list(series.points)
    valued = [p for p in series.points if p[1] is not None]
    last = valued[-1] if valued else None
    common: dict[str, AttrValue] = {
        "data_series": series.key, "data_n": len(valued),
        "data_last_t": None if last is None else f"{last[0]:.3f}",
        "data_last_v": None if last is None else repr(last[1]),
    }
    if series.kind == "points":
        dots = [el("circle", cx=f"{scale.x(t):.1f}", cy=f"{scale.y(v):.1f}", r=3, fill=series.color)
                for t, v in points if v is not None]
        return el("g", dots, **common)
    dash = "5 4" if series.dash else None
    return el("path", d=_path_data(series, scale, points), fill="none", stroke=series.color,
              stroke_width=1.6, stroke_dasharray=dash, **common)


def _band(band: Band, scale: _Scale) -> Markup:
    upper: list[Point] = [(t, v) for t, v in band.upper if v is not None]
    lower: list[Point] = [(t, v) for t, v in band.lower if v is not None]
    if not upper or not lower:
        return Markup("")
    ring = [f"{scale.x(t):.1f},{scale.y(v):.1f}" for t, v in decimate(upper) if v is not None]
    ring += [f"{scale.x(t):.1f},{scale.y(v):.1f}" for t, v in reversed(decimate(lower)) if v is not None]
    return el("polygon", points=" ".join(ring), fill=band.color, fill_opacity=0.22, stroke="none",
              data_series=band.key, data_n=len(upper))


def _marker(marker: Marker, scale: _Scale) -> Markup:
    x = scale.x(marker.t)
    return el(
        "g",
        el("title", marker.title),
        el("line", x1=f"{x:.1f}", x2=f"{x:.1f}", y1=TOP, y2=HEIGHT - BOTTOM, stroke=marker.color,
           stroke_opacity=0.55, stroke_width=1),
        el("text", marker.label, x=f"{x:.1f}", y=TOP + 9, fill=marker.color, class_="mark"),
        class_="marker", data_t=f"{marker.t:.3f}",
    )


def _y_range(
    series: Sequence[Series], bands: Sequence[Band], hlines: Sequence[HLine], y_min: float | None, y_max: float | None
) -> tuple[float, float]:
    values = [v for s in series for _, v in s.points if v is not None]
    values += [v for b in bands for pts in (b.lower, b.upper) for _, v in pts if v is not None]
    values += [h.value for h in hlines]
    low = y_min if y_min is not None else (min(values) if values else 0.0)
    high = y_max if y_max is not None else (max(values) if values else 1.0)
    if high <= low:
        high = low + (abs(low) * 0.1 or 1.0)
    if y_max is None:
        high += (high - low) * 0.08
    return low, high


def time_chart(
    key: str,
    *,
    t0: float,
    t1: float,
    series: Sequence[Series] = (),
    bands: Sequence[Band] = (),
    markers: Sequence[Marker] = (),
    hlines: Sequence[HLine] = (),
    y_min: float | None = None,
    y_max: float | None = None,
    y_format: Callable[[float], str] = lambda v: f"{v:g}",
    label: str = "",
) -> Markup:
    """One time chart: bands under series, reference lines, then decision markers on top."""
    low, high = _y_range(series, bands, hlines, y_min, y_max)
    scale = _Scale(t0, t1, low, high)
    ticks = [v for v in nice_ticks(low, high) if low <= v <= high]
    refs = []
    for h in hlines:
        y = scale.y(h.value)
        refs.append(el("line", x1=LEFT, x2=WIDTH - RIGHT, y1=f"{y:.1f}", y2=f"{y:.1f}", stroke=h.color,
                       stroke_dasharray="2 3", stroke_width=1.2, data_ref=repr(h.value)))
        refs.append(el("text", h.label, x=WIDTH - RIGHT - 4, y=f"{y - 3:.1f}", fill=h.color, class_="reflab"))
    plot = f"{LEFT},{TOP},{WIDTH - LEFT - RIGHT},{HEIGHT - TOP - BOTTOM}"
    return el(
        "svg",
        el("title", label) if label else None,
        _axes(scale, y_format, ticks),
        [_band(b, scale) for b in bands],
        refs,
        [_series(s, scale) for s in series],
        [_marker(m, scale) for m in markers],
        viewBox=f"0 0 {WIDTH} {HEIGHT}", class_="chart", role="img", aria_label=label or key,
        data_chart=key, data_t0=f"{t0:.3f}", data_t1=f"{t1:.3f}", data_y0=repr(low), data_y1=repr(high),
        data_plot=plot, xmlns="http://www.w3.org/2000/svg",
    )


def heat_legend(vmax: float, label_format: Callable[[float], str] = lambda v: f"{v:g}") -> list[tuple[str, str]]:
    """(label, colour) swatches of the heatmap's scale."""
    return [(("≥ " if f == 1.0 else "") + label_format(vmax * f), _heat_color(vmax * f, vmax))
            for f in (0.0, 0.25, 0.5, 0.75, 1.0)]


def _heat_color(value: float, vmax: float) -> str:
    """White-ish at 0, amber at half the objective, red at or above it (12 levels, so runs merge)."""
    frac = min(1.0, max(0.0, value / vmax if vmax > 0 else 0.0))
    level = round(frac * 11) / 11
    if level < 0.5:
        r, g, b = 255, round(247 - 60 * level * 2), round(230 - 180 * level * 2)
    else:
        r, g, b = round(255 - 40 * (level - 0.5) * 2), round(187 - 150 * (level - 0.5) * 2), 50
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(chart: Heatmap, *, t0: float, t1: float, label: str = "") -> Markup:
    """Rows (layers) by time; runs of equal colour in a row are drawn as one rectangle."""
    rows = len(chart.rows)
    height = max(60, min(14 * rows, 420)) + TOP + BOTTOM
    scale = _Scale(t0, t1, 0.0, 1.0)
    row_h = (height - TOP - BOTTOM) / max(1, rows)
    every = max(1, math.ceil(rows / 16))
    cells: list[Markup] = []
    for r, (name, values) in enumerate(zip(chart.rows, chart.values, strict=True)):
        y = TOP + r * row_h
        if r % every == 0:
            cells.append(el("text", name, x=LEFT - 4, y=f"{y + row_h * 0.75:.1f}", class_="ylab"))
        cells.extend(_heat_runs(chart, values, scale, y, row_h))
    bottom = height - BOTTOM
    axis = [el("text", _time_label(t, t1 - t0), x=f"{scale.x(t):.1f}", y=bottom + 15, class_="xlab")
            for t in _time_ticks(t0, t1)]
    return el(
        "svg", el("title", label) if label else None, cells, axis,
        el("rect", x=LEFT, y=TOP, width=WIDTH - LEFT - RIGHT, height=bottom - TOP, class_="frame"),
        viewBox=f"0 0 {WIDTH} {height}", class_="chart heat", role="img", aria_label=label or chart.key,
        data_chart=chart.key, data_rows=rows, data_columns=len(chart.times), xmlns="http://www.w3.org/2000/svg",
    )


def _heat_runs(chart: Heatmap, values: Sequence[float | None], scale: _Scale, y: float, row_h: float) -> list[Markup]:
    out: list[Markup] = []
    run_start: int | None = None
    run_color = ""
    colors = ["#eeeeee" if v is None else _heat_color(v, chart.vmax) for v in values]
    for i in range(len(values) + 1):
        color = colors[i] if i < len(values) else ""
        if run_start is not None and color != run_color:
            x0 = scale.x(chart.times[run_start])
            x1 = scale.x(chart.times[i - 1] + chart.step_s)
            peak = max((v for v in values[run_start:i] if v is not None), default=None)
            tip = "no data" if peak is None else f"max {chart.label_format(peak)}"
            out.append(el("rect", el("title", tip), x=f"{x0:.1f}", y=f"{y:.1f}", width=f"{max(0.5, x1 - x0):.1f}",
                          height=f"{row_h:.1f}", fill=run_color))
            run_start = None
        if run_start is None and color:
            run_start, run_color = i, color
    return out
