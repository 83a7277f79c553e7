"""The end of a replay: the summary (``summary.json``) and its PNG plots, written to a folder."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from controller.capacity import ReplicaProfile
from controller.replay.plots import plot_forecast, plot_replicas
from controller.replay.runner import PolicyRun, summarise
from controller.replay.workload import Workload


def write_report(
    workload: Workload,
    runs: Sequence[PolicyRun],
    replica: ReplicaProfile,
    out: Path,
    *,
    startup_s: float,
    timings: Mapping[str, float],
) -> dict[str, Any]:
    """Summarise ``runs`` (with ``timings`` such as wall_s, cpu_s), plot them, write ``out/summary.json``."""
    summary: dict[str, Any] = summarise(workload, runs, replica)
    summary.update(timings)
    summary["profile_source"] = replica.source
    out.mkdir(parents=True, exist_ok=True)
    plots = [str(plot_replicas(workload, runs, out / "replicas.png"))]
    for run in runs:
        drawn = plot_forecast(workload, run, startup_s, out / f"forecast_{run.name}.png")
        if drawn is not None:
            plots.append(str(drawn))
    summary["plots"] = plots
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


__all__ = ["write_report"]
