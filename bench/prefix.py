"""``moeslo bench prefix``: what prefix caching buys on a shared prefix, and what it costs without reuse.

Runs the engine core in this process on one executor (a fresh core, so a
fresh cache, per measured run; the executor's KV tensors are reused).

* **TTFT with a cached prefix.**  A request whose ``prompt_tokens``-token
  prompt starts with a ``shared_tokens``-token prefix that an earlier request
  left in the cache, against the same request on an empty cache (the named
  baseline, ``cold``).  Each round draws new tokens; the two variants
  alternate which runs first, so drift in the machine's load hits both alike.
  Greedy first tokens of both are compared (cache hits must not change them).
* **Overhead without reuse.**  A batch of requests with unrelated random
  prompts, served to the end with prefix caching on and off (the baseline),
  in interleaved rounds: generated tokens/s and all tokens/s (prompt +
  generated) over the run's wall time.  Because whole runs spread more than
  the cost can be, the cost is also measured where it is paid: every piece
  of prefix caching's work (hashing full blocks, the lookup, keying computed
  blocks, returning freed ones to the LRU) runs inside the scheduler's
  ``schedule`` and ``finish``, so the time spent there with caching on, less
  the time with it off, over the run's wall time, is its share.

Each figure is the median over rounds with its min and max; ratios are
medians of the per-round ratios.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.config import ModelConfig
from engine.core import EngineCore
from engine.engine_types import EngineConfig
from engine.executors import Executor, ExecutorOptions, create_executor
from engine.executors.options import PARALLEL_MIN_TOKENS
from engine.sampling import SamplingParams
from engine.scheduler import SchedulerConfig

TTFT_GOAL_RATIO = 0.35
OVERHEAD_GOAL_FRACTION = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixBenchConfig:
    prompt_tokens: int = 2048
    """Prompt of the measured request."""
    shared_tokens: int = 1536
    """Of which this many leading tokens are cached by an earlier request."""
    rounds: int = 5
    requests: int = 32
    """Requests of the no-reuse workload."""
    request_prompt_tokens: int = 256
    new_tokens: int = 32
    """Tokens generated per request of the no-reuse workload (greedy, no early stop)."""
    max_num_batched_tokens: int = 512
    dtype: str = "float32"
    threads: int | None = None

    def __post_init__(self) -> None:
        problems = [f"{name} must be >= 1, got {getattr(self, name)}"
                    for name in ("prompt_tokens", "rounds", "requests", "request_prompt_tokens", "new_tokens",
                                 "max_num_batched_tokens") if getattr(self, name) < 1]
        if not 0 < self.shared_tokens < self.prompt_tokens:
            problems.append(f"shared_tokens must be in (0, prompt_tokens), got {self.shared_tokens}")
        if problems:
            raise ValueError("; ".join(problems))


def _core(executor: Executor, cfg: PrefixBenchConfig, caching: bool) -> EngineCore:
    scheduler = SchedulerConfig(max_num_batched_tokens=cfg.max_num_batched_tokens, max_num_seqs=cfg.requests,
                                max_waiting=max(256, cfg.requests))
    return EngineCore(executor, EngineConfig(scheduler=scheduler, enable_prefix_caching=caching))


@dataclass(slots=True)
class Served:
    ttft_s: float = 0.0
    """Seconds from submitting to the first token of the first prompt."""
    wall_s: float = 0.0
    first_tokens: list[int] = field(default_factory=list)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    scheduler_s: float = 0.0
    """Seconds inside the scheduler's ``schedule`` and ``finish`` (where prefix caching's work is done)."""


def _timed_scheduler(core: EngineCore, served: Served) -> None:
    """Count the time ``core``'s scheduler spends scheduling and finishing into ``served.scheduler_s``."""
    scheduler = core.scheduler
    for name in ("schedule", "finish"):
        method = getattr(scheduler, name)

        def timed(*args: Any, _method: Callable[..., Any] = method) -> Any:
            start = time.perf_counter()
            try:
                return _method(*args)
            finally:
                served.scheduler_s += time.perf_counter() - start

        setattr(scheduler, name, timed)


def _serve(core: EngineCore, prompts: list[list[int]], max_tokens: int, *, time_scheduler: bool = False) -> Served:
    """Serve ``prompts`` together to the end (timing the scheduler's calls only where asked: a TTFT run takes no
    timer, so the hit and cold runs carry the same work)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    served = Served()
    if time_scheduler:
        _timed_scheduler(core, served)
    start = time.perf_counter()
    for index, prompt in enumerate(prompts):
        core.add_request(f"q{index}", prompt, params)
    first: dict[str, int] = {}
    while core.has_work():
        result = core.step()
        if result.stats is not None:
            served.prefix_cache_queries += result.stats.prefix_cache_queries
            served.prefix_cache_hits += result.stats.prefix_cache_hits
        for out in result.outputs:
            if out.token_id is not None and out.request_id not in first:
                first[out.request_id] = out.token_id
                if out.request_id == "q0":
                    served.ttft_s = time.perf_counter() - start
    served.wall_s = time.perf_counter() - start
    served.first_tokens = [first[f"q{i}"] for i in range(len(prompts))]
    return served


def _tokens(gen: torch.Generator, n: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def _ttft_round(executor: Executor, cfg: PrefixBenchConfig, gen: torch.Generator, hit_first: bool) -> dict[str, Any]:
    vocab = executor.config.vocab_size
    prefix = _tokens(gen, cfg.shared_tokens, vocab)
    target = [*prefix, *_tokens(gen, cfg.prompt_tokens - cfg.shared_tokens, vocab)]
    warm = [*prefix, *_tokens(gen, cfg.prompt_tokens - cfg.shared_tokens, vocab)]
    out: dict[str, Any] = {}
    for variant in (("hit", "cold") if hit_first else ("cold", "hit")):
        core = _core(executor, cfg, caching=True)
        if variant == "hit":
            _serve(core, [warm], 1)  # leaves the shared prefix in the cache
        served = _serve(core, [target], 1)
        out[variant] = {"ttft_s": served.ttft_s, "first_token": served.first_tokens[0],
                        "hit_tokens": served.prefix_cache_hits}
    return out


def _throughput_round(executor: Executor, cfg: PrefixBenchConfig, prompts: list[list[int]],
                      on_first: bool) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for caching in ((True, False) if on_first else (False, True)):
        served = _serve(_core(executor, cfg, caching), prompts, cfg.new_tokens, time_scheduler=True)
        wall = served.wall_s
        generated = len(prompts) * cfg.new_tokens
        out["on" if caching else "off"] = {
            "generated_tokens_per_s": generated / wall,
            "tokens_per_s": (generated + sum(map(len, prompts))) / wall,
            "seconds": wall, "scheduler_seconds": served.scheduler_s,
            "prefix_cache_queries": served.prefix_cache_queries,
            "prefix_cache_hits": served.prefix_cache_hits,
        }
    return out


def _spread(values: list[float], digits: int = 4) -> dict[str, float]:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def _kv_mb(model: ModelConfig, tokens: int, dtype: str) -> float:
    elem = 4 if dtype == "float32" else 2
    per_token = model.num_hidden_layers * 2 * model.num_key_value_heads * model.head_dim * elem
    return per_token * tokens * 1.2 / 2**20 + 1


def run(checkpoint: Path, cfg: PrefixBenchConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    from engine.executors.base import default_threads

    threads = cfg.threads or default_threads(1)
    torch.set_num_threads(threads)
    model = ModelConfig.load(checkpoint)
    tokens = max(2 * cfg.prompt_tokens, cfg.requests * (cfg.request_prompt_tokens + cfg.new_tokens)) + 64
    executor = create_executor(ExecutorOptions(checkpoint=checkpoint, dtype=cfg.dtype,
                                               kv_cache_mb=_kv_mb(model, tokens, cfg.dtype),
                                               threads_per_rank=cfg.threads))
    gen = torch.Generator().manual_seed(0)
    try:
        # Warm-up: one untimed round of each part, so first-use costs of these shapes land in no figure.
        _ttft_round(executor, cfg, gen, hit_first=True)
        _throughput_round(executor, cfg, [_tokens(gen, cfg.request_prompt_tokens, model.vocab_size)
                                          for _ in range(cfg.requests)], on_first=True)
        ttft_rounds, tput_rounds = [], []
        for round_ in range(cfg.rounds):
            progress(f"round {round_ + 1}/{cfg.rounds}: TTFT with a cached prefix and cold")
            ttft_rounds.append(_ttft_round(executor, cfg, gen, hit_first=round_ % 2 == 0))
            progress(f"round {round_ + 1}/{cfg.rounds}: no-reuse workload, prefix caching on and off")
            prompts = [_tokens(gen, cfg.request_prompt_tokens, model.vocab_size) for _ in range(cfg.requests)]
            tput_rounds.append(_throughput_round(executor, cfg, prompts, on_first=round_ % 2 == 0))
    finally:
        executor.shutdown()
    return _report(cfg, checkpoint, threads, ttft_rounds, tput_rounds)


def _report(cfg: PrefixBenchConfig, checkpoint: Path, threads: int, ttft_rounds: list[dict[str, Any]],
            tput_rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    ratios = [r["hit"]["ttft_s"] / r["cold"]["ttft_s"] for r in ttft_rounds]
    on_over_off = [r["on"]["generated_tokens_per_s"] / r["off"]["generated_tokens_per_s"] for r in tput_rounds]
    overhead = [1 - x for x in on_over_off]
    bookkeeping = [(r["on"]["scheduler_seconds"] - r["off"]["scheduler_seconds"]) / r["on"]["seconds"]
                   for r in tput_rounds]  # fmt: skip
    return {
        "checkpoint": str(checkpoint), "dtype": cfg.dtype,
        # A large step's threads: steps under PARALLEL_MIN_TOKENS tokens run on one, so the process's
        # setting after the last step says nothing about the prefills measured.
        "threads": threads, "parallel_min_tokens": PARALLEL_MIN_TOKENS,
        "rounds": cfg.rounds, "max_num_batched_tokens": cfg.max_num_batched_tokens,
        "ttft": {
            "baseline": "cold (the same request on an empty cache)",
            "prompt_tokens": cfg.prompt_tokens, "shared_tokens": cfg.shared_tokens,
            "hit_ttft_s": _spread([r["hit"]["ttft_s"] for r in ttft_rounds]),
            "cold_ttft_s": _spread([r["cold"]["ttft_s"] for r in ttft_rounds]),
            "ratio_hit_over_cold": _spread(ratios),
            "goal_ratio": TTFT_GOAL_RATIO,
            "meets_goal": statistics.median(ratios) <= TTFT_GOAL_RATIO,
            "hit_tokens": [r["hit"]["hit_tokens"] for r in ttft_rounds],
            "first_tokens_identical": f"{sum(r['hit']['first_token'] == r['cold']['first_token'] for r in ttft_rounds)}"
                                      f"/{len(ttft_rounds)}",
        },
        "no_reuse_overhead": {
            "baseline": "prefix caching off",
            "requests": cfg.requests, "request_prompt_tokens": cfg.request_prompt_tokens,
            "new_tokens": cfg.new_tokens,
            "on_generated_tokens_per_s": _spread([r["on"]["generated_tokens_per_s"] for r in tput_rounds], 1),
            "off_generated_tokens_per_s": _spread([r["off"]["generated_tokens_per_s"] for r in tput_rounds], 1),
            "ratio_on_over_off": _spread(on_over_off),
            "overhead_fraction": _spread(overhead),
            "goal_overhead_fraction": OVERHEAD_GOAL_FRACTION,
            "meets_goal": statistics.median(overhead) <= OVERHEAD_GOAL_FRACTION,
            "scheduler_ms_on": _spread([1000 * r["on"]["scheduler_seconds"] for r in tput_rounds], 2),
            "scheduler_ms_off": _spread([1000 * r["off"]["scheduler_seconds"] for r in tput_rounds], 2),
            "bookkeeping_fraction": _spread(bookkeeping, 5),
            "bookkeeping_meets_goal": statistics.median(bookkeeping) <= OVERHEAD_GOAL_FRACTION,
            "prefix_cache_hits_on": sum(int(r["on"]["prefix_cache_hits"]) for r in tput_rounds),
            "prefix_cache_queries_on": sum(int(r["on"]["prefix_cache_queries"]) for r in tput_rounds),
        },
    }


__all__ = ["PrefixBenchConfig", "run"]
