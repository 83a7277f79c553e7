"""Benchmark, out of sample: placements scored on expert-load files they were not planned from.

Leave-one-out: for each file, ours plans on the other files as windows
(:func:`controller.rebalance.history.plan_over_windows`) and DeepSeek's EPLB on
their sum (what vLLM's EPLB does with its window); both are scored on the file
left out, same ranks and slots.  Two more rows show where the gain comes from:
ours on the summed window (one window, today's planner) and EPLB on the mean of
the files' shares (each file weighing the same, as in ours).  Ordered pairs:
each planner on one file alone, scored on every other file.  Plan times are
wall-clock and CPU, the median of ``repeat`` runs of each planner; ours and
EPLB alternate, plan by plan.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.rebalance import BenchConfig, configs_for, eplb_plan, load_files, run_benchmark, timed_alternating
from controller.rebalance import plan_rebalance
from controller.rebalance.history import plan_over_windows
from controller.rebalance.out_of_sample import PlacementScore, score_placement
from controller.rebalance.packing import FloatArray, IntArray

GOAL_RATIO = 0.95
"""Out of sample, our layer-average max/mean must be at most this fraction of EPLB's on every file."""


def _ours(windows: Sequence[FloatArray], config: BenchConfig) -> IntArray:
    return plan_over_windows(
        windows, num_ranks=config.num_ranks, slots_per_rank=config.slots_per_rank,
        num_nodes=config.num_nodes, num_groups=config.num_groups,
    ).placement.phy2log


def _ours_one(load: FloatArray, config: BenchConfig) -> IntArray:
    return plan_rebalance(
        load, num_ranks=config.num_ranks, slots_per_rank=config.slots_per_rank,
        num_nodes=config.num_nodes, num_groups=config.num_groups,
    ).placement.phy2log


def _shares(load: FloatArray) -> FloatArray:
    totals = load.sum(axis=1, keepdims=True)
    out: FloatArray = np.divide(load, totals, out=np.zeros_like(load), where=totals > 0)
    return out


def _entry(score: PlacementScore, wall_ms: float | None = None, cpu_ms: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = score.to_json()
    if wall_ms is not None:
        out.update(plan_ms=wall_ms, plan_cpu_ms=cpu_ms)
    return out


def leave_one_out(loads: dict[str, FloatArray], config: BenchConfig, repeat: int) -> dict[str, Any]:
    """Every file held out in turn; ours on the others as windows, EPLB on their sum."""
    per_file: dict[str, dict[str, Any]] = {}
    for name, held in loads.items():
        others = [load for other, load in loads.items() if other != name]
        summed = np.sum(others, axis=0)
        # Both planners the same number of times, alternating, both reported at their median.
        times = timed_alternating({"ours": lambda: _ours(others, config),  # noqa: B023
                                   "eplb": lambda: eplb_plan(summed, config)},  # noqa: B023
                                  repeat, statistics.median)  # fmt: skip
        (ours, ours_ms, ours_cpu), (eplb, eplb_ms, eplb_cpu) = times["ours"], times["eplb"]
        one = _ours_one(summed, config)
        eplb_shares = eplb_plan(np.mean([_shares(load) for load in others], axis=0), config)
        row: dict[str, Any] = {
            "ours": _entry(score_placement(ours, held, config.num_ranks), ours_ms, ours_cpu),
            "eplb_summed": _entry(score_placement(eplb, held, config.num_ranks), eplb_ms, eplb_cpu),
            "ours_summed_one_window": _entry(score_placement(one, held, config.num_ranks)),
            "eplb_mean_of_shares": _entry(score_placement(eplb_shares, held, config.num_ranks)),
        }
        row["ratio_avg_ours_over_eplb"] = row["ours"]["max_over_mean_avg"] / row["eplb_summed"]["max_over_mean_avg"]
        row["worst_layer_at_or_below_eplb"] = (
            row["ours"]["max_over_mean_worst"] <= row["eplb_summed"]["max_over_mean_worst"] + 1e-12
        )
        row["plan_time_ratio"] = ours_ms / eplb_ms
        row["plan_cpu_time_ratio"] = ours_cpu / eplb_cpu
        per_file[name] = row
    return {"per_file": per_file, "summary": _summary(per_file)}


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _summary(per_file: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows = list(per_file.values())
    ratios = [r["ratio_avg_ours_over_eplb"] for r in rows]
    return {
        "ratio_avg_ours_over_eplb": _spread(ratios),
        "ours_max_over_mean_avg": _spread([r["ours"]["max_over_mean_avg"] for r in rows]),
        "eplb_max_over_mean_avg": _spread([r["eplb_summed"]["max_over_mean_avg"] for r in rows]),
        "ours_plan_ms": _spread([r["ours"]["plan_ms"] for r in rows]),
        "ours_plan_cpu_ms": _spread([r["ours"]["plan_cpu_ms"] for r in rows]),
        "eplb_plan_ms": _spread([r["eplb_summed"]["plan_ms"] for r in rows]),
        "eplb_plan_cpu_ms": _spread([r["eplb_summed"]["plan_cpu_ms"] for r in rows]),
        "goals": {
            f"avg_at_most_{GOAL_RATIO}_of_eplb_every_file": max(ratios) <= GOAL_RATIO,
            "files_meeting_avg_goal": sum(r <= GOAL_RATIO for r in ratios),
            "worst_layer_at_or_below_eplb_every_file": all(r["worst_layer_at_or_below_eplb"] for r in rows),
            "plan_time_at_most_tenth_of_eplb_every_file": max(r["plan_time_ratio"] for r in rows) <= 0.1,
            "plan_cpu_time_at_most_tenth_of_eplb_every_file": max(r["plan_cpu_time_ratio"] for r in rows) <= 0.1,
        },
    }


def ordered_pairs(loads: dict[str, FloatArray], config: BenchConfig) -> dict[str, Any]:
    """Each planner on one file alone, scored on every other file."""
    plans = {name: (_ours_one(load, config), eplb_plan(load, config)) for name, load in loads.items()}
    pairs: list[dict[str, Any]] = []
    for a, (ours, eplb) in plans.items():
        for b, load in loads.items():
            if a == b:
                continue
            mine, theirs = score_placement(ours, load, config.num_ranks), score_placement(eplb, load, config.num_ranks)
            pairs.append({"plan_on": a, "score_on": b, "ours": mine.to_json(), "eplb": theirs.to_json(),
                          "ratio_avg": mine.max_over_mean_avg / theirs.max_over_mean_avg})
    return {
        "pairs": pairs,
        "summary": {
            "ratio_avg_ours_over_eplb": _spread([p["ratio_avg"] for p in pairs]),
            "ours_max_over_mean_avg": _spread([p["ours"]["max_over_mean_avg"] for p in pairs]),
            "eplb_max_over_mean_avg": _spread([p["eplb"]["max_over_mean_avg"] for p in pairs]),
            "pairs_ours_worst_layer_above_eplb": sum(
                p["ours"]["max_over_mean_worst"] > p["eplb"]["max_over_mean_worst"] + 1e-12 for p in pairs
            ),
        },
    }


def run_out_of_sample(
    loads: dict[str, FloatArray], configs: Sequence[BenchConfig], repeat: int,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """The out-of-sample section of ``moeslo bench rebalance``."""
    if len(loads) < 3:
        return {"skipped": "needs at least three expert-load files"}
    out: dict[str, Any] = {}
    for config in configs:
        progress(f"out of sample: {config.name}, leave-one-out (EPLB is the slow part)")
        loo = leave_one_out(loads, config, repeat)
        progress(f"out of sample: {config.name}, ordered pairs")
        out[config.name] = {"leave_one_out": loo, "ordered_pairs": ordered_pairs(loads, config)}
    return {
        "method": "leave-one-out: ours plans on the other files as windows, EPLB on their sum; pairs: each "
                  "planner on one file, scored on another; max/mean over MoE layers of the scored file",
        "configurations": out,
    }


def run_all(
    folder: Path, *, max_files: int = 0, repeat: int = 3, out_of_sample_only: bool = False,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """``moeslo bench rebalance``: the in-sample and re-plan figures, then the out-of-sample section."""
    if not folder.is_dir() or not any(folder.glob("*.json")):
        return {"skipped": f"no expert-load files in {folder}"}
    if out_of_sample_only:
        result: dict[str, Any] = {"data": str(folder)}
    else:
        result = run_benchmark(folder, max_files=max_files, repeat=repeat, progress=progress)
    loads = load_files(folder, max_files)
    experts = next(iter(loads.values())).shape[1]
    result["out_of_sample"] = run_out_of_sample(loads, configs_for(experts), repeat, progress)
    return result
