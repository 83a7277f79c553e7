"""PNG plots of a replay: replicas over time, load forecast against actual, and Pareto frontiers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from controller.replay.frontier import MIN_VIOLATION, Point
from controller.replay.runner import PolicyRun
from controller.replay.workload import Workload

__all__ = ["plot_forecast", "plot_frontiers", "plot_replicas"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_replicas(workload: Workload, runs: Sequence[PolicyRun], path: Path) -> Path:
    """Provisioned replicas of each run over time, with the offered request rate."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, height_ratios=(1, 2))
    hours = np.arange(1, workload.ticks + 1) * workload.tick_s / 3600.0
    top.plot(hours, workload.rates_rps, color="0.3", linewidth=0.7)
    top.set_ylabel("requests/s")
    top.set_title(f"Replay of {Path(workload.name).name}")
    for run in runs:
        s = run.score()
        label = f"{run.name}: {s.attainment_both:.2%} in SLO, {s.replica_hours:.1f} replica-h"
        bottom.step(hours, run.outcomes.provisioned, where="pre", linewidth=1.0, label=label)
    bottom.set_ylabel("replicas (provisioned)")
    bottom.set_xlabel("hours")
    bottom.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_forecast(workload: Workload, run: PolicyRun, lead_time_s: float, path: Path) -> Path | None:
    """The request-rate forecast made one lead time earlier, its interval, and the actual rate."""
    if run.forecast_rps is None:
        return None
    point, lower, upper = run.forecast_rps
    plt = _pyplot()
    shift = max(1, round(lead_time_s / workload.tick_s))
    n = workload.ticks
    hours = np.arange(1, n + 1) * workload.tick_s / 3600.0
    target_hours = hours[shift:]  # a forecast made at tick k is for the tick k + shift
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.plot(hours, workload.rates_rps, color="0.2", linewidth=0.7, label="actual")
    ax.plot(target_hours, point[: n - shift], color="tab:blue", linewidth=0.8, label="forecast")
    ax.fill_between(target_hours, lower[: n - shift], upper[: n - shift], color="tab:blue", alpha=0.25, linewidth=0,
                    label="interval")  # fmt: skip
    ax.set_xlabel("hours")
    ax.set_ylabel("requests/s")
    ax.set_title(f"Request-rate forecast {lead_time_s:g} s ahead ({run.name})")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_frontiers(
    all_points: Mapping[str, Sequence[Point]],
    fronts: Mapping[str, Sequence[Point]],
    path: Path,
    *,
    title: str,
    attainments: Sequence[float] = (),
) -> Path:
    """Replica-hours against violation rate (log scale): every setting, and each policy's frontier."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 6))
    for i, (policy, points) in enumerate(all_points.items()):
        color = f"C{i}"
        ax.scatter([p.violation for p in points], [p.replica_hours for p in points], color=color, s=12, alpha=0.35)
        front = fronts.get(policy, [])
        style = "--" if policy == "oracle" else "-"
        label = policy + (" (reference, not a floor)" if policy == "oracle" else "")
        ax.plot([p.violation for p in front], [p.replica_hours for p in front], style, marker="o", markersize=4,
                color=color, label=label)  # fmt: skip
    for a in attainments:
        ax.axvline(max(1.0 - a, MIN_VIOLATION), color="0.6", linewidth=0.6, linestyle=":")
        ax.annotate(f"{a:.1%}", (max(1.0 - a, MIN_VIOLATION), 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                    ha="right", va="top", rotation=90, color="0.4")  # fmt: skip
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("violation rate (1 - share of requests within both SLOs), log scale; right is better")
    ax.set_ylabel("replica-hours (billed from the scale-up order)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
