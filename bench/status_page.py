"""Benchmark of the status page: 100 policies with a day of decisions, against the API's JSON.

Goal (issue 18): a page renders in <= 300 ms server time for 100 policies with a day of
decisions.  The fleet (:mod:`bench.status_fleet`) is written into a SQLite file (WAL, the
embedded default): 100 policies x 5,760 ticks of 15 s = 576,000 decisions with the inputs the
core records, plus rebalances.  Then, in the same run and interleaved (so they share the
machine's noise), each of these is requested in-process (FastAPI's test client, no network):

- ``status_json`` (the baseline): ``GET /v1/status``, every policy's status as JSON;
- ``overview``: ``GET /ui/?per_page=100``, every policy on one page;
- ``policy_6h`` and ``policy_1d``: ``GET /ui/policies/<name>`` over the default range (6 h)
  and over the whole day (5,760 ticks drawn), for a policy that pages and rebalances, as a
  page that reloads itself sees them (its series cache holds what earlier loads read);
- ``policy_1d_cold``: the day's page with its cache entry dropped first (a first visit: every
  decision of the day read and parsed); the other pages' entries stay, so they stay warm.

Each figure is wall time per request (what the browser waits for, less the network), the
process's CPU time for it (the wall time less any wait for a CPU the machine's other work
caused), the page's own ``Server-Timing`` (the route, from its first line to the HTML), and how
many of its timed loads read the decision log in full (``full_reads``: 0 for a warm page).
"""

from __future__ import annotations

import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi.testclient import TestClient

from bench.status_fleet import SyntheticFleet, build_fleet
from controller.api import create_app
from controller.config import ControllerSettings
from controller.store import Store

__all__ = ["StatusPageBenchConfig", "run_status_page_bench"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StatusPageBenchConfig:
    policies: int = 100
    hours: float = 24.0
    tick_s: float = 15.0
    requests: int = 50
    """Timed requests of each page (after the warm-up)."""
    warmup: int = 3
    seed: int = 0
    goal_ms: float = 300.0

    def __post_init__(self) -> None:
        if self.policies < 1 or self.hours <= 0 or self.tick_s <= 0:
            raise ValueError(f"need policies >= 1, hours > 0 and tick_s > 0, got {self.policies}, {self.hours}, "
                             f"{self.tick_s}")
        if self.requests < 1 or self.warmup < 0:
            raise ValueError(f"requests must be >= 1 and warmup >= 0, got {self.requests}, {self.warmup}")


def _summary(
    name: str, path: str, wall_s: list[float], cpu_s: list[float], server_ms: list[float], size: int, full_reads: int
) -> dict[str, object]:
    wall_ms = sorted(v * 1000 for v in wall_s)
    cpu_ms = sorted(v * 1000 for v in cpu_s)
    server = sorted(server_ms)

    def p99(values: list[float]) -> float:
        return values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]

    out: dict[str, object] = {"name": name, "path": path, "requests": len(wall_ms), "bytes": size,
                              "median_ms": statistics.median(wall_ms), "p99_ms": p99(wall_ms),
                              "cpu_median_ms": statistics.median(cpu_ms), "cpu_p99_ms": p99(cpu_ms),
                              "full_reads": full_reads}
    if server:
        out.update(server_median_ms=statistics.median(server), server_p99_ms=p99(server))
    return out


def _time_pages(
    client: TestClient, paths: dict[str, str], cfg: StatusPageBenchConfig, progress: Callable[[int, int], None] | None,
    *, cold: tuple[str, str],
) -> dict[str, dict[str, object]]:
    """Each path ``requests`` times, interleaved; before a name ending in ``_cold``, the page cache drops ``cold``
    (policy, range) only, so the warm pages' entries stay."""
    times: dict[str, tuple[list[float], list[float], list[float], int]] = {name: ([], [], [], 0) for name in paths}
    full_reads = dict.fromkeys(paths, 0)
    cache = client.app.state.page_series  # type: ignore[attr-defined]
    total = (cfg.warmup + cfg.requests) * len(paths)
    done = 0
    for round_no in range(cfg.warmup + cfg.requests):
        for name, path in paths.items():  # interleaved: every page sees the same background load
            if name.endswith("_cold"):
                cache.forget(*cold)
            gc.collect()
            reads, started, cpu_started = cache.full_reads, time.perf_counter(), time.process_time()
            response = client.get(path)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
            if response.status_code != 200:
                raise RuntimeError(f"GET {path}: HTTP {response.status_code}")
            if round_no >= cfg.warmup:
                wall, cpus, server, _ = times[name]
                wall.append(elapsed)
                cpus.append(cpu)
                timing = response.headers.get("server-timing", "")
                if "dur=" in timing:
                    server.append(float(timing.split("dur=", 1)[1]))
                times[name] = (wall, cpus, server, len(response.content))
                full_reads[name] += cache.full_reads - reads
            done += 1
            if progress is not None:
                progress(done, total)
    return {name: _summary(name, paths[name], *times[name], full_reads[name]) for name in paths}


def run_status_page_bench(
    cfg: StatusPageBenchConfig, progress: Callable[[str, int, int], None] | None = None
) -> dict[str, object]:
    """Build the fleet, time the pages against ``/v1/status``; JSON-ready figures."""
    with tempfile.TemporaryDirectory(prefix="moeslo-bench-") as tmp:
        settings = ControllerSettings(db=str(Path(tmp) / "controller.db"), tick_interval_s=cfg.tick_s)
        store = Store(settings.db_url)
        fleet = SyntheticFleet(policies=cfg.policies, hours=cfg.hours, tick_s=cfg.tick_s, seed=cfg.seed)
        view = build_fleet(store, fleet, progress=None if progress is None else lambda d, t: progress("fleet", d, t))
        name = "policy-006" if cfg.policies > 6 else "policy-000"
        paths = {"status_json": "/v1/status", "overview": f"/ui/?per_page={min(500, cfg.policies)}",
                 "policy_6h": f"/ui/policies/{name}", "policy_1d": f"/ui/policies/{name}?range=1d",
                 "policy_1d_cold": f"/ui/policies/{name}?range=1d"}
        with TestClient(create_app(settings, store, service=view)) as client:
            figures = _time_pages(client, paths, cfg,
                                  None if progress is None else lambda d, t: progress("requests", d, t),
                                  cold=(name, "1d"))
        store.close()
    baseline = figures.pop("status_json")
    base_median = float(str(baseline["median_ms"]))
    for result in figures.values():
        result["median_ratio_vs_baseline"] = float(str(result["median_ms"])) / max(base_median, 1e-9)
    # The goal is server time: each page's own Server-Timing (the wall figures add the test client).
    meets = all(float(str(r["server_p99_ms"])) <= cfg.goal_ms for r in figures.values())
    return {
        "benchmark": "status_page",
        "config": {"policies": cfg.policies, "hours": cfg.hours, "tick_s": cfg.tick_s, "requests": cfg.requests,
                   "seed": cfg.seed},
        "decisions_logged": view.decisions,
        "goal_ms": cfg.goal_ms,
        "baseline": baseline,
        "results": list(figures.values()),
        "meets_goal": meets,
    }
