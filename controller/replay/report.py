"""The end of a replay: ``summary.json`` (or ``sweep.json``) and their PNG plots, written to a folder."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from controller.capacity import ReplicaProfile
from controller.replay.frontier import Point
from controller.replay.plots import plot_forecast, plot_frontiers, plot_replicas
from controller.replay.runner import PolicyRun, ReplayConfig, ReplayContext
from controller.replay.sweep import ATTAINMENTS, SweepPoint, frontiers, sweep_summary
from controller.replay.workload import Workload

__all__ = ["describe", "summarise", "write_report", "write_sweep"]


def describe(workload: Workload, profile: ReplicaProfile, config: ReplayConfig, ctx: ReplayContext) -> dict[str, Any]:
    """What was replayed, in which world, against what the controllers believe."""
    return {
        "trace": workload.name,
        "mode": "request" if workload.requests is not None else "fluid",
        "duration_s": workload.duration_s,
        "tick_s": workload.tick_s,
        "requests": round(float(workload.rates_rps.sum()) * workload.tick_s),
        "mean_tokens_per_s": round(workload.total_tokens / workload.duration_s, 1),
        "profile": profile.name,
        "world": config.world.describe(),
        "true_prompt_tail": {
            "cv2": round(ctx.true_targets.prompt_cv2, 3),
            "p99_over_mean": round(ctx.true_targets.prompt_p99_over_mean, 3),
        },
        "assumed_prompt_tail": {
            "cv2": config.targets.prompt_cv2,
            "p99_over_mean": config.targets.prompt_p99_over_mean,
        },
        "scrape_s": config.scrape_s,
        "warmup_s": config.warmup_s,
        "initial_replicas": ctx.initial_replicas,
        "max_replicas": ctx.max_replicas,
    }


def summarise(runs: Sequence[PolicyRun], config: ReplayConfig) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    for run in runs:
        entry: dict[str, Any] = {
            "scored": run.score(config.warmup_s).as_dict(),
            "warmup": run.score(0.0, config.warmup_s).as_dict(),
            "cpu_s": round(run.cpu_s, 2),
            "wall_s": round(run.wall_s, 2),
        }
        if run.reasons:
            entry["reasons"] = run.reasons
        policies[run.name] = entry
    return policies


def write_report(
    ctx: ReplayContext, runs: Sequence[PolicyRun], out: Path, *, timings: Mapping[str, float]
) -> dict[str, Any]:
    """Summarise ``runs``, plot them, write ``out/summary.json``."""
    config = ctx.config
    summary: dict[str, Any] = describe(ctx.workload, ctx.profile, config, ctx)
    summary["policies"] = summarise(runs, config)
    summary.update(timings)
    summary["profile_source"] = ctx.profile.source
    out.mkdir(parents=True, exist_ok=True)
    plots = [str(plot_replicas(ctx.workload, runs, out / "replicas.png"))]
    for run in runs:
        drawn = plot_forecast(ctx.workload, run, config.startup_s, out / f"forecast_{run.setting.policy}.png")
        if drawn is not None:
            plots.append(str(drawn))
    summary["plots"] = plots
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def write_sweep(
    ctx: ReplayContext,
    points: Sequence[SweepPoint],
    out: Path,
    *,
    windows: Sequence[str],
    timings: Mapping[str, float],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``out/sweep.json`` (every point's scores, frontiers and comparisons per window) and one PNG per window."""
    config = ctx.config
    summary: dict[str, Any] = describe(ctx.workload, ctx.profile, config, ctx)
    summary.update(timings)
    summary["windows"] = {}
    plots = []
    out.mkdir(parents=True, exist_ok=True)
    for window in windows:
        summary["windows"][window] = sweep_summary(points, window)
        every: dict[str, list[Point]] = {}
        for p in points:
            s = p.scores[window]
            every.setdefault(p.setting.policy, []).append(
                Point(label=p.setting.label, attainment=s.attainment_both, replica_hours=s.replica_hours)
            )
        title = (
            f"{Path(ctx.workload.name).name}: {window} window; start-up {config.startup_s:g} s, "
            f"capacity error {config.world.capacity_error:+.0%}"
        )
        plots.append(str(plot_frontiers(every, frontiers(points, window), out / f"frontier_{window}.png",
                                        title=title, attainments=ATTAINMENTS)))  # fmt: skip
    summary["points"] = [p.as_dict() for p in points]
    if extra:
        summary.update(extra)
    summary["plots"] = plots
    (out / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
