"""SVG charts: thinning keeps extremes and the last point; drawn points map back to their values."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.api.page.svg import (
    HEIGHT,
    Heatmap,
    HLine,
    Series,
    changes,
    decimate,
    heatmap,
    mark_gaps,
    nice_ticks,
    time_chart,
)


@given(st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6)), min_size=1, max_size=3000))
def test_decimate_keeps_each_extreme_and_the_last_point(values: list[float | None]) -> None:
    points = [(float(i), v) for i, v in enumerate(values)]
    thin = decimate(points, columns=50)
    assert len(thin) <= max(len(points), 2 * 50 + 1)
    assert thin[-1] == points[-1]
    assert [p[0] for p in thin] == sorted(p[0] for p in thin)
    real = [v for v in values if v is not None]
    kept = [v for _, v in thin if v is not None]
    if real:
        assert max(kept) == max(real) and min(kept) == min(real)


def test_changes_keeps_steps_and_breaks_at_gaps() -> None:
    points = [(0.0, 1.0), (15.0, 1.0), (30.0, 2.0), (45.0, 2.0), (500.0, 2.0), (515.0, 3.0)]
    assert changes(points, gap_s=60.0) == [(0.0, 1.0), (30.0, 2.0), (45.0, 2.0), (45.0, None), (500.0, 2.0),
                                           (515.0, 3.0)]
    assert changes([(0.0, 1.0), (15.0, 1.0)]) == [(0.0, 1.0), (15.0, 1.0)]


def test_gaps_break_lines_even_after_thinning() -> None:
    points = [(float(t), 1.0) for t in range(0, 3000, 15)] + [(float(t), 2.0) for t in range(6000, 9000, 15)]
    marked = mark_gaps(points, gap_s=50.0)
    assert marked[len(points) // 2] == (2985.0, None) and len(marked) == len(points) + 1
    svg = time_chart("c", t0=0.0, t1=9000.0, series=[Series("s", "s", points, "#000", gap_s=50.0)])
    path = re.search(r'<path d="([^"]+)"', svg)
    assert path is not None and path.group(1).count("M") == 2  # one break, not one per thinned column


def test_nice_ticks() -> None:
    assert nice_ticks(0.0, 10.0) == [0.0, 5.0, 10.0]
    assert nice_ticks(0.95, 1.0) == pytest.approx([0.96, 0.98, 1.0])
    assert nice_ticks(3.0, 3.0) == [3.0]


def _point(d: str) -> tuple[float, float]:
    x, y = re.findall(r"([-\d.]+)[ ,]([-\d.]+)$", re.sub(r"[HV]", " ", d).strip())[-1]
    return float(x), float(y)


def test_a_drawn_point_maps_back_to_its_value() -> None:
    points = [(1000.0 + 15 * i, 0.99 + 0.0001 * (i % 7)) for i in range(400)]
    svg = time_chart("c", t0=1000.0, t1=1000.0 + 15 * 399, series=[Series("s", "s", points, "#000")],
                     hlines=[HLine(0.99, "objective")], y_min=0.98, y_max=1.0)
    attrs = dict(re.findall(r'data-([a-z0-9-]+)="([^"]*)"', svg.split("<path", 1)[0]))
    left, top, width, height = (float(v) for v in attrs["plot"].split(","))
    d = re.search(r'<path d="([^"]+)"[^>]*data-series="s"', svg)
    assert d is not None
    x, y = _point(d.group(1))
    y0, y1 = float(attrs["y0"]), float(attrs["y1"])
    assert y0 + (1 - (y - top) / height) * (y1 - y0) == pytest.approx(points[-1][1], abs=(y1 - y0) / height)
    assert x == pytest.approx(left + width, abs=0.1)
    assert 'data-ref="0.99"' in svg and height + top < HEIGHT


def test_heatmap_merges_runs_and_marks_missing_cells() -> None:
    chart = Heatmap("h", ["L0", "L1"], [0.0, 10.0, 20.0], [[0.1, 0.1, None], [0.0, 0.3, 0.3]], vmax=0.15, step_s=10.0)
    svg = heatmap(chart, t0=0.0, t1=30.0)
    assert svg.count("<rect") == 2 + 2 + 1  # two runs per row, and the frame
    assert "no data" in svg and 'data-rows="2"' in svg
