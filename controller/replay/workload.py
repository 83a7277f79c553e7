"""What a replay runs on: a trace turned into per-tick offered load (and its requests in request mode)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from contracts.errors import ValidationError
from contracts.traces import CountTrace, FloatArray, IntArray, LengthDistribution, RequestTrace, load_trace
from controller.replay.fleet import tick_loads
from controller.replay.fluid import count_loads
from controller.replay.lengths import resolve_lengths
from controller.replay.world import World, perturb_lengths, perturb_trace

Mode = Literal["request", "fluid"]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Per-tick offered load, and the requests themselves in request mode."""

    name: str
    tick_s: float
    rates_rps: FloatArray
    prompt_tokens_per_s: FloatArray
    output_tokens_per_s: FloatArray
    requests: RequestTrace | None = None
    prompt_samples: IntArray | None = None
    """Prompt lengths the load is made of (the trace's, or the length distribution's): the true tail."""

    @property
    def ticks(self) -> int:
        return len(self.rates_rps)

    @property
    def duration_s(self) -> float:
        return self.ticks * self.tick_s

    @property
    def total_tokens(self) -> float:
        return float((self.prompt_tokens_per_s + self.output_tokens_per_s).sum() * self.tick_s)


def make_workload(
    trace: RequestTrace | CountTrace,
    *,
    tick_s: float,
    mode: Mode,
    lengths: LengthDistribution | None = None,
    seed: int = 0,
    world: World | None = None,
) -> Workload:
    """Per-tick loads of a trace as the true ``world`` sends it; request mode expands count traces first."""
    if isinstance(trace, CountTrace):
        if lengths is None:
            raise ValueError("a count trace needs a length distribution")
        if world is not None:
            lengths = perturb_lengths(lengths, world)
        if mode == "request":
            trace = trace.expand(lengths, seed=seed)
        else:
            rates, prompt, output = count_loads(
                trace.counts, trace.bin_s, tick_s, lengths.mean_prompt_tokens, lengths.mean_output_tokens
            )
            return Workload(
                name=trace.source,
                tick_s=tick_s,
                rates_rps=rates,
                prompt_tokens_per_s=prompt,
                output_tokens_per_s=output,
                prompt_samples=lengths.prompt_tokens,
            )
    elif world is not None:
        trace = perturb_trace(trace, world)
    n_ticks = max(1, math.ceil((trace.duration_s + 1e-9) / tick_s))
    rates, prompt, output = tick_loads(trace, tick_s, n_ticks)
    return Workload(
        name=trace.source,
        tick_s=tick_s,
        rates_rps=rates,
        prompt_tokens_per_s=prompt,
        output_tokens_per_s=output,
        requests=trace if mode == "request" else None,
        prompt_samples=trace.prompt_tokens,
    )


def prepare_workload(
    trace_path: Path,
    *,
    tick_s: float,
    mode: str,
    lengths: str,
    speedup: float,
    rate_scale: float,
    start_s: float,
    duration_s: float | None,
    tokens_per_s: float | None,
    seed: int,
    world: World | None = None,
) -> Workload:
    """Load, window, speed up and scale a trace into a :class:`Workload`."""
    trace: RequestTrace | CountTrace = load_trace(trace_path)
    length_dist = resolve_lengths(lengths) if isinstance(trace, CountTrace) else None
    if isinstance(trace, CountTrace):
        if start_s or duration_s is not None:
            first = int(start_s // trace.bin_s)
            last = len(trace.counts) if duration_s is None else first + int(duration_s // trace.bin_s)
            trace = CountTrace(trace.source, trace.bin_s, trace.counts[first:last], trace.start_epoch_s)
    elif start_s or duration_s is not None:
        trace = trace.window(start_s, start_s + (duration_s if duration_s is not None else trace.duration_s))
    if tokens_per_s is not None:
        # Scale the rate so the mean prompt + output tokens/s match the target.
        if isinstance(trace, CountTrace):
            assert length_dist is not None
            per_request = length_dist.mean_prompt_tokens + length_dist.mean_output_tokens
            current = trace.total_requests * per_request / trace.duration_s
        else:
            current = float(trace.prompt_tokens.sum() + trace.output_tokens.sum()) / max(trace.duration_s, 1e-9)
        if not current > 0:
            raise ValidationError("--tokens-per-s: the part of the trace replayed has no tokens to scale")
        rate_scale *= tokens_per_s / current
    if speedup != 1.0:
        trace = trace.speedup(speedup)
    if rate_scale != 1.0:
        trace = trace.rate_scale(rate_scale, seed=seed)
    if mode == "auto":
        mode = "fluid" if isinstance(trace, CountTrace) else "request"
    if mode not in ("request", "fluid"):
        raise ValidationError(f"mode must be request, fluid or auto, got {mode!r}")
    return make_workload(
        trace, tick_s=tick_s, mode=mode, lengths=length_dist, seed=seed, world=world  # type: ignore[arg-type]
    )


__all__ = ["Mode", "Workload", "make_workload", "prepare_workload"]
