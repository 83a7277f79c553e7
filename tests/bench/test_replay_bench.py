"""The replay benchmark's report traces: the shared ones by name, or a trace file of one's own."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench.replay import TRACE_OPTIONS, TRACES, _aggregate, _goals, run, trace_entry
from contracts.errors import ValidationError
from controller.replay.frontier import Point, compare_at


def test_names_and_files_resolve_to_their_replay_options(tmp_path: Path) -> None:
    assert trace_entry("mooncake") == (*TRACES["mooncake"], TRACE_OPTIONS["mooncake"])
    assert trace_entry("conv")[3] == (1800.0, 0.0)
    own = tmp_path / "long.jsonl"
    assert trace_entry(str(own)) == (str(own), "request", 1.0, TRACE_OPTIONS["mooncake"])
    assert trace_entry(str(tmp_path / "hour.csv"))[3] == (1800.0, 0.0)
    with pytest.raises(ValidationError, match="name one of conv, code, mooncake"):
        trace_entry("kimi")
    with pytest.raises(ValidationError, match=r"trace file not found: .*absent\.jsonl"):
        run(week_cases=[], traces=[str(tmp_path / "absent.jsonl")], seeds=[0], data_dir=tmp_path)


def test_a_trace_file_of_ones_own_is_replayed_through_every_policy(tmp_path: Path) -> None:
    rng, at_s, block = random.Random(0), 0.0, 0
    lines = []
    for _ in range(300):  # five minutes at 1 request/s, prompts up to 9K tokens in 512-token blocks
        at_s += rng.expovariate(1.0)
        prompt = rng.choice([800, 3000, 9000])
        blocks = list(range(block, block + prompt // 512))
        block += len(blocks)
        lines.append(json.dumps({"timestamp": int(at_s * 1000), "input_length": prompt,
                                 "output_length": rng.choice([20, 100]), "hash_ids": blocks}))  # fmt: skip
    trace = tmp_path / "own.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    result = run(week_cases=[], traces=[str(trace)], startups=[60.0], errors=[0.2], seeds=[0], workers=1,
                 data_dir=tmp_path / "no-shared-data")  # fmt: skip
    assert "skipped" not in result
    (report,) = result["reports"]
    assert report["trace"] == str(trace) and report["rate_scale"] == 1.0
    policies = {point["policy"] for point in report["runs"][0]["points"]}
    assert {"moeslo", "oracle", "hpa", "dynamo", "static"} <= policies
    scored = [point["scores"]["scored"] for point in report["runs"][0]["points"]]
    assert all(0.0 <= s["attainment_both"] <= 1.0 and s["replica_hours"] > 0 for s in scored)


def _seed(ratio: float | None, kind: str | None) -> dict[str, object]:
    """One seed's scored window, the same reading at every level: ours over HPA, of the kind given."""
    ours = {"replica_hours": None if kind == "ours_unreachable" else 10.0,
            "kind": "unreachable" if kind == "ours_unreachable" else "interpolated"}  # fmt: skip
    level = {"policies": {"moeslo": ours, "hpa": {"replica_hours": 12.0, "kind": "interpolated"}},
             "best_baseline": "hpa", "ratio_to_best_baseline": ratio, "ratio_kind": kind}  # fmt: skip
    return {"windows": {"scored": {"at_attainment": {name: level for name in ("99.5%", "99.8%", "99.9%")}}}}


def _goal(*seeds: dict[str, object]) -> dict[str, object]:
    report = {"trace": "conv", "startup_s": 300.0, "capacity_error": -0.2, "across_seeds": _aggregate(seeds)}
    check = _goals([report])["checks"][0]
    assert isinstance(check, dict)
    return check


def test_a_goal_is_decided_by_every_seed() -> None:
    met = _goal(_seed(0.85, "exact"), _seed(0.8, "exact"), _seed(0.88, "exact"))
    assert met["met"] is True and met["n"] == 3 and met["seeds"] == 3
    # Ours never reaches the level where HPA does: that seed misses, whatever the others say.
    missed = _goal(_seed(0.85, "exact"), _seed(None, "ours_unreachable"), _seed(None, "ours_unreachable"))
    assert missed["met"] is False and missed["n"] == 1 and missed["ours_unreachable"] == 2
    # A seed whose ratio is only a bound leaves the goal undecided, not judged by the other seeds' mean.
    undecided = _goal(_seed(0.85, "exact"), _seed(0.7, "at_least"), _seed(0.8, "at_most"))
    assert undecided["met"] is None and undecided["n"] == 1 and undecided["ratio_mean"] == 0.85
    across = _aggregate([_seed(0.85, "exact"), _seed(0.7, "at_least"), _seed(None, "ours_unreachable")])["99.5%"]
    assert across["ratio_lower_bounds"] == [0.7] and across["ours_unreachable"] == 1
    assert across["ratio_to_best_baseline"]["n"] == 1 and across["unreachable_or_unknown"] == 0


def test_bounds_decide_a_goal_when_every_seed_bounds_the_mean_on_one_side() -> None:
    # Lower bounds and exact ratios whose mean is above 0.9: the true mean is above it too.
    missed = _goal(_seed(0.85, "exact"), _seed(1.2, "at_least"), _seed(1.1, "at_least"))
    assert missed["met"] is False and missed["ratio_lower_bounds"] == [1.2, 1.1]
    # Upper bounds and exact ratios whose mean is within 0.9: the true mean is within it too.
    met = _goal(_seed(0.85, "exact"), _seed(0.8, "at_most"), _seed(0.95, "at_most"))
    assert met["met"] is True and met["ratio_upper_bounds"] == [0.8, 0.95]
    # A bound on the wrong side decides nothing.
    assert _goal(_seed(0.85, "exact"), _seed(0.8, "at_least"))["met"] is None
    assert _goal(_seed(0.85, "exact"), _seed(1.0, "at_most"))["met"] is None
    # Seeds with no ratio leave it undecided, whatever the others' bounds.
    assert _goal(_seed(1.2, "at_least"), _seed(None, None))["met"] is None


def test_seeds_where_ours_and_the_best_baseline_are_both_upper_bounds_list_no_bound() -> None:
    def front(name: str, *pairs: tuple[float, float]) -> list[Point]:
        return [Point(label=f"{name}{i}", attainment=a, replica_hours=h) for i, (a, h) in enumerate(pairs)]

    fronts = {"moeslo": front("m", (0.999, 8.0)), "static": front("s", (0.999, 10.0)),
              "hpa": front("h", (0.90, 3.0), (0.98, 5.0))}  # fmt: skip
    level = compare_at(fronts, 0.995, ours="moeslo", baselines=("static", "hpa"))
    seed = {"windows": {"scored": {"at_attainment": {name: level for name in ("99.5%", "99.8%", "99.9%")}}}}
    across = _aggregate([seed, seed])["99.5%"]
    assert across["ratio_upper_bounds"] == [] and across["unreachable_or_unknown"] == 2


def test_a_goal_is_judged_on_the_ratios_before_they_are_rounded_for_display() -> None:
    """Three seeds over the 0.9 bound, each by under a ten-thousandth: rounded to 4 digits their mean read 0.9, met."""
    check = _goal(_seed(0.90004, "exact"), _seed(0.90004, "exact"), _seed(0.90004, "exact"))
    assert check["met"] is False
