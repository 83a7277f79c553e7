"""``moeslo bench step-profile``: where one engine step's time goes (torch.profiler), by category.

Runs our executor on a checkpoint: a prefill of ``batch`` prompts, then
``steps`` decode steps under torch.profiler.  Each profiled op is put in a
category (expert GEMMs, attention, routing and MoE bookkeeping, norms and
element-wise, metadata and copies) by its name; the figures are the
self-CPU time per decode step in each, and the step's wall and CPU time.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.engine import kv_mb_needed
from engine.batch import SeqChunk, StepPlan
from engine.executors import ExecutorOptions, create_executor

CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gemm", ("mm", "bmm", "addmm", "linear", "matmul", "grouped_mm", "mkldnn")),
    ("attention", ("scaled_dot_product", "softmax", "_efficient_attention", "flash_attention", "baddbmm")),
    ("routing", ("topk", "sort", "argsort", "bincount", "cumsum", "index_add", "scatter", "repeat_interleave")),
    ("gather_copy", ("index", "copy", "cat", "stack", "gather", "clone", "contiguous", "to", "_to_copy", "empty",
                     "zeros", "full", "arange", "tensor", "lift", "select", "slice", "view", "reshape",
                     "transpose", "unsqueeze", "squeeze", "expand", "as_strided", "chunk", "split", "narrow")),
    ("elementwise", ("mul", "add", "sub", "div", "silu", "rsqrt", "pow", "mean", "rms_norm", "neg", "sum",
                     "masked_fill", "where", "lt", "le", "ge", "gt", "eq", "floor", "remainder", "bitwise")),
)


def category(op: str) -> str:
    name = op.removeprefix("aten::").lower()
    if name.startswith(("torchdynamo", "compiled", "inductor", "cpp_fused", "graph_")):
        return "compiled"
    for cat, needles in CATEGORIES:
        if any(name == n or name.startswith(n + "_") or name.startswith("_" + n) or n in name.split("_")
               for n in needles):
            return cat
    return "other"


def run(checkpoint: Path, *, batch: int = 16, prompt_len: int = 199, steps: int = 20, dtype: str = "float32",
        threads: int | None = None) -> dict[str, Any]:
    if threads:
        torch.set_num_threads(threads)
    need = -(-(prompt_len + steps + 8) // 16)
    kv_mb = kv_mb_needed(checkpoint, batch, need * 16, dtype)  # the checkpoint's model, whatever its size
    executor = create_executor(ExecutorOptions(checkpoint=checkpoint, dtype=dtype, kv_cache_mb=kv_mb,
                                               threads_per_rank=threads))
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, executor.config.vocab_size, (batch, prompt_len), generator=gen).tolist()
    tables = [tuple(range(i * need, (i + 1) * need)) for i in range(batch)]
    try:
        tokens = executor.execute(StepPlan(tuple(SeqChunk(i, 0, tuple(p), tables[i], True)
                                                 for i, p in enumerate(prompts)))).argmax(-1).tolist()
        lengths = [prompt_len] * batch

        def decode() -> None:
            nonlocal tokens
            plan = StepPlan(tuple(SeqChunk(i, lengths[i], (tokens[i],), tables[i], True) for i in range(batch)))
            tokens = executor.execute(plan).argmax(-1).tolist()
            for i in range(batch):
                lengths[i] += 1

        for _ in range(3):
            decode()
        wall, cpu = [], []
        for _ in range(steps // 2):
            w, c = time.perf_counter(), time.process_time()
            decode()
            wall.append(time.perf_counter() - w)
            cpu.append(time.process_time() - c)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(steps - steps // 2):
                decode()
    finally:
        executor.shutdown()
    by_cat: dict[str, float] = {}
    ops: list[tuple[str, float, int]] = []
    profiled = steps - steps // 2
    for evt in prof.key_averages():
        us = evt.self_cpu_time_total / profiled
        by_cat[category(evt.key)] = by_cat.get(category(evt.key), 0.0) + us
        ops.append((evt.key, us, evt.count // profiled))
    ops.sort(key=lambda o: -o[1])
    return {
        "batch": batch, "prompt_len": prompt_len, "dtype": dtype, "threads": torch.get_num_threads(),
        "step_wall_ms": {"median": round(statistics.median(wall) * 1e3, 3), "min": round(min(wall) * 1e3, 3),
                         "max": round(max(wall) * 1e3, 3)},
        "step_cpu_ms_median": round(statistics.median(cpu) * 1e3, 3),
        "self_cpu_us_per_step_by_category": {k: round(v, 1) for k, v in sorted(by_cat.items(), key=lambda i: -i[1])},
        "ops_per_step": sum(o[2] for o in ops),
        "top_ops_us_per_step": [{"op": k, "us": round(us, 1), "calls": n} for k, us, n in ops[:15]],
    }


__all__ = ["category", "run"]
