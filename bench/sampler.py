"""``moeslo bench sampler``: the engine's batched sampler against drawing one row at a time (the baseline).

The baseline is the sampler as it was before it drew a batch at once: every
sampled row on its own (temperature, ``min_p``, ``top_k``, a full sort for
``top_p``, ``torch.multinomial`` on the row's seeded generator).  Both run on the
same logits in interleaved rounds, in CPU time on one thread; ratios are the
medians of the per-round ratios.  Logits are random normal, "flat" as they
come or "peaked" (times 4: a trained model's few likely tokens), over the
default checkpoint's vocabulary and over Qwen3's (151,936 tokens).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.sampling import MIN_TEMPERATURE, RequestSampler, SamplingParams, TokenHistory, adjust_logits, sample_each

WORKLOADS: dict[str, SamplingParams] = {
    "temperature 1": SamplingParams(temperature=1.0),
    "Qwen3 defaults (0.6, top_k 20, top_p 0.95)": SamplingParams(temperature=0.6, top_k=20, top_p=0.95),
    "top_p 0.8": SamplingParams(temperature=0.7, top_p=0.8),
    "repetition penalty 1.05": SamplingParams(temperature=0.7, repetition_penalty=1.05),
}
SHAPES = {"flat": 1.0, "peaked": 4.0}


@dataclass(frozen=True, slots=True)
class SamplerBenchConfig:
    batch: int = 16
    vocab_sizes: tuple[int, ...] = (4096, 151_936)
    rounds: int = 5
    steps: int = 10

    def __post_init__(self) -> None:
        if min(self.batch, self.rounds, self.steps, *self.vocab_sizes) < 1:
            raise ValueError("batch, rounds, steps and vocabulary sizes must be at least 1")


def one_row_at_a_time(logits: torch.Tensor, samplers: list[RequestSampler],
                      histories: Sequence[TokenHistory]) -> list[int]:  # fmt: skip
    """The baseline: each row adjusted, filtered and drawn on its own."""
    tokens = []
    for row, sampler in enumerate(samplers):
        params = sampler.params
        row_logits = adjust_logits(logits[row], params, histories[row]) if params.adjusts_logits else logits[row]
        scaled = (row_logits.float() - row_logits.max()) / max(params.temperature, MIN_TEMPERATURE)
        if params.min_p > 0.0:
            scaled = scaled.masked_fill(scaled < scaled.max() + math.log(params.min_p), float("-inf"))
        if 0 < params.top_k < scaled.shape[-1]:
            scaled = scaled.masked_fill(scaled < torch.topk(scaled, params.top_k).values[-1], float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if params.top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True)
            drop = (torch.cumsum(ordered, dim=-1) - ordered) >= params.top_p
            drop[..., 0] = False
            probs = torch.zeros_like(probs).scatter(-1, order, ordered.masked_fill(drop, 0.0))
        tokens.append(int(torch.multinomial(probs, 1, generator=sampler.generator()).item()))
    return tokens


def _cpu_ms(run: Callable[[], object], steps: int) -> float:
    run()  # warm: the first call allocates
    start = time.process_time()
    for _ in range(steps):
        run()
    return (time.process_time() - start) / steps * 1000


def _case(cfg: SamplerBenchConfig, vocab: int, scale: float, params: SamplingParams) -> dict[str, Any]:
    logits = torch.randn(cfg.batch, vocab, generator=torch.Generator().manual_seed(vocab)) * scale
    samplers = [RequestSampler(params) for _ in range(cfg.batch)]
    histories = [TokenHistory(tuple(i % vocab for i in range(200)), tuple(i % vocab for i in range(50)))] * cfg.batch
    ours, base = [], []
    for _ in range(cfg.rounds):
        base.append(_cpu_ms(lambda: one_row_at_a_time(logits, samplers, histories), cfg.steps))
        ours.append(_cpu_ms(lambda: sample_each(logits, samplers, histories), cfg.steps))
    ratios = [o / b for o, b in zip(ours, base, strict=True)]
    return {"batched_ms": _spread(ours), "one_row_at_a_time_ms": _spread(base),
            "batched_over_one_row_at_a_time": _spread(ratios)}


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def run(cfg: SamplerBenchConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """CPU ms per batch of draws, ours and the baseline, per vocabulary, logit shape and sampling setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cases = []
        for vocab in cfg.vocab_sizes:
            for shape, scale in SHAPES.items():
                for name, params in WORKLOADS.items():
                    progress(f"vocabulary {vocab:,}, {shape} logits, {name}")
                    cases.append({"vocab_size": vocab, "logits": shape, "sampling": name,
                                  **_case(cfg, vocab, scale, params)})
    finally:
        torch.set_num_threads(threads)
    return {"baseline": "one_row_at_a_time", "batch": cfg.batch, "rounds": cfg.rounds,
            "steps_per_round": cfg.steps, "threads": 1, "time": "CPU", "cases": cases}


__all__ = ["SHAPES", "WORKLOADS", "SamplerBenchConfig", "one_row_at_a_time", "run"]
