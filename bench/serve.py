"""``moeslo bench serve``: the serving stack under a replayed production trace.

Two runs of the same time-compressed slice of a trace against a server
process each: the named baseline ``exporters_off`` (``--no-exporters``) and
``exporters_on`` (Prometheus with per-(layer, expert) series, scraped every
``scrape_interval_s`` like a Prometheus would).  For each: throughput, TTFT
and ITL percentiles as the client saw them, and the server's RSS over time
(peak, first vs last minute).  ``rounds`` rounds, off first in even rounds and
on first in odd ones; on against off is taken within each round and reported
as the median, min and max over rounds (``paired_ratios``), and the ITL p99 of
every round's token gaps pooled per variant, on minus off, with the 5th-95th
percentiles of its bootstrap over whole rounds (``pooled_itl``: one round's p99
moves by a few ms between rounds, more than the 1 ms the exporters may add; with
6-8 rounds that band covers the true difference about 80 % of the time, not 90 %); ``runs`` holds each
variant's fastest round for its own figures.  Separately, in this process: ``/metrics``
render time with ``render_layers x render_experts`` expert series, against
the registry-only render as its baseline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from harness.loadgen import RequestRecord, percentile, plan_from_trace, run_load, summarize
from harness.processes import free_port, moeslo_command, stop_process, wait_healthy

MIB = 2**20
STATED_OVERHEAD_MB = 520.0
"""RSS allowed beyond weights and KV budget, for two processes: the engine core (Python, torch, request state),
about 400 MiB, and the API process (Python, FastAPI/uvicorn, tokenizer, exporters; no torch), about 120 MiB."""

MEASURED_SEED, WARM_UP_SEED = 0, 1
"""Seeds of the prompts' token ids: the measured runs' and the warm-up's, apart."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeBenchOptions:
    checkpoint: Path | None = None
    trace: Path | None = None
    duration_s: float = 20.0
    speedup: float = 1.0
    length_scale: float = 1 / 16
    kv_cache_mb: float = 64.0
    max_in_flight: int = 128
    scrape_interval_s: float = 1.0
    render_layers: int = 58
    render_experts: int = 256
    rss_interval_s: float = 0.5
    rounds: int = 2
    skip_baseline: bool = False
    """Only the exporters-on run (for long RSS runs; no ratios)."""


def run_serve_bench(options: ServeBenchOptions, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    from contracts.traces import load_request_trace
    from engine.config import ModelConfig
    from harness.traces import conversation_trace

    trace_path = options.trace or conversation_trace()
    with tempfile.TemporaryDirectory(prefix="moeslo-bench-") as tmp:
        checkpoint = options.checkpoint or _default_checkpoint(Path(tmp) / "ckpt", progress)
        config = ModelConfig.load(checkpoint)
        max_len = config.max_position_embeddings
        trace = load_request_trace(trace_path)
        plan = plan_from_trace(
            trace, duration_s=options.duration_s, speedup=options.speedup, length_scale=options.length_scale,
            max_prompt_tokens=max_len // 2, max_output_tokens=max_len // 4,
        )
        progress(f"replaying {len(plan)} requests over {options.duration_s:g} s per run ({trace_path.name})")
        rounds = _run_rounds(
            lambda _, exporters: _run_once(checkpoint, plan, config.vocab_size, options, exporters=exporters),
            options.rounds, skip_baseline=options.skip_baseline, progress=progress,
        )  # fmt: skip
        model_mb = sum(p.stat().st_size for p in Path(checkpoint).glob("*.safetensors")) / MIB
    render = render_benchmark(options.render_layers, options.render_experts)
    names = ("exporters_on",) if options.skip_baseline else ("exporters_off", "exporters_on")
    runs = {name: _best_round([r[name] for r in rounds]) for name in names}
    bound_mb = model_mb + options.kv_cache_mb + STATED_OVERHEAD_MB
    for run in runs.values():
        if run["rss"]:
            run["rss"]["bound_mb"] = round(bound_mb, 1)
            run["rss"]["within_bound"] = run["rss"]["peak_mb"] <= bound_mb
    on = runs["exporters_on"]["load"]
    off = runs["exporters_off"]["load"] if "exporters_off" in runs else {}
    step_s = off.get("itl_p50_s") or on["itl_p50_s"] or 0.0
    return {
        "benchmark": "serve",
        "baseline": None if options.skip_baseline else "exporters_off",
        "trace": {"path": str(trace_path), "requests": len(plan), "speedup": options.speedup,
                  "length_scale": options.length_scale, "duration_s": options.duration_s,
                  "attribution": "Azure LLM inference trace 2023 (Splitwise, ISCA'24), CC BY 4.0"},
        "model": {"checkpoint": str(options.checkpoint or "moeslo model init defaults"),
                  "layers": config.num_hidden_layers, "experts": config.num_experts,
                  "weights_mb": round(model_mb, 2), "kv_cache_mb": options.kv_cache_mb,
                  "stated_overhead_mb": STATED_OVERHEAD_MB},
        "runs": runs,
        "rounds": [{"order": r["order"], **{name: r[name]["load"] for name in r["order"]}} for r in rounds],
        "paired_ratios": _paired_ratios(rounds),
        "pooled_itl": _pooled_itl(rounds),
        "metrics_render": render,
        "sink_cost": sink_cost_benchmark(config.num_hidden_layers, config.num_experts, step_s),
    }


def _ratios(on: dict[str, Any], off: dict[str, Any]) -> dict[str, float | None]:
    def minus_ms(key: str) -> float | None:
        return None if on[key] is None or off[key] is None else round((on[key] - off[key]) * 1000, 3)

    return {
        "throughput_on_over_off": _ratio(on["output_tokens_per_s"], off["output_tokens_per_s"]),
        "ttft_p99_on_over_off": _ratio(on["ttft_p99_s"], off["ttft_p99_s"]),
        "itl_p99_on_over_off": _ratio(on["itl_p99_s"], off["itl_p99_s"]),
        "itl_p99_on_minus_off_ms": minus_ms("itl_p99_s"),
        "itl_p50_on_minus_off_ms": minus_ms("itl_p50_s"),
    }


def _run_rounds(run_one: Callable[[str, bool], dict[str, Any]], rounds: int, *, skip_baseline: bool,
                progress: Callable[[str], None]) -> list[dict[str, Any]]:  # fmt: skip
    """Each round runs exporters off and on, off first in even rounds and on first in odd ones (so drift in the
    machine's load and what a run leaves behind hit both alike); each round's runs by name, and its ``order``."""
    variants = (("exporters_off", False), ("exporters_on", True))
    out: list[dict[str, Any]] = []
    for index in range(rounds):
        order = [v for v in (variants if index % 2 == 0 else variants[::-1])
                 if not (skip_baseline and v[0] == "exporters_off")]  # fmt: skip
        round_runs: dict[str, Any] = {"order": [name for name, _ in order]}
        for name, exporters in order:
            progress(f"round {index + 1}/{rounds}: {name}")
            round_runs[name] = run_one(name, exporters)
        out.append(round_runs)
    return out


def _paired_ratios(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]] | None:
    """On against off within each round, then the median, min and max over rounds of each figure (None without
    a baseline): rounds differ more than the variants do, so only same-round figures compare."""
    per_round = [_ratios(r["exporters_on"]["load"], r["exporters_off"]["load"])
                 for r in rounds if "exporters_off" in r]  # fmt: skip
    if not per_round:
        return None
    out: dict[str, dict[str, Any]] = {}
    for key in per_round[0]:
        values = [v for v in (r[key] for r in per_round) if v is not None]
        out[key] = {"median": round(statistics.median(values), 4), "min": min(values), "max": max(values),
                    "rounds": len(values)} if values else {"rounds": 0}  # fmt: skip
    return out


POOLED_RESAMPLES = 2000


def _pooled_itl(rounds: list[dict[str, Any]], *, seed: int = 0) -> dict[str, Any] | None:
    """ITL p99 over the token gaps of every round, on minus off (ms), and the 5th and 95th percentiles of the same
    figure over resamples of whole rounds with replacement, so a round's own level (the machine's load then) moves
    both variants alike (None without a baseline, or without gaps).  A percentile bootstrap over few rounds runs
    narrow: simulated with 6-8 rounds and noise of each run's own, it held the true difference about 80 % of the
    time."""
    paired = [(np.asarray(r["exporters_on"]["itls_s"]), np.asarray(r["exporters_off"]["itls_s"]))
              for r in rounds if "exporters_off" in r and "itls_s" in r["exporters_on"]]  # fmt: skip
    if not paired or not all(len(on) and len(off) for on, off in paired):
        return None

    def difference_ms(picked: Any) -> float:
        on = np.concatenate([paired[i][0] for i in picked])
        off = np.concatenate([paired[i][1] for i in picked])
        return float(np.percentile(on, 99) - np.percentile(off, 99)) * 1000

    rng = np.random.default_rng(seed)
    resampled = [difference_ms(rng.integers(0, len(paired), len(paired))) for _ in range(POOLED_RESAMPLES)]
    return {
        "itl_p99_on_minus_off_ms": round(difference_ms(range(len(paired))), 3),
        "bootstrap_5_95_ms": [round(float(np.percentile(resampled, q)), 3) for q in (5, 95)],
        "rounds": len(paired),
        "token_gaps": {"on": sum(len(on) for on, _ in paired), "off": sum(len(off) for _, off in paired)},
    }


def _best_round(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the highest throughput (the least disturbed by other load on the machine), without its raw
    token gaps."""
    best = max(runs, key=lambda r: r["load"]["output_tokens_per_s"] or 0.0)
    return {key: value for key, value in best.items() if key != "itls_s"}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 4)


def _default_checkpoint(out: Path, progress: Callable[[str], None]) -> Path:
    from engine.checkpoint import init_random_checkpoint
    from engine.config import ModelConfig

    progress(f"writing a random checkpoint (moeslo model init defaults) to {out}")
    return init_random_checkpoint(out, ModelConfig())


def _run_once(checkpoint: Path, plan: list[Any], vocab_size: int, options: ServeBenchOptions,
              *, exporters: bool) -> dict[str, Any]:
    port = free_port()
    cmd = moeslo_command("serve", "--checkpoint", str(checkpoint), "--port", str(port),
                         "--kv-cache-mb", str(options.kv_cache_mb),
                         "--max-waiting", str(max(256, options.max_in_flight)), "--model-name", "bench",
                         "--expert-metrics" if exporters else "--no-exporters")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(f"{base}/health", proc, 180.0, name="moeslo serve")
        server = psutil.Process(proc.pid)
        idle_rss = _rss(server)
        # Warm-up, on other prompts than the measured run's: the server's prefix cache would hold those.
        asyncio.run(run_load(base, plan[: min(4, len(plan))], vocab_size=vocab_size, model="bench",
                             seed=WARM_UP_SEED))  # fmt: skip
        sampler = _RssSampler(server, options.rss_interval_s)
        scrapes: list[float] = []
        stop_scrape = threading.Event()
        scraper = threading.Thread(target=_scrape_loop, args=(base, options.scrape_interval_s, stop_scrape, scrapes),
                                   daemon=True) if exporters else None
        sampler.start()
        if scraper is not None:
            scraper.start()
        started = time.monotonic()
        records: list[RequestRecord] = []
        # Bounded: an overloaded server must not stretch the run without end; unfinished requests
        # are counted, not waited for.
        limit_s = options.duration_s * 1.5 + 60.0
        timed_out = False
        try:
            asyncio.run(asyncio.wait_for(
                run_load(base, plan, vocab_size=vocab_size, model="bench", max_in_flight=options.max_in_flight,
                         seed=MEASURED_SEED, on_record=records.append),
                limit_s,
            ))
        except TimeoutError:
            timed_out = True
        wall_s = time.monotonic() - started
        stop_scrape.set()
        if scraper is not None:
            scraper.join(30)
        samples = sampler.stop()
    finally:
        stop_process(proc)
    load = summarize(records, wall_s=wall_s)
    load["unfinished_at_limit"] = len(plan) - len(records) if timed_out else 0
    return {
        "load": load,
        "itls_s": [gap for r in records if r.ok for gap in r.itls_s],  # pooled over rounds, not printed
        "rss": _rss_report(samples, idle_rss, options.kv_cache_mb),
        "metrics_get_ms": {"scrapes": len(scrapes), "p50": percentile(scrapes, 50), "max": max(scrapes, default=None)},
    }


def _scrape_loop(base: str, interval_s: float, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=base, timeout=30) as client:
        while not stop.wait(interval_s):
            start = time.perf_counter()
            client.get("/metrics").raise_for_status()
            out.append((time.perf_counter() - start) * 1000)


def _rss(proc: psutil.Process) -> int:
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += child.memory_info().rss
    return int(total)


class _RssSampler:
    """RSS of the server (and its rank processes) every ``interval_s``."""

    def __init__(self, proc: psutil.Process, interval_s: float) -> None:
        self._proc = proc
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._samples: list[tuple[float, int]] = []
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            try:
                self._samples.append((time.monotonic() - start, _rss(self._proc)))
            except psutil.NoSuchProcess:
                return
            self._stop.wait(self._interval_s)

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        self._thread.join(5)
        return self._samples


def _rss_report(samples: list[tuple[float, int]], idle_rss: int, kv_cache_mb: float) -> dict[str, Any]:
    if not samples:
        return {}
    times = np.array([t for t, _ in samples])
    rss = np.array([r for _, r in samples], dtype=np.float64) / MIB
    span = float(times[-1])
    # First vs last minute; on runs shorter than two minutes, first vs last quarter.
    window = 60.0 if span >= 120.0 else span / 4
    first = rss[times <= window]
    last = rss[times >= span - window]
    return {
        "idle_mb": round(idle_rss / MIB, 1),
        "peak_mb": round(float(rss.max()), 1),
        "peak_over_idle_mb": round(float(rss.max()) - idle_rss / MIB, 1),
        "kv_cache_budget_mb": kv_cache_mb,
        "growth_window_s": round(window, 1),
        "first_window_mean_mb": round(float(first.mean()), 1),
        "last_window_mean_mb": round(float(last.mean()), 1),
        "growth_mb": round(float(last.mean() - first.mean()), 1),
        "samples": len(samples),
    }


def render_benchmark(layers: int, experts: int, repeats: int = 20) -> dict[str, Any]:
    """/metrics render time with ``layers x experts`` expert series, against the registry alone."""
    from prometheus_client import CollectorRegistry

    from engine.stats import FinishedRequestStats, RoutingDelta, StepStats
    from exporters.prometheus import PrometheusStatsSink

    rng = np.random.default_rng(0)
    sinks = {
        "with_expert_series": PrometheusStatsSink(CollectorRegistry(), model_name="m", expert_series=True),
        "registry_only": PrometheusStatsSink(CollectorRegistry(), model_name="m", expert_series=False),
    }
    fin = FinishedRequestStats(request_id="r", finish_reason="length", prompt_tokens=10, generation_tokens=10,
                               e2e_s=1.0, queue_s=0.1, prefill_s=0.1, decode_s=0.8, ttft_s=0.2, mean_itl_s=0.02)
    for i in range(50):
        delta = RoutingDelta(expert_tokens=rng.integers(0, 100, size=(layers, experts)),
                             rank_tokens=rng.integers(0, 1000, size=(layers, 8)))
        step = StepStats(now_s=float(i), step_duration_s=0.01, num_running=8, num_waiting=1, kv_cache_usage=0.3,
                         prompt_tokens=100, generation_tokens=8, ttfts_s=(0.2,), itls_s=(0.02,) * 8,
                         finished=(fin,), routing=delta)
        for sink in sinks.values():
            sink.record(step)
    out: dict[str, Any] = {"layers": layers, "experts": experts, "baseline": "registry_only"}
    for name, sink in sinks.items():
        times = []
        size = 0
        for _ in range(repeats):
            start = time.perf_counter()
            size = len(sink.render())
            times.append((time.perf_counter() - start) * 1000)
        out[name] = {"p50_ms": round(float(np.median(times)), 2), "min_ms": round(min(times), 2),
                     "max_ms": round(max(times), 2), "bytes": size}
    out["goal_ms"] = 50.0
    return out


def sink_cost_benchmark(layers: int, experts: int, step_s: float, steps: int = 2000) -> dict[str, Any]:
    """CPU time of the Prometheus sink's ``record`` per engine step, against the step time measured."""
    from prometheus_client import CollectorRegistry

    from engine.stats import FinishedRequestStats, RoutingDelta, StepStats
    from exporters.prometheus import PrometheusStatsSink

    rng = np.random.default_rng(0)
    fin = FinishedRequestStats(request_id="r", finish_reason="length", prompt_tokens=64, generation_tokens=8,
                               e2e_s=1.0, queue_s=0.1, prefill_s=0.1, decode_s=0.8, ttft_s=0.2, mean_itl_s=0.02)
    out: dict[str, Any] = {"steps": steps, "batch": 32, "engine_step_s": step_s}
    for label, shape in (("model", (layers, experts)), ("58x256", (58, 256))):
        sink = PrometheusStatsSink(CollectorRegistry(), model_name="m", expert_series=True)
        batch = [
            StepStats(now_s=float(i), step_duration_s=step_s, num_running=32, num_waiting=2, kv_cache_usage=0.4,
                      prompt_tokens=64, generation_tokens=32, ttfts_s=(0.1,), itls_s=(0.02,) * 31,
                      finished=(fin,) if i % 8 == 0 else (),
                      routing=RoutingDelta(expert_tokens=rng.integers(0, 64, size=shape),
                                           rank_tokens=rng.integers(0, 512, size=(shape[0], 1))))
            for i in range(64)
        ]
        start = time.process_time()
        for i in range(steps):
            sink.record(batch[i % len(batch)])
        per_step_s = (time.process_time() - start) / steps
        out[label] = {"record_us_per_step": round(per_step_s * 1e6, 1),
                      "fraction_of_step": round(per_step_s / step_s, 5) if step_s else None}
    return out


__all__ = ["ServeBenchOptions", "render_benchmark", "run_serve_bench"]
