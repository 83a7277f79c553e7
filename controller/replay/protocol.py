"""What ``moeslo replay`` does, from its options to the files it writes (the CLI only parses and prints)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contracts.errors import DataError, ValidationError
from contracts.slo_defaults import TTFT_REFERENCE_PROMPT_TOKENS
from contracts.ttft_objective import TtftAllowance
from controller.capacity import DEFAULT_PROFILE, ReplicaProfile, Targets
from controller.replay.report import write_report, write_sweep
from controller.replay.runner import ReplayConfig, ReplayContext, run_setting
from controller.replay.settings import Setting, parse_setting, sweep_settings
from controller.replay.sweep import SweepPoint, Window, WorkloadSpec, run_sweep, transfer
from controller.replay.workload import Workload
from controller.replay.world import World

__all__ = ["Progress", "ReplayRequest", "parse_policies", "parse_windows", "replay_once", "replay_sweep"]

Progress = Callable[[str, int, int], None]
"""Called as (what finished, how many done, how many in all)."""


@dataclass(frozen=True, kw_only=True)
class ReplayRequest:
    """One trace, prepared one way, in one world (the options of ``moeslo replay``)."""

    trace: Path
    speedup: float = 1.0
    rate_scale: float = 1.0
    tokens_per_s: float | None = None
    profile: Path | None = None
    lengths: str = "azure-2023-conv"
    mode: str = "auto"
    tick_s: float = 15.0
    startup_s: float = 120.0
    startup_jitter: float = 0.0
    capacity_error: float = 0.0
    drift_per_day: float = 0.0
    prompt_tail: float = 1.0
    scrape_s: float = 30.0
    warmup_s: float = 1800.0
    refit_every: int = 240
    start_s: float = 0.0
    duration_s: float | None = None
    seed: int = 0
    ttft_per_1k_s: float = 0.0
    """The TTFT objective's long-prompt allowance per 1,000 prompt tokens (0: the flat objective)."""
    ttft_reference_tokens: int = TTFT_REFERENCE_PROMPT_TOKENS

    @property
    def world(self) -> World:
        return World(
            capacity_error=self.capacity_error,
            drift_per_day=self.drift_per_day,
            prompt_tail_factor=self.prompt_tail,
            startup_s=self.startup_s,
            startup_jitter=self.startup_jitter,
            seed=self.seed,
        )

    def config(self) -> ReplayConfig:
        return ReplayConfig(
            tick_s=self.tick_s,
            world=self.world,
            scrape_s=self.scrape_s,
            refit_every_ticks=self.refit_every,
            warmup_s=self.warmup_s,
            targets=Targets(ttft_allowance=self.ttft_allowance),
        )

    @property
    def ttft_allowance(self) -> TtftAllowance:
        try:
            return TtftAllowance(self.ttft_reference_tokens, self.ttft_per_1k_s)
        except ValueError as exc:
            raise ValidationError(str(exc)) from None

    def workload_spec(self) -> WorkloadSpec:
        return WorkloadSpec(
            arguments={
                "trace_path": self.trace, "tick_s": self.tick_s, "mode": self.mode, "lengths": self.lengths,
                "speedup": self.speedup, "rate_scale": self.rate_scale, "start_s": self.start_s,
                "duration_s": self.duration_s, "tokens_per_s": self.tokens_per_s, "seed": self.seed,
                "world": self.world,
            }
        )  # fmt: skip

    def replica_profile(self) -> ReplicaProfile:
        return ReplicaProfile.load(self.profile) if self.profile is not None else DEFAULT_PROFILE

    def scored_workload(self) -> Workload:
        """The workload, refused before any run when none of its requests would be scored: every replay of it
        (each policy, each knob of a sweep, each router at each fleet size) would only have ended without
        a score, and on a long trace after hours."""
        workload = self.workload_spec().build()
        first = max(math.ceil(self.warmup_s / workload.tick_s - 1e-9), 0)  # the first tick scored (as ``score``)
        if not workload.rates_rps[first:].sum() > 0:
            raise ValidationError(f"no request in the scored window: {self._empty_window_cause(workload)}")
        return workload

    def _empty_window_cause(self, workload: Workload) -> str:
        """Why nothing is scored: the part replayed is ``[--start, --start + --duration)``, scored after its
        warm-up; where it has requests, the span they take and the longest warm-up that leaves some."""
        start, warmup, duration = self.start_s, self.warmup_s, self.duration_s
        if duration is not None and duration <= warmup:
            return f"--duration ({duration:g} s) ends within --warmup ({warmup:g} s), which is not scored"
        end = "the trace's end" if duration is None else f"--start + --duration ({start + duration:g} s)"
        cause = f"the trace has no request from --start + --warmup ({start + warmup:g} s) to {end}"
        busy = np.flatnonzero(workload.rates_rps > 0)
        if not busy.size:
            return cause
        span = workload.requests.duration_s if workload.requests is not None else workload.duration_s
        return (f"{cause}: the part replayed spans {span:.0f} s; give a --warmup of at most "
                f"{busy[-1] * workload.tick_s:g} s (the last tick with requests starts there)")


def parse_policies(text: str) -> list[Setting]:
    """Policies separated by ``;`` (or by ``,`` when no ``;`` is given), each ``name[:knob=v,...]``."""
    parts = text.split(";") if ";" in text else text.split(",")
    settings = [parse_setting(p) for p in parts if p.strip()]
    if not settings:
        raise ValidationError(f"--policies: name at least one policy, got {text!r}")
    return settings


def parse_windows(texts: Sequence[str], *, warmup_s: float) -> list[Window]:
    """The default windows (``warmup``, ``scored``) and any ``NAME=START:END`` given."""
    windows = [Window(name="warmup", start_s=0.0, end_s=warmup_s), Window(name="scored", start_s=warmup_s)]
    problems = []
    for text in texts:
        name, _, span = text.partition("=")
        start, _, end = span.partition(":")
        try:
            window = Window(name=name.strip(), start_s=float(start), end_s=float(end) if end else math.inf)
        except ValueError:
            problems.append(f"window {text!r} must look like NAME=START:END (seconds; END may be empty)")
            continue
        if not (window.name and 0 <= window.start_s < window.end_s):
            problems.append(f"window {text!r} needs a name and 0 <= START < END")
        windows.append(window)
    if problems:
        raise ValidationError(problems)
    return windows


def replay_once(
    request: ReplayRequest, policies: str, out: Path, *, progress: Progress | None = None
) -> dict[str, Any]:
    """Each policy once (its default knobs unless given), per-tick plots, ``summary.json``."""
    began, began_cpu = time.perf_counter(), time.process_time()
    settings = parse_policies(policies)
    profile = request.replica_profile()
    ctx = ReplayContext(request.scored_workload(), profile, request.config())
    runs = []
    for i, setting in enumerate(settings):
        runs.append(run_setting(setting, ctx))
        if progress is not None:
            progress(setting.label, i + 1, len(settings))
    timings = {"wall_s": round(time.perf_counter() - began, 2), "cpu_s": round(time.process_time() - began_cpu, 2)}
    return write_report(ctx, runs, out, timings=timings)


def replay_sweep(
    request: ReplayRequest,
    policies: Sequence[str],
    out: Path,
    *,
    windows: Sequence[str] = (),
    tuned_from: Path | None = None,
    workers: int = 2,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Every policy over its knob grid; frontiers per window; with ``tuned_from``, the transferred knobs."""
    began = time.perf_counter()
    tuned = _read_tuning(tuned_from) if tuned_from is not None else None  # a bad file fails now, not after the sweep
    settings = sweep_settings(policies)
    profile = request.replica_profile()
    spec = request.workload_spec()
    config = request.config()
    scoring = parse_windows(windows, warmup_s=config.warmup_s)
    workload = request.scored_workload()  # each worker builds its own; this one refuses an empty window first
    done: list[SweepPoint] = []

    def on_done(point: SweepPoint) -> None:
        done.append(point)
        if progress is not None:
            progress(point.setting.label, len(done), len(settings))

    points = run_sweep(spec, settings, profile, config, scoring, workers=workers, on_done=on_done)
    ctx = ReplayContext(workload, profile, config)
    timings = {"wall_s": round(time.perf_counter() - began, 1), "cpu_s": round(sum(p.cpu_s for p in points), 1)}
    extra: dict[str, Any] = {}
    if tuned is not None:
        extra["tuned_from"] = _transferred(tuned, points)
    return write_sweep(ctx, points, out, windows=[w.name for w in scoring], timings=timings, extra=extra)


def _read_tuning(path: Path) -> dict[str, Any]:
    """A ``sweep.json`` to take tuned knobs from (``--tuned-from``), checked before any run."""
    try:
        tuned: Any = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"--tuned-from: cannot read a tuning sweep: {exc}", path=str(path)) from None
    shaped = isinstance(tuned, dict) and isinstance(tuned.get("points"), list)
    if not (shaped and isinstance(tuned.get("windows"), dict)):
        raise DataError("--tuned-from: not a sweep.json of `moeslo replay --sweep` (no points and windows)",
                        path=str(path))  # fmt: skip
    return dict(tuned)


def _transferred(tuned: dict[str, Any], points: Sequence[SweepPoint]) -> dict[str, Any]:
    tune_window = "tune" if "tune" in tuned["windows"] else "scored"
    return {
        "trace": tuned.get("trace"),
        "window": tune_window,
        "by_attainment": transfer(tuned["points"], tune_window, [p.as_dict() for p in points], "scored"),
    }
