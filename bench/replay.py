"""Replay benchmark: every policy tuned over its knob, compared at equal attainment in a world it does not know.

Protocol (issue 21):

1. **Tune** on the 2024 conversation week (fluid; lengths from the 2023 conversation trace):
   every policy over its knob grid (:data:`controller.replay.settings.SWEEP_GRIDS`), timed
   on its own (goal: a week's sweep in <= 10 minutes); scored over the whole week after
   its first 30 minutes, and over days 1-4 (``tune``) and 5-7 (``report``) apart.
2. **Report** on traces the knobs were not tuned on: the 2023 conversation and code hours
   at 10x their rate (request mode, tens of replicas), for each start-up time (60, 300,
   600 s, with +-20 % jitter per replica), each capacity error (-20 %, +20 %) and several
   seeds.  Per run: each policy's frontier, its replica-hours at 99.5 / 99.8 / 99.9 %
   attainment (interpolated), ours over the best baseline's; across seeds, the mean and
   a 95 % t-interval of the exact ratios.  The first 30 minutes are scored apart (every policy starts there
   with the same empty history and the same fleet).
3. The knobs chosen on the week (the cheapest setting that reached each attainment
   there) are also scored on each report trace, so over-fitting to the week shows.

Goals: at start-up >= 300 s, ours <= 0.9x the best baseline's replica-hours at 99.5 % and
99.8 % with capacity error +-20 %; at 60 s, within 1.03x.  A goal is missed when some seed's baseline reaches
the attainment and ours does not, and otherwise decided only when every seed's ratio is exact (``n`` of them).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from contracts.datadir import default_data_dir
from contracts.errors import ValidationError
from contracts.slo_defaults import TTFT_PER_1K_PROMPT_TOKENS_S

__all__ = ["TRACES", "run", "trace_entry"]

TRACES = {
    "week": ("azure-llm-2024/invocations_ten_second_Conversation.csv", "fluid", 1.0),
    "conv": ("azure-llm-2023/AzureLLMInferenceTrace_conv.csv", "request", 10.0),
    "code": ("azure-llm-2023/AzureLLMInferenceTrace_code.csv", "request", 10.0),
    "mooncake": ("mooncake/synthetic_trace.jsonl", "request", 1.0),
}
"""Name: (path under the shared data folder, replay mode, rate scale).  A report trace may also be a file of
one's own (:func:`trace_entry`)."""
TRACE_FILE_SUFFIXES = (".jsonl", ".csv")
TRACE_OPTIONS: dict[str, tuple[float, float]] = {"mooncake": (120.0, TTFT_PER_1K_PROMPT_TOKENS_S)}
"""Per trace, (warm-up scored apart, TTFT allowance per 1k prompt tokens) where they differ from the protocol's
defaults (30 minutes, none): Mooncake's 17 minutes are scored after 2,
and its long prompts are judged by the TTFT objective at its reference length (docs/controller.md)."""
DAY_S = 86_400.0
WEEK_WINDOWS = ("tune=1800:345600", "report=345600:")
LEVELS = ("99.5%", "99.8%", "99.9%")


def trace_entry(trace: str) -> tuple[str, str, float, tuple[float, float]]:
    """(path, replay mode, rate scale, (warm-up s, TTFT allowance per 1k prompt tokens)) of a report trace.

    A name of :data:`TRACES`, or a trace file of one's own (``.jsonl``: the Mooncake format, replayed
    like ``mooncake``, long prompts judged at the reference length; ``.csv``: the Azure format, with the
    protocol's 30 minutes of warm-up), replayed request by request at its own rate.
    """
    if trace in TRACES:
        path, mode, scale = TRACES[trace]
        return path, mode, scale, TRACE_OPTIONS.get(trace, (1800.0, 0.0))
    suffix = Path(trace).suffix
    if suffix not in TRACE_FILE_SUFFIXES:
        names = ", ".join(n for n in TRACES if n != "week")
        raise ValidationError([f"trace {trace!r}: name one of {names}, or a .jsonl (Mooncake) or .csv (Azure) file"])
    options = TRACE_OPTIONS["mooncake"] if suffix == ".jsonl" else (1800.0, 0.0)
    return str(Path(trace).resolve()), "request", 1.0, options


def _request(data: Path, trace: str, *, startup_s: float, error: float, seed: int, scale: float | None = None) -> Any:
    from controller.replay.protocol import ReplayRequest

    path, mode, default_scale, (warmup_s, per_1k_s) = trace_entry(trace)
    return ReplayRequest(
        trace=data / path, mode=mode, rate_scale=scale or default_scale, startup_s=startup_s, startup_jitter=0.2,
        capacity_error=error, seed=seed, warmup_s=warmup_s, ttft_per_1k_s=per_1k_s,
    )  # fmt: skip


def tune_on_week(
    data: Path, *, startup_s: float, error: float, workers: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    """The week's sweep on its own (timed), scored whole, on days 1-4 and on days 5-7."""
    from controller.replay.protocol import parse_windows
    from controller.replay.settings import sweep_settings
    from controller.replay.strategies import STRATEGY_NAMES
    from controller.replay.sweep import Job, run_jobs, sweep_summary

    request = _request(data, "week", startup_s=startup_s, error=error, seed=0)
    config = request.config()
    windows = tuple(parse_windows(WEEK_WINDOWS, warmup_s=config.warmup_s))
    settings = sweep_settings(STRATEGY_NAMES)
    jobs = [Job(spec=request.workload_spec(), config=config, setting=s, windows=windows) for s in settings]
    began = time.perf_counter()
    label = f"week {startup_s:g} s {error:+.0%}"
    points = run_jobs(jobs, request.replica_profile(), workers=workers,
                      on_done=lambda _, p: progress(f"{label}: {p.setting.label}"))  # fmt: skip
    wall_s = time.perf_counter() - began
    return {
        "startup_s": startup_s,
        "capacity_error": error,
        "wall_s": round(wall_s, 1),
        "cpu_s": round(sum(p.cpu_s for p in points), 1),
        "wall_goal_s": 600.0,
        "wall_goal_met": wall_s <= 600.0,
        "windows": {w.name: sweep_summary(points, w.name) for w in windows},
        "points": [p.as_dict() for p in points],
    }


def _interval(values: Sequence[float]) -> dict[str, Any]:
    """Mean and 95 % t-interval of per-seed values."""
    from scipy.stats import t

    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return {"mean": round(mean, 4), "ci95": None, "n": n, "values": [round(v, 4) for v in values]}
    half = float(t.ppf(0.975, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return {"mean": round(mean, 4), "ci95": [round(mean - half, 4), round(mean + half, 4)], "n": n,
            "values": [round(v, 4) for v in values]}  # fmt: skip


def _ratios_of(entries: Sequence[dict[str, Any]], *kinds: str) -> list[Any]:
    """Ours over the best baseline in the seeds whose ratio is of one of ``kinds``."""
    return [e["ratio_to_best_baseline"] for e in entries if e["ratio_kind"] in kinds]


def _aggregate(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Across seeds, per attainment: ours over the best baseline, and each policy's replica-hours.

    Only exact ratios enter the mean; bounds are listed apart, and the seeds where a baseline reaches the
    attainment and ours does not are counted (a miss for that seed).
    """
    out: dict[str, Any] = {}
    for level in LEVELS:
        entries = [s["windows"]["scored"]["at_attainment"][level] for s in summaries]
        ratios, lower = _ratios_of(entries, "exact"), _ratios_of(entries, "at_least")
        upper = _ratios_of(entries, "at_most")
        ours_unreachable = len(_ratios_of(entries, "ours_unreachable"))
        policies: dict[str, Any] = {}
        for name in entries[0]["policies"]:
            hours = [
                e["policies"][name]["replica_hours"] for e in entries if e["policies"][name]["kind"] == "interpolated"
            ]
            policies[name] = _interval(hours) if hours else None
        out[level] = {
            "seeds": len(entries),
            "ratio_to_best_baseline": _interval(ratios) if ratios else None,
            "ratio_exact": ratios,
            "ratio_upper_bounds": upper,
            "ratio_lower_bounds": lower,
            "ours_unreachable": ours_unreachable,
            "unreachable_or_unknown": len(entries) - len(ratios) - len(upper) - len(lower) - ours_unreachable,
            "best_baselines": sorted({str(e["best_baseline"]) for e in entries if e["best_baseline"]}),
            "replica_hours": policies,
        }
    return out


def report_matrix(
    data: Path, *, traces: Sequence[str], startups: Sequence[float], errors: Sequence[float], seeds: Sequence[int],
    scale: float | None, workers: int, progress: Callable[[str], None],
) -> list[dict[str, Any]]:  # fmt: skip
    """Every (trace, start-up, error, seed) sweep in one pool; their summaries, grouped over seeds."""
    from controller.replay.protocol import parse_windows
    from controller.replay.settings import sweep_settings
    from controller.replay.strategies import STRATEGY_NAMES
    from controller.replay.sweep import Job, run_jobs, sweep_summary

    settings = sweep_settings(STRATEGY_NAMES)
    cases = [(tr, st, er, sd) for tr in traces for st in startups for er in errors for sd in seeds]
    jobs: list[Job] = []
    for trace, startup_s, error, seed in cases:
        request = _request(data, trace, startup_s=startup_s, error=error, seed=seed, scale=scale)
        config = request.config()
        windows = tuple(parse_windows((), warmup_s=config.warmup_s))
        jobs += [Job(spec=request.workload_spec(), config=config, setting=s, windows=windows) for s in settings]
    profile = _request(data, traces[0], startup_s=60.0, error=0.0, seed=0).replica_profile()
    done = [0]

    def on_done(_: int, point: Any) -> None:
        done[0] += 1
        progress(f"report runs {done[0]}/{len(jobs)}: {point.setting.label}")

    points = run_jobs(jobs, profile, workers=workers, on_done=on_done)
    per = len(settings)
    groups: dict[tuple[str, float, float], list[dict[str, Any]]] = {}
    for i, (trace, startup_s, error, seed) in enumerate(cases):
        chunk = points[i * per : (i + 1) * per]
        summary = {"seed": seed, "windows": {w: sweep_summary(chunk, w) for w in ("warmup", "scored")},
                   "points": [p.as_dict() for p in chunk]}  # fmt: skip
        groups.setdefault((trace, startup_s, error), []).append(summary)
    return [
        {
            "trace": trace,
            "rate_scale": scale or trace_entry(trace)[2],
            "startup_s": startup_s,
            "capacity_error": error,
            "seeds": len(summaries),
            "across_seeds": _aggregate(summaries),
            "runs": summaries,
        }
        for (trace, startup_s, error), summaries in groups.items()
    ]


def _goal_met(across: dict[str, Any], bound: float) -> bool | None:
    """Whether ours' mean ratio over the seeds is within ``bound``, where the seeds decide it; else None.

    Missed when a baseline reaches the attainment in some seed where ours does not.  A mean of lower bounds
    (exact ratios among them) is a lower bound on the true mean, so it misses when above ``bound``; a mean of
    upper bounds and exact ratios meets it when within ``bound``.  The mean is taken as for exact ratios alone.
    """
    if across["ours_unreachable"]:
        return False
    exact = list(across["ratio_exact"])  # as compare_at gave them: the display's 4 digits made 0.90004 meet 0.9
    lower, upper = exact + across["ratio_lower_bounds"], exact + across["ratio_upper_bounds"]
    if lower and len(lower) == across["seeds"] and statistics.fmean(lower) > bound:
        return False
    if upper and len(upper) == across["seeds"] and statistics.fmean(upper) <= bound:
        return True
    return None


def _goals(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Ours over the best baseline at 99.5 % and 99.8 %: <= 0.9 at start-up >= 300 s, <= 1.03 at 60 s."""
    checks = []
    for r in reports:
        bound = 0.9 if r["startup_s"] >= 300 else 1.03
        for level in ("99.5%", "99.8%"):
            across = r["across_seeds"][level]
            ratio = across["ratio_to_best_baseline"]
            checks.append({"trace": r["trace"], "startup_s": r["startup_s"], "capacity_error": r["capacity_error"],
                           "attainment": level, "ratio_mean": None if ratio is None else ratio["mean"],
                           "n": 0 if ratio is None else ratio["n"], "seeds": across["seeds"],
                           "ratio_lower_bounds": across["ratio_lower_bounds"],
                           "ratio_upper_bounds": across["ratio_upper_bounds"],
                           "ours_unreachable": across["ours_unreachable"], "goal": bound,
                           "met": _goal_met(across, bound)})  # fmt: skip
    decided = [c["met"] for c in checks if c["met"] is not None]
    return {"checks": checks, "met": sum(decided), "missed": len(decided) - sum(decided),
            "undecided": len(checks) - len(decided)}  # fmt: skip


def _transfer_all(week: Sequence[dict[str, Any]], reports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Knobs tuned on the week (same start-up and error where that week case exists), scored on each report run."""
    from controller.replay.sweep import transfer

    out = []
    for r in reports:
        same = [w for w in week if (w["startup_s"], w["capacity_error"]) == (r["startup_s"], r["capacity_error"])]
        tuned = same[0] if same else (week[0] if week else None)
        if tuned is None:
            continue
        out.append({"trace": r["trace"], "startup_s": r["startup_s"], "capacity_error": r["capacity_error"],
                    "tuned_at": {"startup_s": tuned["startup_s"], "capacity_error": tuned["capacity_error"]},
                    "seed_0": transfer(tuned["points"], "tune", r["runs"][0]["points"], "scored")})  # fmt: skip
    return out


def run(
    *,
    data_dir: Path | None = None,
    week_cases: Sequence[tuple[float, float]] = ((300.0, -0.2),),
    traces: Sequence[str] = ("conv", "code"),
    startups: Sequence[float] = (60.0, 300.0, 600.0),
    errors: Sequence[float] = (-0.2, 0.2),
    seeds: Sequence[int] = (0, 1, 2),
    scale: float | None = None,
    workers: int = 2,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    data = data_dir or default_data_dir()
    own_missing = [t for t in traces if t not in TRACES and not Path(trace_entry(t)[0]).is_file()]
    if own_missing:
        raise ValidationError([f"trace file not found: {t}" for t in own_missing])
    needed = (*(("week",) if week_cases else ()), *traces)
    missing = [name for name in needed if not (data / trace_entry(name)[0]).exists()]
    if missing:
        return {"skipped": missing, "reason": f"shared traces not found under {data}"}
    began = time.perf_counter()
    week = [tune_on_week(data, startup_s=s, error=e, workers=workers, progress=progress) for s, e in week_cases]
    reports = report_matrix(data, traces=traces, startups=startups, errors=errors, seeds=seeds, scale=scale,
                            workers=workers, progress=progress) if traces else []  # fmt: skip
    return {
        "baselines": "static, hpa (custom metric), keda-queue, keda-kv, dynamo (throughput), dynamo-load, each "
        "over its knob; oracle as a reference (not a floor)",
        "week": week,
        "reports": reports,
        "transferred_knobs": _transfer_all(week, reports),
        "goals": _goals(reports),
        "wall_s": round(time.perf_counter() - began, 1),
    }
