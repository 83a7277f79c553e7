"""Pareto frontiers and their values at fixed attainments, on hand-made curves."""

from __future__ import annotations

import math

import pytest

from controller.replay.frontier import Point, at_attainment, compare_at, pareto


def curve(name: str, *pairs: tuple[float, float]) -> list[Point]:
    return [Point(label=f"{name}{i}", attainment=a, replica_hours=h) for i, (a, h) in enumerate(pairs)]


def test_pareto_drops_dominated_points() -> None:
    points = curve("p", (0.99, 100.0), (0.995, 120.0), (0.993, 130.0), (0.999, 200.0), (0.98, 110.0))
    assert [p.label for p in pareto(points)] == ["p0", "p1", "p3"]


def test_interpolation_is_linear_in_log_violation() -> None:
    # Violations 1e-2 and 1e-3: 99.68377 % (violation 10**-2.5) lies half way in log space.
    front = pareto(curve("p", (0.99, 100.0), (0.999, 200.0)))
    middle = at_attainment(front, 1 - 10**-2.5)
    assert middle.kind == "interpolated"
    assert middle.replica_hours == pytest.approx(150.0)
    assert middle.between == ("p0", "p1")
    assert at_attainment(front, 0.999).replica_hours == pytest.approx(200.0)
    # 99.5 %: log10(0.005) = -2.301 -> 30.1 % of the way.
    assert at_attainment(front, 0.995).replica_hours == pytest.approx(100.0 - 100.0 * (math.log10(0.005) + 2))


def test_outside_the_knob_range() -> None:
    front = pareto(curve("p", (0.996, 100.0), (0.998, 150.0)))
    below = at_attainment(front, 0.995)
    assert below.kind == "at_most" and below.replica_hours == 100.0
    above = at_attainment(front, 0.999)
    assert above.kind == "unreachable" and above.replica_hours is None


def test_compare_at_equal_attainment() -> None:
    fronts = {
        "moeslo": pareto(curve("m", (0.99, 90.0), (0.999, 180.0))),
        "hpa": pareto(curve("h", (0.99, 100.0), (0.999, 200.0))),
        "static": pareto(curve("s", (0.99, 300.0), (0.999, 400.0))),
        "oracle": pareto(curve("o", (0.99, 10.0), (0.999, 20.0))),
    }
    entry = compare_at(fronts, 1 - 10**-2.5, ours="moeslo", baselines=("hpa", "static"))
    assert entry["best_baseline"] == "hpa"  # the oracle is not a baseline
    assert entry["ratio_to_best_baseline"] == pytest.approx(135.0 / 150.0, abs=1e-4)
    assert entry["ratio_kind"] == "exact"
    unreachable = compare_at(fronts, 0.9995, ours="moeslo", baselines=("hpa", "static"))
    assert unreachable["ratio_to_best_baseline"] is None


def test_a_ratio_is_a_lower_bound_when_another_baseline_is_only_an_upper_bound() -> None:
    # Static's every point passes 99.5 %: it needs at most 50 h there, perhaps far less than HPA's 37 h.
    fronts = {
        "static": pareto(curve("s", (0.9990, 50.0), (0.9995, 60.0))),
        "hpa": pareto(curve("h", (0.990, 30.0), (0.999, 45.0))),
        "moeslo": pareto(curve("m", (0.990, 30.0), (0.999, 40.0))),
    }
    entry = compare_at(fronts, 0.995, ours="moeslo", baselines=("static", "hpa"))
    assert entry["best_baseline"] == "hpa"
    assert entry["ratio_kind"] == "at_least"  # ours over the true best baseline is at least this
    assert entry["ratio_to_best_baseline"] is not None and entry["ratio_to_best_baseline"] < 1.0
    # Ours only an upper bound too: the ratio is bounded neither way.
    fronts["moeslo"] = pareto(curve("m", (0.9992, 30.0)))
    assert compare_at(fronts, 0.995, ours="moeslo", baselines=("static", "hpa"))["ratio_kind"] is None
    # Without static the same reading is exact.
    del fronts["static"]
    fronts["moeslo"] = pareto(curve("m", (0.990, 30.0), (0.999, 40.0)))
    assert compare_at(fronts, 0.995, ours="moeslo", baselines=("static", "hpa"))["ratio_kind"] == "exact"


def test_ours_out_of_reach_where_a_baseline_reaches_is_named() -> None:
    fronts = {"moeslo": pareto(curve("m", (0.99, 30.0))), "hpa": pareto(curve("h", (0.99, 30.0), (0.999, 45.0)))}
    entry = compare_at(fronts, 0.995, ours="moeslo", baselines=("hpa",))
    assert entry["ratio_kind"] == "ours_unreachable" and entry["best_baseline"] == "hpa"
    assert entry["ratio_to_best_baseline"] is None
    beyond_all = compare_at(fronts, 0.9995, ours="moeslo", baselines=("hpa",))
    assert beyond_all["ratio_kind"] is None and beyond_all["best_baseline"] is None


def test_no_ratio_when_ours_and_the_best_baseline_are_both_only_upper_bounds() -> None:
    # Static's cheapest point passes 99.5 % at 10 h; a cheaper static fleet, untested, may reach it at 5 h,
    # while ours is read at its cheapest, 8 h: ours over static may be 8 / 5, not at most 8 / 10.
    fronts = {"moeslo": pareto(curve("m", (0.999, 8.0))), "static": pareto(curve("s", (0.999, 10.0))),
              "hpa": pareto(curve("h", (0.90, 3.0), (0.98, 5.0)))}  # fmt: skip
    entry = compare_at(fronts, 0.995, ours="moeslo", baselines=("static", "hpa"))
    assert entry["best_baseline"] == "static"
    assert entry["ratio_kind"] is None and entry["ratio_to_best_baseline"] is None


def test_ours_over_a_best_baseline_that_is_only_an_upper_bound_is_a_lower_bound() -> None:
    # Static's cheapest point passes 99.5 % at 10 h: it needs at most 10 h there, so ours' 11.2 h is at least
    # 1.12 times the truly best baseline's need.
    fronts = {"moeslo": pareto(curve("m", (0.99, 10.0), (0.999, 14.0))),
              "static": pareto(curve("s", (0.997, 10.0), (0.9995, 11.0)))}  # fmt: skip
    entry = compare_at(fronts, 0.995, ours="moeslo", baselines=("static",))
    assert entry["best_baseline"] == "static" and entry["ratio_kind"] == "at_least"
    assert entry["ratio_to_best_baseline"] == pytest.approx((10.0 - 4.0 * (math.log10(0.005) + 2)) / 10.0, abs=1e-4)


def test_a_baseline_stopping_short_of_the_level_below_the_best_ones_cost_bounds_the_ratio() -> None:
    # HPA's best point, 99.49 % at 5 h, stops just short of 99.5 %; one more step may reach it for far less
    # than static's 10 h, so ours over the truly best baseline is at least the ratio read from static.
    fronts = {"moeslo": pareto(curve("m", (0.99, 7.0), (0.999, 9.0))),
              "static": pareto(curve("s", (0.99, 9.0), (0.999, 11.0))),
              "hpa": pareto(curve("h", (0.98, 4.0), (0.9949, 5.0)))}  # fmt: skip
    entry = compare_at(fronts, 0.995, ours="moeslo", baselines=("static", "hpa"))
    assert entry["best_baseline"] == "static" and entry["ratio_kind"] == "at_least"
    assert entry["ratio_to_best_baseline"] is not None and entry["ratio_to_best_baseline"] < 1.0
    # Ours only an upper bound: bounded neither way.
    with_ours_bound = {**fronts, "moeslo": pareto(curve("m", (0.996, 8.0)))}
    assert compare_at(with_ours_bound, 0.995, ours="moeslo", baselines=("static", "hpa"))["ratio_kind"] is None
    # An HPA that stops short at more than static's 10 h needs more than static: the ratio stays exact.
    fronts["hpa"] = pareto(curve("h", (0.98, 4.0), (0.9949, 12.0)))
    assert compare_at(fronts, 0.995, ours="moeslo", baselines=("static", "hpa"))["ratio_kind"] == "exact"
