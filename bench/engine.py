"""``moeslo bench engine``: our executor against transformers' ``generate`` on the same checkpoint.

Same checkpoint, dtype, prompts and lengths; greedy; a fixed number of new
tokens (no early stop).  Figures: prefill tokens/s, decode tokens/s and
generated tokens/s (new tokens over the whole run, prefill included), at
each batch size, for transformers (the named baseline), our engine with
routing statistics on, and with them off.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.batch import SeqChunk, StepPlan
from engine.executors import Executor, ExecutorOptions, create_executor


@dataclass(frozen=True, slots=True)
class RunTimes:
    prefill_s: float
    decode_s: float
    prompt_tokens: int
    new_tokens: int
    batch: int

    def figures(self) -> dict[str, float]:
        total = self.prefill_s + self.decode_s
        # The prefill step yields each sequence's first token; decode steps yield the rest.
        decode_tokens = self.new_tokens - self.batch
        return {
            "prefill_tokens_per_s": self.prompt_tokens / self.prefill_s,
            "decode_tokens_per_s": decode_tokens / self.decode_s if self.decode_s else 0.0,
            "generated_tokens_per_s": self.new_tokens / total,
            "seconds": total,
        }


def make_prompts(batch: int, prompt_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, prompt_len), generator=gen).tolist()


def ours_generate(executor: Executor, prompts: list[list[int]], new_tokens: int) -> tuple[RunTimes, list[list[int]]]:
    """Static-batch greedy generation straight on the executor: one prefill step, then decode steps."""
    size = executor.block_size
    need = -(-(len(prompts[0]) + new_tokens) // size)
    tables = [tuple(range(i * need, (i + 1) * need)) for i in range(len(prompts))]
    if need * len(prompts) > executor.num_blocks:
        raise ValueError(f"KV cache too small: {executor.num_blocks} blocks, need {need * len(prompts)}")
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
        prefill_end - start, end - prefill_end, sum(map(len, prompts)), new_tokens * len(prompts), len(prompts)
    )
    return times, out


def transformers_generate(model: Any, prompts: list[list[int]], new_tokens: int) -> tuple[RunTimes, list[list[int]]]:
    ids = torch.tensor(prompts)
    mask = torch.ones_like(ids)
    with torch.no_grad():
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
    times = RunTimes(prefill_s, max(total - prefill_s, 1e-9), ids.numel(), new_tokens * len(prompts), len(prompts))
    return times, generated


def _best(runs: list[RunTimes]) -> RunTimes:
    """The median run by total time (robust to a busy machine)."""
    ordered = sorted(runs, key=lambda r: r.prefill_s + r.decode_s)
    return ordered[len(ordered) // 2]


def run(
    checkpoint: Path,
    *,
    batches: tuple[int, ...] = (1, 16),
    prompt_len: int = 199,
    new_tokens: int = 32,
    dtype: str = "float32",
    repeats: int = 3,
    ep: int = 1,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf = transformers.Qwen3MoeForCausalLM.from_pretrained(checkpoint, dtype=getattr(torch, dtype))
    hf.eval()  # type: ignore[no-untyped-call]
    max_batch = max(batches)
    kv_mb = _kv_mb_needed(checkpoint, max_batch, prompt_len + new_tokens, dtype)
    executor = create_executor(ExecutorOptions(checkpoint=checkpoint, dtype=dtype, kv_cache_mb=kv_mb, ep=ep))
    results: dict[str, Any] = {"checkpoint": str(checkpoint), "dtype": dtype, "prompt_len": prompt_len,
                               "new_tokens": new_tokens, "ep": ep, "threads": torch.get_num_threads(),
                               "baseline": "transformers.generate", "batches": {}}
    try:
        for batch in batches:
            prompts = make_prompts(batch, prompt_len, executor.config.vocab_size)
            progress(f"batch {batch}: transformers")
            hf_runs = [transformers_generate(hf, prompts, new_tokens) for _ in range(repeats)]
            theirs = _best([r for r, _ in hf_runs])
            progress(f"batch {batch}: moeslo (routing stats on)")
            executor.set_routing_stats(True)
            on_runs = [ours_generate(executor, prompts, new_tokens) for _ in range(repeats)]
            progress(f"batch {batch}: moeslo (routing stats off)")
            executor.set_routing_stats(False)
            off_runs = [ours_generate(executor, prompts, new_tokens) for _ in range(repeats)]
            on, off = _best([r for r, _ in on_runs]), _best([r for r, _ in off_runs])
            same = sum(a == b for a, b in zip(hf_runs[0][1], on_runs[0][1], strict=True))
            figures_on, figures_off, figures_hf = on.figures(), off.figures(), theirs.figures()
            results["batches"][str(batch)] = {
                "transformers": figures_hf,
                "moeslo_stats_on": figures_on,
                "moeslo_stats_off": figures_off,
                "speedup_vs_transformers": figures_on["generated_tokens_per_s"] / figures_hf["generated_tokens_per_s"],
                "prefill_speedup_vs_transformers": figures_on["prefill_tokens_per_s"]
                / figures_hf["prefill_tokens_per_s"],
                "stats_cost_fraction": 1 - statistics.fmean(
                    [r.new_tokens / (r.prefill_s + r.decode_s) for r, _ in on_runs]
                ) / statistics.fmean([r.new_tokens / (r.prefill_s + r.decode_s) for r, _ in off_runs]),
                "greedy_sequences_identical_to_transformers": f"{same}/{batch}",
            }
    finally:
        executor.shutdown()
    return results


def _kv_mb_needed(checkpoint: Path, batch: int, tokens: int, dtype: str) -> float:
    from engine.config import ModelConfig

    cfg = ModelConfig.load(checkpoint)
    elem = 4 if dtype == "float32" else 2
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * elem
    return per_token * batch * (tokens + 32) * 1.1 / 2**20 + 1
