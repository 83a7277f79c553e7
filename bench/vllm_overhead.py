"""The vLLM plugin's end-to-end overhead: interleaved plugin-on / plugin-off rounds until the ratio is resolved.

Both servers stay up and warm; each pair runs the workload once on each,
in ABBA order (off, on, then on, off, ...) so drift in the machine's load
hits both alike.  Per pair two ratios (on / off):

* ``tokens_per_s``: client-side output tokens per second, wall clock;
* ``cpu_s_per_token``: CPU seconds of the server's whole process tree
  (API server, engine core, workers: ``psutil``) per generated token.  On a
  shared machine this is far less noisy: time spent waiting for a core is
  not in it.

A ratio's *spread* is the half-width of the distribution-free 95 %
confidence interval of its median (order statistics of the pairs'
ratios), in percent of the median.  Pairs run until one figure's spread is
below the target (1 %), or the pair or time budget runs out; the JSON says
which figure resolved the overhead, or that neither did.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

Round = Callable[[str, int], dict[str, Any]]
"""Runs one round on the named server (``off`` or ``on``) with a seed; returns its figures."""


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and all its live descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def median_ci95(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, low, high): the 95 % order-statistic confidence interval of the median (min/max below 6 values)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan
    med = statistics.median(xs)
    if n < 6:
        return med, xs[0], xs[-1]
    k = _lower_index(n)
    return med, xs[k], xs[n - 1 - k]


def _lower_index(n: int) -> int:
    """0-based index of the lower bound: the largest k with P(B <= k) < 2.5 %, B ~ Binomial(n, 1/2).

    [x_k, x_(n-1-k)] misses the median only when k or fewer values lie on one side of it; exact sums,
    as the normal approximation's rank is one too narrow (93.5 % coverage at 50 values)."""
    below, k = 0, -1
    while 40 * (below + math.comb(n, k + 1)) < 2**n:  # P(B <= k + 1) < 1/40, in integers
        below += math.comb(n, k + 1)
        k += 1
    return max(k, 0)


def ratio_stats(ratios: Sequence[float]) -> dict[str, Any]:
    med, low, high = median_ci95(ratios)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [med, med, med]
    return {
        "pairs": len(ratios),
        "median": med,
        "ci95": [low, high],
        "spread_pct": 100.0 * (high - low) / 2 / med if med else math.inf,
        "iqr_pct": 100.0 * (q[2] - q[0]) / med if med else math.inf,
        "overhead_pct": 100.0 * (1.0 - med) if med else math.nan,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class OverheadOptions:
    min_pairs: int = 10
    max_pairs: int = 200
    max_measure_s: float = 1200.0
    target_spread_pct: float = 1.0


def run_pairs(run_round: Round, options: OverheadOptions,
              progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:  # fmt: skip
    """Interleaved pairs until a ratio's spread is below the target; per-pair ratios and their statistics."""
    pairs: list[dict[str, Any]] = []
    started = time.monotonic()
    stopped = "max_pairs"
    for index in range(options.max_pairs):
        order = ("off", "on") if index % 2 == 0 else ("on", "off")
        result = {name: run_round(name, index) for name in order}
        off, on = result["off"], result["on"]
        pairs.append({
            "order": list(order),
            "tokens_per_s": on["output_tokens_per_s"] / off["output_tokens_per_s"],
            # cpu_s_per_token(on) / cpu_s_per_token(off); > 1 means the plugin costs CPU.
            "cpu_s_per_token": on["cpu_s_per_token"] / off["cpu_s_per_token"],
        })  # fmt: skip
        summary = summarize(pairs)
        progress(f"pair {index + 1}: spread wall {summary['tokens_per_s']['spread_pct']:.2f} %, "
                 f"cpu {summary['cpu_s_per_token']['spread_pct']:.2f} %")  # fmt: skip
        if len(pairs) >= options.min_pairs and min(
            summary["tokens_per_s"]["spread_pct"], summary["cpu_s_per_token"]["spread_pct"]
        ) < options.target_spread_pct:
            stopped = "resolved"
            break
        if time.monotonic() - started > options.max_measure_s:
            stopped = "time_budget"
            break
    summary = summarize(pairs)
    target = options.target_spread_pct
    resolved = [key for key in ("tokens_per_s", "cpu_s_per_token") if summary[key]["spread_pct"] < target]
    return {
        "pairs": pairs,
        "ratios": summary,
        "stopped": stopped,
        "measure_s": time.monotonic() - started,
        "target_spread_pct": target,
        "resolved_by": resolved,
        "goal_overhead_pct": 1.0,
        # Wall clock: tokens/s drops by the overhead; CPU: CPU per token rises by it.
        "overhead_pct": {"tokens_per_s": summary["tokens_per_s"]["overhead_pct"],
                         "cpu_s_per_token": -summary["cpu_s_per_token"]["overhead_pct"]},
    }  # fmt: skip


def summarize(pairs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {key: ratio_stats([p[key] for p in pairs]) for key in ("tokens_per_s", "cpu_s_per_token")}


__all__ = ["OverheadOptions", "median_ci95", "ratio_stats", "run_pairs", "summarize", "tree_cpu_s"]
