"""The vLLM benchmarks' pure parts: the overhead's pair loop and statistics, the EPLB benchmark's figures."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.vllm_eplb import check_plan, figures, initial_map, ratios, run_vllm_eplb_bench, summarize
from bench.vllm_overhead import OverheadOptions, median_ci95, ratio_stats, run_pairs, tree_cpu_s


def test_median_ci_is_order_statistics() -> None:
    assert median_ci95([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)  # few values: min and max
    med, low, high = median_ci95([float(x) for x in range(100)])
    assert med == 49.5 and (low, high) == (39.0, 60.0)  # ranks 40 and 61 of 100, the exact binomial ones
    # n = 10: ranks 2 and 9 (P(B <= 1) = 11/1024 <= 2.5 %; P(B <= 2) = 56/1024 is not).
    assert median_ci95([float(x) for x in range(10)])[1:] == (1.0, 8.0)
    stats = ratio_stats([0.99, 1.0, 1.01] * 10)
    assert stats["median"] == 1.0 and stats["spread_pct"] == pytest.approx(1.0) and stats["overhead_pct"] == 0.0


@pytest.mark.parametrize("n", [6, 7, 10, 15, 20, 30, 50, 51, 100, 200, 201])
def test_median_ci_covers_the_median_at_least_95_percent(n: int) -> None:
    _, low, high = median_ci95([float(x) for x in range(n)])
    # [x_low, x_high] (0-based) holds the median iff low < B <= high, B ~ Binomial(n, 1/2) values below it.
    coverage = sum(math.comb(n, b) for b in range(int(low) + 1, int(high) + 1)) / 2**n
    assert coverage >= 0.95
    wider = sum(math.comb(n, b) for b in range(int(low) + 2, int(high))) / 2**n
    assert wider < 0.95  # and no narrower interval of order statistics would do


def test_pairs_alternate_and_stop_once_a_ratio_is_resolved() -> None:
    rng = np.random.default_rng(0)
    calls: list[str] = []

    def run_round(name: str, seed: int) -> dict[str, Any]:
        calls.append(name)
        noise = float(rng.normal(1.0, 0.2))  # wall clock: very noisy; CPU per token: steady
        return {"output_tokens_per_s": 100.0 * noise, "cpu_s_per_token": 0.010 * (1.002 if name == "on" else 1.0)}

    out = run_pairs(run_round, OverheadOptions(min_pairs=6, max_pairs=50))
    assert calls[:4] == ["off", "on", "on", "off"]  # ABBA
    assert out["stopped"] == "resolved" and out["resolved_by"] == ["cpu_s_per_token"]
    assert len(out["pairs"]) == 6 and out["overhead_pct"]["cpu_s_per_token"] == pytest.approx(0.2)
    budget = run_pairs(run_round, OverheadOptions(min_pairs=100, max_pairs=3))
    assert budget["stopped"] == "max_pairs" and len(budget["pairs"]) == 3


def test_tree_cpu_counts_this_process() -> None:
    assert tree_cpu_s(os.getpid()) > 0
    assert tree_cpu_s(2**22 + 12345) == 0.0  # no such process


def test_eplb_bench_figures_and_skips(tmp_path: Path) -> None:
    load = np.array([[8.0, 4.0, 2.0, 2.0]])
    p2l = initial_map(1, 4, 6)
    assert p2l.tolist() == [[0, 1, 2, 3, 0, 1]]
    check_plan(p2l, 1, 4, 6)
    with pytest.raises(AssertionError, match="without a replica"):
        check_plan(np.zeros((1, 6), dtype=np.int64), 1, 4, 6)
    f = figures(p2l, load, 2)  # rank 0: 4 + 2 + 2 = 8, rank 1: 2 + 4 + 2 = 8
    assert f["max_over_mean_avg"] == 1.0 and f["cv_avg"] == 0.0
    assert "skipped" in run_vllm_eplb_bench(tmp_path)


def _side(moves: int, plan_ms: float) -> dict[str, float]:
    return {"max_over_mean_avg": 1.0, "max_over_mean_worst": 1.1, "plan_ms": plan_ms, "plan_cpu_ms": plan_ms,
            "moves": moves}  # fmt: skip


@pytest.mark.parametrize("zero_first", [True, False])
def test_eplb_summary_keeps_files_where_vllm_moved_nothing(zero_first: bool) -> None:
    rows = {}
    for name, theirs_moves in zip(("a", "b"), (0, 10) if zero_first else (10, 0), strict=True):
        row: dict[str, Any] = {"moeslo": _side(5, 1.0), "vllm_default": _side(theirs_moves, 20.0)}
        row["ratios_moeslo_over_vllm_default"] = ratios(row["moeslo"], row["vllm_default"])
        rows[name] = row
    assert rows["a" if zero_first else "b"]["ratios_moeslo_over_vllm_default"]["moves"] is None  # 5 / 0
    out = summarize(rows)
    assert out["moves_ratio_range"] == [0.5, 0.5] and out["moves_ratio_undefined_files"] == 1
    assert out["moves_moeslo_range"] == [5, 5] and out["moves_vllm_default_range"] == [0, 10]
    assert out["plan_ms_ratio_range"] == [0.05, 0.05]
    assert out["goals"]["plan_time_at_most_tenth_of_vllm_default_every_file"]
