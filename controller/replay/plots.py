"""PNG plots of a replay: replicas over time per policy, and load forecast against actual."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from controller.replay.runner import PolicyRun
from controller.replay.workload import Workload


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_replicas(workload: Workload, runs: Sequence[PolicyRun], path: Path) -> Path:
    """Provisioned replicas of each policy over time, with the offered request rate."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, height_ratios=(1, 2))
    hours = np.arange(1, workload.ticks + 1) * workload.tick_s / 3600.0
    top.plot(hours, workload.rates_rps, color="0.3", linewidth=0.7)
    top.set_ylabel("requests/s")
    top.set_title(f"Replay of {Path(workload.name).name}")
    for run in runs:
        label = f"{run.name}: {run.attainment:.2%} in SLO, {run.replica_hours:.1f} replica-h"
        bottom.step(run.times_s / 3600.0, run.provisioned, where="post", linewidth=1.0, label=label)
    bottom.set_ylabel("replicas (provisioned)")
    bottom.set_xlabel("hours")
    bottom.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_forecast(workload: Workload, run: PolicyRun, lead_time_s: float, path: Path) -> Path | None:
    """The request-rate forecast made one lead time earlier, its interval, and the actual rate."""
    if run.forecast_point_rps is None or run.forecast_lower_rps is None or run.forecast_upper_rps is None:
        return None
    plt = _pyplot()
    shift = max(1, round(lead_time_s / workload.tick_s))
    n = workload.ticks
    hours = np.arange(1, n + 1) * workload.tick_s / 3600.0
    # A forecast made at tick k is for the tick k + shift.
    target_hours = hours[shift:]
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.plot(hours, workload.rates_rps, color="0.2", linewidth=0.7, label="actual")
    ax.plot(target_hours, run.forecast_point_rps[: n - shift], color="tab:blue", linewidth=0.8, label="forecast")
    ax.fill_between(
        target_hours,
        run.forecast_lower_rps[: n - shift],
        run.forecast_upper_rps[: n - shift],
        color="tab:blue",
        alpha=0.25,
        linewidth=0,
        label="interval",
    )
    ax.set_xlabel("hours")
    ax.set_ylabel("requests/s")
    ax.set_title(f"Request-rate forecast {lead_time_s:g} s ahead ({run.name})")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
