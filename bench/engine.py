"""``moeslo bench engine``: our executor against transformers' ``generate`` on the same checkpoint.

Same checkpoint, dtype, prompts and lengths; greedy; a fixed number of new
tokens (no early stop).  Figures: prefill tokens/s, decode tokens/s and
generated tokens/s (new tokens over the whole run, prefill included), at
each batch size, for transformers (the named baseline), our engine with
routing statistics on, and with them off.

The three variants run in interleaved rounds (transformers, on, off, then
the next round), so drift in the machine's load hits them alike; each
figure is the median over rounds with its min and max, and ratios are
medians of the per-round ratios.  Each engine first gets one untimed
warm-up, and transformers runs on as many threads as our rank processes use
together.  Wall time and CPU time are both recorded, the CPU time of this
process and its child processes (our rank processes with ``--ep``).  The
routing statistics' cost is given twice: end to end (on against off, per
round) and directly (the CPU time of the statistics' per-step work, one
counter add per MoE layer, against a decode step).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from bench.machine import machine
from bench.vllm_overhead import tree_cpu_s
from engine.batch import SeqChunk, StepPlan
from engine.executors import Executor, ExecutorOptions, create_executor
from engine.executors.base import default_threads


@dataclass(frozen=True, slots=True)
class RunTimes:
    prefill_s: float
    decode_s: float
    prompt_tokens: int
    new_tokens: int
    batch: int
    cpu_s: float = 0.0
    """CPU time of this process (all its threads) and its child processes over the run."""

    def figures(self) -> dict[str, float]:
        total = self.prefill_s + self.decode_s
        # The prefill step yields each sequence's first token; decode steps yield the rest.
        decode_tokens = self.new_tokens - self.batch
        return {
            "prefill_tokens_per_s": self.prompt_tokens / self.prefill_s,
            "decode_tokens_per_s": decode_tokens / self.decode_s if self.decode_s else 0.0,
            "generated_tokens_per_s": self.new_tokens / total,
            "generated_tokens_per_cpu_s": self.new_tokens / self.cpu_s if self.cpu_s else 0.0,
            "seconds": total,
        }


def make_prompts(batch: int, prompt_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, prompt_len), generator=gen).tolist()


def cpu_s() -> float:
    """CPU seconds of this process and its children: without colocated ranks, rank processes run experts too.
    This process's own share comes from the finer clock (psutil's is in ticks)."""
    return time.process_time() + sum(tree_cpu_s(child.pid) for child in psutil.Process().children())


def ours_generate(executor: Executor, prompts: list[list[int]], new_tokens: int) -> tuple[RunTimes, list[list[int]]]:
    """Static-batch greedy generation straight on the executor: one prefill step, then decode steps."""
    size = executor.block_size
    need = -(-(len(prompts[0]) + new_tokens) // size)
    tables = [tuple(range(i * need, (i + 1) * need)) for i in range(len(prompts))]
    if need * len(prompts) > executor.num_blocks:
        raise ValueError(f"KV cache too small: {executor.num_blocks} blocks, need {need * len(prompts)}")
    cpu = cpu_s()
    start = time.perf_counter()
    plan = StepPlan(tuple(SeqChunk(i, 0, tuple(p), tables[i], True) for i, p in enumerate(prompts)))
    tokens = executor.execute(plan).argmax(dim=-1).tolist()
    prefill_end = time.perf_counter()
    out = [[t] for t in tokens]
    lengths = [len(p) for p in prompts]
    for _ in range(new_tokens - 1):
        plan = StepPlan(tuple(SeqChunk(i, lengths[i], (tokens[i],), tables[i], True) for i in range(len(prompts))))
        tokens = executor.execute(plan).argmax(dim=-1).tolist()
        for i, token in enumerate(tokens):
            out[i].append(token)
            lengths[i] += 1
    end = time.perf_counter()
    times = RunTimes(
        prefill_end - start, end - prefill_end, sum(map(len, prompts)), new_tokens * len(prompts), len(prompts),
        cpu_s=cpu_s() - cpu,
    )
    return times, out


def transformers_generate(model: Any, prompts: list[list[int]], new_tokens: int) -> tuple[RunTimes, list[list[int]]]:
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        cpu = cpu_s()
        start = time.perf_counter()
        model(ids, attention_mask=mask)  # prefill alone, to split prefill from decode time
        prefill_end = time.perf_counter()
        start2 = time.perf_counter()
        result = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                do_sample=False, pad_token_id=0)
        end = time.perf_counter()
    prefill_s = prefill_end - start
    total = end - start2
    generated = result[:, ids.shape[1]:].tolist()
    # The CPU time covers the extra prefill too: take out its share.
    used = (cpu_s() - cpu) * total / (total + prefill_s)
    times = RunTimes(prefill_s, max(total - prefill_s, 1e-9), ids.numel(), new_tokens * len(prompts), len(prompts),
                     cpu_s=used)
    return times, generated


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def _summary(runs: list[RunTimes]) -> dict[str, Any]:
    figures = [r.figures() for r in runs]
    return {key: _spread([f[key] for f in figures]) for key in figures[0]}


def _paired(a: list[RunTimes], b: list[RunTimes], key: str) -> dict[str, float]:
    """Per-round ratios a/b of one figure: median, min, max."""
    return _spread([x.figures()[key] / y.figures()[key] for x, y in zip(a, b, strict=True)])


def stats_direct_cost_us(executor: Executor, batch: int, repeats: int = 2000) -> float:
    """CPU µs per step of the routing statistics' own work: one counter add per MoE layer."""
    layers = len(executor.config.sparse_layers)
    slots = executor.placement.num_slots
    counter = torch.zeros((layers, slots), dtype=torch.long)
    ids = torch.randint(0, slots, (batch, executor.config.num_experts_per_tok))
    counts = torch.bincount(ids.reshape(-1), minlength=slots)  # computed for the grouped GEMM anyway
    start = time.process_time()
    for _ in range(repeats):
        for layer in range(layers):
            counter[layer] += counts
    return (time.process_time() - start) / repeats * 1e6


Runs = list[tuple[RunTimes, list[list[int]]]]


def _batch_figures(hf_runs: Runs, on_runs: Runs, off_runs: Runs, direct_us: float) -> dict[str, Any]:
    hf, on, off = [r for r, _ in hf_runs], [r for r, _ in on_runs], [r for r, _ in off_runs]
    same = sum(a == b for a, b in zip(hf_runs[0][1], on_runs[0][1], strict=True))
    on_over_off = _paired(on, off, "generated_tokens_per_s")
    steps = on[0].new_tokens // on[0].batch
    decode_step_s = statistics.median(r.decode_s / max(1, steps - 1) for r in off)
    return {
        "transformers": _summary(hf),
        "moeslo_stats_on": _summary(on),
        "moeslo_stats_off": _summary(off),
        "speedup_vs_transformers": _paired(on, hf, "generated_tokens_per_s")["median"],
        "speedup_vs_transformers_rounds": _paired(on, hf, "generated_tokens_per_s"),
        "speedup_vs_transformers_cpu_time": _paired(on, hf, "generated_tokens_per_cpu_s"),
        "decode_speedup_vs_transformers": _paired(on, hf, "decode_tokens_per_s"),
        "prefill_speedup_vs_transformers": _paired(on, hf, "prefill_tokens_per_s")["median"],
        "stats_cost_fraction": round(1 - on_over_off["median"], 4),
        "stats_cost_fraction_rounds": {"median": round(1 - on_over_off["median"], 4),
                                       "min": round(1 - on_over_off["max"], 4),
                                       "max": round(1 - on_over_off["min"], 4)},
        "stats_cost_fraction_cpu_time": round(1 - _paired(on, off, "generated_tokens_per_cpu_s")["median"], 4),
        "stats_cost_direct": {"us_per_step": round(direct_us, 2), "decode_step_s": round(decode_step_s, 6),
                              "fraction_of_decode_step": round(direct_us * 1e-6 / decode_step_s, 5)},
        "greedy_sequences_identical_to_transformers": f"{same}/{len(hf_runs[0][1])}",
    }


def run(
    checkpoint: Path,
    *,
    batches: tuple[int, ...] = (1, 16),
    prompt_len: int = 199,
    new_tokens: int = 32,
    dtype: str = "float32",
    repeats: int = 3,
    ep: int = 1,
    colocate_ranks: bool = False,
    threads: int | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """``threads``: torch threads per rank of our engine (None: the affinity set, shared among rank processes);
    transformers gets as many threads as our ranks use together (by default no more than the affinity set)."""
    import transformers

    ours_threads = thread_counts(ep, colocate_ranks, threads)
    baseline_threads = ours_threads["total"] if threads else min(ours_threads["total"], default_threads(1))
    torch.set_num_threads(baseline_threads)

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf = transformers.Qwen3MoeForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, dtype))
    hf.eval()  # type: ignore[no-untyped-call]
    max_batch = max(batches)
    kv_mb = kv_mb_needed(checkpoint, max_batch, prompt_len + new_tokens, dtype)
    executor_options = ExecutorOptions(checkpoint=checkpoint, dtype=dtype, kv_cache_mb=kv_mb, ep=ep,
                                       colocate_ranks=colocate_ranks, threads_per_rank=ours_threads["per_rank"])
    executor = create_executor(executor_options)
    results: dict[str, Any] = {"checkpoint": str(checkpoint), "dtype": dtype, "prompt_len": prompt_len,
                               "new_tokens": new_tokens, "ep": ep, "colocate_ranks": colocate_ranks,
                               "transformers_threads": baseline_threads, "moeslo_threads": ours_threads,
                               "parallel_min_tokens": executor_options.parallel_min_tokens,
                               "baseline": "transformers.generate", "batches": {},
                               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
                               "machine": machine()}
    try:
        # Untimed warm-ups of both engines: first-call costs (allocations, kernel choice) land in no round.
        warm = make_prompts(2, 16, executor.config.vocab_size)
        torch.set_num_threads(baseline_threads)  # the executor set its own
        transformers_generate(hf, warm, 2)
        ours_generate(executor, warm, 2)
        for batch in batches:
            prompts = make_prompts(batch, prompt_len, executor.config.vocab_size)
            runs = _rounds(hf, executor, prompts, new_tokens, repeats, baseline_threads, progress, f"batch {batch}")
            results["batches"][str(batch)] = _batch_figures(*runs, stats_direct_cost_us(executor, batch))
    finally:
        executor.shutdown()
    return results


def _rounds(hf: Any, executor: Executor, prompts: list[list[int]], new_tokens: int, repeats: int,
            baseline_threads: int, progress: Callable[[str], None], label: str) -> tuple[Runs, Runs, Runs]:  # fmt: skip
    """Interleaved rounds: transformers, ours with routing statistics on, off."""
    hf_runs: Runs = []
    on_runs: Runs = []
    off_runs: Runs = []
    for round_ in range(repeats):
        progress(f"{label}, round {round_ + 1}/{repeats}: transformers, moeslo stats on, off")
        # Our executor runs small steps on one thread (torch's setting is per process): transformers
        # gets its threads back for each of its runs.
        torch.set_num_threads(baseline_threads)
        hf_runs.append(transformers_generate(hf, prompts, new_tokens))
        executor.set_routing_stats(True)
        on_runs.append(ours_generate(executor, prompts, new_tokens))
        executor.set_routing_stats(False)
        off_runs.append(ours_generate(executor, prompts, new_tokens))
    return hf_runs, on_runs, off_runs


def thread_counts(ep: int, colocate_ranks: bool, threads: int | None) -> dict[str, int]:
    """Our engine's torch threads: per rank process, rank processes, in total (colocated ranks are one process)."""
    ranks = 1 if colocate_ranks else ep
    per_rank = threads or default_threads(ranks)
    return {"per_rank": per_rank, "ranks": ranks, "total": per_rank * ranks}


def kv_mb_needed(checkpoint: Path, batch: int, tokens: int, dtype: str) -> float:
    """The KV cache (MiB) for ``batch`` sequences of ``tokens`` each on the checkpoint's model, with a margin."""
    from engine.config import ModelConfig

    cfg = ModelConfig.load(checkpoint)
    elem = 4 if dtype == "float32" else 2
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * elem
    return per_token * batch * (tokens + 32) * 1.1 / 2**20 + 1
