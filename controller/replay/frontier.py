"""Pareto frontiers of replica-hours against SLO violations, and their values at fixed attainments.

Each policy run over its knob gives points (attainment, replica-hours).  Its frontier
keeps the points no other point of the same policy beats on both.  Comparing
policies at *equal attainment* means reading each frontier at the same attainment:
between two frontier points, replica-hours are interpolated linearly in the
logarithm of the violation rate (``1 - attainment``), the axis the frontiers are
drawn on, where they are close to straight.

At an attainment below the policy's cheapest point, the cheapest point's
replica-hours are an *upper bound* (``kind="at_most"``: it would need at most that);
above its best point the attainment is ``unreachable`` for that policy's knob range.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["AtAttainment", "Point", "at_attainment", "compare_at", "pareto"]

MIN_VIOLATION = 1e-7
"""Violation rates are floored here before taking logarithms (a perfect run is 1e-7, not 0)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    label: str
    attainment: float
    replica_hours: float

    @property
    def violation(self) -> float:
        return max(1.0 - self.attainment, MIN_VIOLATION)


@dataclass(frozen=True, kw_only=True, slots=True)
class AtAttainment:
    attainment: float
    replica_hours: float | None
    kind: Literal["interpolated", "at_most", "unreachable"]
    between: tuple[str, ...] = ()
    """Labels of the frontier points it was read from."""

    def as_dict(self) -> dict[str, object]:
        return {
            "replica_hours": None if self.replica_hours is None else round(self.replica_hours, 3),
            "kind": self.kind,
            "from": list(self.between),
        }


def pareto(points: Sequence[Point]) -> list[Point]:
    """The points no other beats (fewer or equal replica-hours and higher attainment), cheapest first."""
    finite = [p for p in points if math.isfinite(p.attainment) and math.isfinite(p.replica_hours)]
    ordered = sorted(finite, key=lambda p: (p.replica_hours, -p.attainment))
    frontier: list[Point] = []
    for point in ordered:
        if not frontier or point.attainment > frontier[-1].attainment:
            frontier.append(point)
    return frontier


def at_attainment(frontier: Sequence[Point], attainment: float) -> AtAttainment:
    """Replica-hours the frontier needs to reach ``attainment``."""
    if not frontier:
        return AtAttainment(attainment=attainment, replica_hours=None, kind="unreachable")
    cheapest, best = frontier[0], frontier[-1]
    if attainment <= cheapest.attainment:
        return AtAttainment(
            attainment=attainment, replica_hours=cheapest.replica_hours, kind="at_most", between=(cheapest.label,)
        )
    if attainment > best.attainment:
        return AtAttainment(attainment=attainment, replica_hours=None, kind="unreachable")
    target = math.log10(max(1.0 - attainment, MIN_VIOLATION))
    for low, high in itertools.pairwise(frontier):
        if low.attainment < attainment <= high.attainment:
            x0, x1 = math.log10(low.violation), math.log10(high.violation)
            share = 1.0 if x0 == x1 else (target - x0) / (x1 - x0)
            hours = low.replica_hours + share * (high.replica_hours - low.replica_hours)
            return AtAttainment(
                attainment=attainment, replica_hours=hours, kind="interpolated", between=(low.label, high.label)
            )
    raise AssertionError("unreachable: the frontier brackets the attainment")


def _ratio_kind(mine: AtAttainment, best: AtAttainment, *, another_bound: bool) -> str | None:
    """What ours over the best baseline's value is: ``exact``, a bound, or None (bounded neither way).

    ``another_bound``: another baseline's true need may lie under the best's (its value is only an upper
    bound, or its grid stops short of the level at a cheaper point), and ours over the truly best baseline
    is then at least the ratio read.  Where the best
    baseline's value is itself only an upper bound, the truly best baseline needs at most that: ours
    interpolated over it is at least the ratio read; ours an upper bound too is bounded neither way.
    """
    if mine.kind == "interpolated" and best.kind == "at_most":
        return "at_least"
    if best.kind == "interpolated" and mine.kind == "interpolated":
        return "at_least" if another_bound else "exact"
    if mine.kind == "at_most" and best.kind == "interpolated":
        return None if another_bound else "at_most"
    return None


def _may_need_less(frontier: Sequence[Point], value: AtAttainment, hours: float) -> bool:
    """Whether a baseline's true need at the attainment may lie under ``hours``, those the best baseline's reads.

    An upper bound may; so may an ``unreachable`` reading whose best point costs less: one more step of its
    knob, never run, may reach the level for less than ``hours``.
    """
    if value.kind == "at_most":
        return True
    return value.kind == "unreachable" and bool(frontier) and frontier[-1].replica_hours < hours


def compare_at(
    frontiers: Mapping[str, Sequence[Point]],
    attainment: float,
    *,
    ours: str,
    baselines: Sequence[str],
) -> dict[str, object]:
    """Each policy's replica-hours at ``attainment``, and ours over the best baseline's.

    The ratio is ``exact`` when both values are interpolated and no other baseline's is a bound;
    ``at_least`` when ours is interpolated and the best baseline's value is an upper bound, or both are
    interpolated but another baseline's is an upper bound or unreachable from a best point that costs less than
    the best's value (either may truly need less than the best's value);
    ``at_most`` when ours is an upper bound and the baseline's is not (we need at most that);
    ``ours_unreachable`` (no ratio) when a baseline reaches the attainment and ours does not; None when no
    baseline reaches it, or ours is an upper bound and some baseline's need may lie under the best's value (a
    baseline setting, untried, may reach it for less).
    """
    values = {name: at_attainment(frontier, attainment) for name, frontier in frontiers.items()}
    candidates = {
        name: v for name, v in values.items() if name in baselines and v.replica_hours is not None
    }
    entry: dict[str, object] = {"policies": {name: v.as_dict() for name, v in values.items()}}
    if not candidates or ours not in values:
        entry.update({"best_baseline": None, "ratio_to_best_baseline": None, "ratio_kind": None})
        return entry
    best_name = min(candidates, key=lambda n: candidates[n].replica_hours or math.inf)
    if values[ours].replica_hours is None:  # a baseline reaches what ours' knob range does not
        entry.update({"best_baseline": best_name, "ratio_to_best_baseline": None, "ratio_kind": "ours_unreachable"})
        return entry
    best = candidates[best_name]
    mine = values[ours]
    assert best.replica_hours is not None and mine.replica_hours is not None
    another_bound = any(
        _may_need_less(frontiers[name], values[name], best.replica_hours)
        for name in values
        if name in baselines and name != best_name
    )
    kind = _ratio_kind(mine, best, another_bound=another_bound)
    ratio = mine.replica_hours / best.replica_hours if kind is not None and best.replica_hours > 0 else None
    entry.update(
        {
            "best_baseline": best_name,
            "ratio_to_best_baseline": None if ratio is None else round(ratio, 8),
            "ratio_kind": kind,
        }
    )
    return entry
