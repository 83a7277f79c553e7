"""Every policy over its knob grid on one workload, scored per time window, with frontiers at equal attainment.

Runs are independent, so they go to worker processes (``spawn``: each worker starts
with one BLAS thread, builds each workload once and keeps the last few).  Each run is reduced
to its scores over the named windows (``warmup``: the first 30 minutes, scored
apart; ``scored``: the rest; for a week, optionally ``tune`` and ``report`` spans),
which is all the frontiers need.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.capacity import ReplicaProfile
from controller.replay.frontier import Point, compare_at, pareto
from controller.replay.runner import ReplayConfig, ReplayContext, run_setting
from controller.replay.scoring import Score
from controller.replay.settings import Setting
from controller.replay.strategies import BASELINES
from controller.replay.workload import Workload

__all__ = [
    "ATTAINMENTS",
    "Job",
    "SweepPoint",
    "Window",
    "WorkloadSpec",
    "frontiers",
    "run_jobs",
    "run_sweep",
    "sweep_summary",
    "transfer",
]

ATTAINMENTS = (0.995, 0.998, 0.999)
_COSTLY = ("moeslo", "dynamo")


@dataclass(frozen=True, kw_only=True, slots=True)
class Window:
    name: str
    start_s: float
    end_s: float = math.inf


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """How to rebuild the workload in a worker (``prepare_workload``'s arguments)."""

    arguments: Mapping[str, Any]

    def build(self) -> Workload:
        from controller.replay.workload import prepare_workload

        return prepare_workload(**self.arguments)


@dataclass(kw_only=True)
class SweepPoint:
    setting: Setting
    scores: dict[str, Score]
    wall_s: float
    cpu_s: float
    reasons: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "setting": self.setting.label,
            "policy": self.setting.policy,
            "knobs": dict(self.setting.knobs),
            "scores": {name: s.as_dict() for name, s in self.scores.items()},
            "cpu_s": round(self.cpu_s, 2),
            "wall_s": round(self.wall_s, 2),
        }


@dataclass(frozen=True, kw_only=True)
class Job:
    """One setting on one workload in one world, scored over ``windows``."""

    spec: WorkloadSpec
    config: ReplayConfig
    setting: Setting
    windows: tuple[Window, ...]

    @property
    def key(self) -> str:
        """Which workload and world the job needs (jobs sharing it share a worker's context)."""
        return repr((sorted(self.spec.arguments.items()), self.config))


_CONTEXTS: dict[str, ReplayContext] = {}
_KEEP_CONTEXTS = 3


def _context(job: Job, profile_json: str) -> ReplayContext:
    ctx = _CONTEXTS.get(job.key)
    if ctx is None:
        while len(_CONTEXTS) >= _KEEP_CONTEXTS:
            del _CONTEXTS[next(iter(_CONTEXTS))]
        profile = ReplicaProfile.model_validate_json(profile_json)
        ctx = ReplayContext(job.spec.build(), profile, job.config)
        _CONTEXTS[job.key] = ctx
    return ctx


def _run(task: tuple[int, Job, str]) -> tuple[int, SweepPoint]:
    index, job, profile_json = task
    run = run_setting(job.setting, _context(job, profile_json))
    point = SweepPoint(
        setting=job.setting,
        scores={w.name: run.score(w.start_s, w.end_s) for w in job.windows},
        wall_s=run.wall_s,
        cpu_s=run.cpu_s,
        reasons=run.reasons,
    )
    return index, point


def _single_thread_env() -> None:
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"


def run_jobs(
    jobs: Sequence[Job],
    profile: ReplicaProfile,
    *,
    workers: int = 2,
    on_done: Callable[[int, SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    """Run every job (the costly ones first, so the workers finish together); results in input order.

    Workers are ``spawn``-ed with one BLAS thread each and keep the last few workloads they built.
    """
    profile_json = profile.model_dump_json()
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].setting.policy not in _COSTLY, jobs[i].key))
    tasks = [(i, jobs[i], profile_json) for i in order]
    results: dict[int, SweepPoint] = {}
    if workers <= 1:
        outputs = map(_run, tasks)
        for index, point in outputs:
            results[index] = point
            if on_done is not None:
                on_done(index, point)
    else:
        _single_thread_env()
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            for index, point in pool.imap_unordered(_run, tasks, chunksize=1):
                results[index] = point
                if on_done is not None:
                    on_done(index, point)
    return [results[i] for i in range(len(jobs))]


def run_sweep(
    spec: WorkloadSpec,
    settings: Sequence[Setting],
    profile: ReplicaProfile,
    config: ReplayConfig,
    windows: Sequence[Window],
    *,
    workers: int = 2,
    on_done: Callable[[SweepPoint], None] | None = None,
) -> list[SweepPoint]:
    """Every setting on one workload; results in input order."""
    jobs = [Job(spec=spec, config=config, setting=s, windows=tuple(windows)) for s in settings]
    return run_jobs(jobs, profile, workers=workers, on_done=None if on_done is None else (lambda _, p: on_done(p)))


def frontiers(points: Sequence[SweepPoint], window: str) -> dict[str, list[Point]]:
    """Per policy, its Pareto frontier in ``window``."""
    by_policy: dict[str, list[Point]] = {}
    for p in points:
        s = p.scores[window]
        by_policy.setdefault(p.setting.policy, []).append(
            Point(label=p.setting.label, attainment=s.attainment_both, replica_hours=s.replica_hours)
        )
    return {policy: pareto(pts) for policy, pts in by_policy.items()}


def sweep_summary(
    points: Sequence[SweepPoint],
    window: str,
    *,
    attainments: Sequence[float] = ATTAINMENTS,
    ours: str = "moeslo",
) -> dict[str, Any]:
    """Frontiers and the comparison at each fixed attainment, for one window."""
    fronts = frontiers(points, window)
    return {
        "frontiers": {
            policy: [
                {"setting": p.label, "attainment": round(p.attainment, 6), "replica_hours": round(p.replica_hours, 3)}
                for p in front
            ]
            for policy, front in fronts.items()
        },
        "at_attainment": {
            f"{a * 100:g}%": compare_at(fronts, a, ours=ours, baselines=BASELINES) for a in attainments
        },
    }


def transfer(
    tuned: Sequence[Mapping[str, Any]],
    tune_window: str,
    reported: Sequence[Mapping[str, Any]],
    report_window: str,
    *,
    attainments: Sequence[float] = ATTAINMENTS,
) -> dict[str, Any]:
    """Knobs chosen on one trace (the cheapest setting reaching each attainment there), scored on another.

    Both sides are points as :meth:`SweepPoint.as_dict` writes them (so a tuning sweep can be read back
    from its ``sweep.json``).
    """
    by_label = {p["setting"]: p for p in reported}
    out: dict[str, Any] = {}
    policies = list(dict.fromkeys(str(p["policy"]) for p in tuned))
    for a in attainments:
        row: dict[str, Any] = {}
        for policy in policies:
            meeting = [
                p for p in tuned if p["policy"] == policy and (p["scores"][tune_window]["attainment_both"] or 0.0) >= a
            ]
            if not meeting:
                row[policy] = None
                continue
            chosen = min(meeting, key=lambda p: p["scores"][tune_window]["replica_hours"])
            there = by_label.get(chosen["setting"])
            score = None if there is None else there["scores"][report_window]
            row[policy] = {
                "setting": chosen["setting"],
                "tuned_attainment": chosen["scores"][tune_window]["attainment_both"],
                "attainment": None if score is None else score["attainment_both"],
                "replica_hours": None if score is None else score["replica_hours"],
                "worst_hour_attainment": None if score is None else score["worst_hour_attainment"],
            }
        out[f"{a * 100:g}%"] = row
    return out
