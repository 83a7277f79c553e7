"""The load ``moeslo up`` sends: a real day's rise of traffic, sized from the replica it measured.

The bundled trace is a day of the Azure LLM inference trace 2024 (request counts
per 10 s); its morning rise (04:00 to 16:00 by default, about 1.9x from trough to
peak) is compressed into the run, arriving evenly by default (the day's shape as a large
service saw it, without the counting noise of scaling it down), with prompt and output lengths
drawn from the Azure 2023 conversation trace and scaled down for a small CPU model.  The rate is
set from the profile the stack measured on the first replica: the quiet start is
``base_load`` of what one replica sustains within the objectives, so the rise
needs a second replica, and the forecast has a real ramp to scale ahead of.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection

import httpx
import numpy as np

from contracts.errors import ValidationError
from contracts.traces import CountTrace, LengthDistribution, Trace, load_request_trace, load_trace
from controller.capacity import CapacityModel, Load, ReplicaProfile
from harness.loadgen import LoadRequest, RequestRecord, plan_from_counts, plan_from_trace, send_request
from harness.traces import DAILY_RAMP, conversation_trace
from stack.state import StackOptions, StackState

__all__ = [
    "COUNT_TRACE_OPTIONS", "MAX_OUTPUT_TOKENS", "MAX_PROMPT_TOKENS", "REQUEST_TRACE_OPTIONS", "UNFINISHED_ERROR",
    "check_trace",
    "count_window", "demo_length_pairs", "demo_lengths", "drive", "load_plan", "sustainable_rate_rps",
]

MAX_PROMPT_TOKENS = 512
MAX_OUTPUT_TOKENS = 64
UNFINISHED_ERROR = "unfinished: still in flight when the load ended"
DAY_S = 86_400.0


def demo_lengths(options: StackOptions) -> tuple[LengthDistribution, float, float]:
    """The (scaled) length distribution and its mean prompt and output tokens after scaling and clipping."""
    lengths = LengthDistribution.from_trace(load_request_trace(conversation_trace()))
    pairs = demo_length_pairs(options, lengths)
    return lengths, float(np.mean([p for p, _ in pairs])), float(np.mean([o for _, o in pairs]))


def demo_length_pairs(options: StackOptions, lengths: LengthDistribution | None = None) -> list[tuple[int, int]]:
    """Every (prompt, output) length pair of the trace, scaled and clipped as the load sends them."""
    lengths = lengths or LengthDistribution.from_trace(load_request_trace(conversation_trace()))
    prompt = np.clip(np.round(lengths.prompt_tokens * options.length_scale), 1, MAX_PROMPT_TOKENS)
    output = np.clip(np.round(lengths.output_tokens * options.length_scale), 1, MAX_OUTPUT_TOKENS)
    return [(int(p), int(o)) for p, o in zip(prompt, output, strict=True)]


def sustainable_rate_rps(profile: ReplicaProfile, *, prompt_tokens: float, output_tokens: float) -> float:
    """The request rate one replica serves within the objectives (with the capacity model's headroom)."""
    model = CapacityModel(profile)

    def fits(rate: float) -> bool:
        return model.replicas_needed(
            Load(request_rate_rps=rate, prompt_tokens_per_s=rate * prompt_tokens,
                 output_tokens_per_s=rate * output_tokens)
        ) <= 1

    low, high = 0.0, 1.0
    while fits(high) and high < 1e6:
        low, high = high, high * 2
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def count_window(options: StackOptions, trace: CountTrace) -> str:
    """The hours of a count trace the run replays (``04:00-16:00 UTC``)."""
    return _window(options, trace)[1]


def _window(options: StackOptions, trace: CountTrace) -> tuple[float, str]:
    """Where the replayed window starts (seconds from the trace's first bin), and its name.

    By the trace's clock where it has timestamps and holds the window whole (a trace starting at 06:00 was
    replayed from 10:00 and called 04:00-16:00), else as hours from its start, and so named.
    """
    start, end = options.trace_start_h, options.trace_start_h + options.trace_span_h
    if trace.start_epoch_s is not None:
        by_clock_s = (start * 3600 - trace.start_epoch_s) % DAY_S
        if DAY_S - by_clock_s <= trace.bin_s:
            by_clock_s = 0.0  # the trace's first bin holds 04:00 (one starting at 04:00:05 meant the next day's)
        if by_clock_s + (end - start) * 3600 <= trace.duration_s:
            return by_clock_s, f"{start:02.0f}:00-{end:02.0f}:00 UTC"
    return start * 3600, f"hours {start:g}-{end:g} from its start"


def load_plan(options: StackOptions, base_rate_rps: float) -> tuple[list[LoadRequest], str]:
    """The requests to send, and a line saying what they are."""
    return _plan(options, load_trace(options.trace or DAILY_RAMP), base_rate_rps)


def _plan(options: StackOptions, trace: Trace, base_rate_rps: float) -> tuple[list[LoadRequest], str]:
    name = (options.trace or DAILY_RAMP).name
    lengths, _, _ = demo_lengths(options)
    if isinstance(trace, CountTrace):
        plan = plan_from_counts(
            trace, lengths, start_s=_window(options, trace)[0], span_s=options.trace_span_h * 3600,
            duration_s=options.duration_s, base_rate_rps=base_rate_rps, length_scale=options.length_scale,
            max_prompt_tokens=MAX_PROMPT_TOKENS, max_output_tokens=MAX_OUTPUT_TOKENS, seed=options.seed,
            arrivals=options.arrivals,
        )
        what = (f"{name}: {count_window(options, trace)} compressed into {options.duration_s:.0f} s, "
                f"starting at {base_rate_rps:.2f} requests/s, {options.arrivals} arrivals")
        return plan, what
    plan = plan_from_trace(
        trace, duration_s=options.duration_s, speedup=options.speedup, length_scale=options.length_scale,
        max_prompt_tokens=MAX_PROMPT_TOKENS, max_output_tokens=MAX_OUTPUT_TOKENS,
    )
    return plan, f"{name} at {options.speedup:g}x over {options.duration_s:.0f} s"


COUNT_TRACE_OPTIONS = {"arrivals": "--arrivals", "base_load": "--base-load"}
"""Options only a count trace's plan reads (by their parameter names in ``moeslo up``)."""
REQUEST_TRACE_OPTIONS = {"speedup": "--speedup"}
"""Options only a request trace's plan reads."""


def _refuse_ignored(options: StackOptions, trace: Trace, given: Collection[str]) -> None:
    """Options given on the command line that this trace's plan would not read: they changed nothing, silently."""
    counts = isinstance(trace, CountTrace)
    ignored = [flag for name, flag in (REQUEST_TRACE_OPTIONS if counts else COUNT_TRACE_OPTIONS).items()
               if name in given]
    if not ignored:
        return
    named, verb = " and ".join(ignored), "apply" if len(ignored) > 1 else "applies"
    which = f"--trace {options.trace}" if options.trace is not None else "the bundled day of Azure 2024 (the default)"
    if isinstance(trace, CountTrace):
        raise ValidationError(f"{named} {verb} to a request trace only: {which} is a count trace, its "
                              f"{count_window(options, trace)} compressed into --duration; leave it out")
    raise ValidationError(f"{named} {verb} to a count trace only: {which} is a request trace, replayed as its "
                          f"requests came (its first --duration x --speedup seconds); leave "
                          f"{'them' if len(ignored) > 1 else 'it'} out")


def check_trace(options: StackOptions, given: Collection[str] = ()) -> None:
    """Refuse, before anything starts, a ``--trace`` the load could not replay: unreadable, or without requests
    in the part the run replays (a count trace's hours; a request trace's first ``duration x speedup`` seconds);
    and the options in ``given`` (set on the command line) that its kind of trace would ignore.
    Planned once at a nominal rate: the real one comes from the profile, later."""
    if options.trace is None:
        if given:
            _refuse_ignored(options, load_trace(DAILY_RAMP), given)
        return
    trace = load_trace(options.trace)  # a DataError names the file and line
    _refuse_ignored(options, trace, given)
    if isinstance(trace, CountTrace):
        replayed = f"its {count_window(options, trace)}, compressed into --duration"
    else:
        replayed = f"its first {options.duration_s * options.speedup:g} s (--duration x --speedup)"
    try:
        plan, _ = _plan(options, trace, 1.0)
    except ValueError as exc:
        raise ValidationError(f"--trace {options.trace}: {exc}; moeslo up replays {replayed}") from exc
    if not plan:
        raise ValidationError(f"--trace {options.trace}: no requests in {replayed}, the part moeslo up replays")


async def drive(state: StackState, plan: list[LoadRequest], vocab_size: int, fallback_url: str) -> None:
    """Send every planned request at its time: to the entry router, or without one to the serving replica
    with the fewest in flight."""
    rng = np.random.default_rng(state.options.seed)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    state.planned_arrivals_s = [state.elapsed() + r.arrival_s for r in plan]
    async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
        start = time.monotonic()

        async def one(req: LoadRequest) -> None:
            delay = start + req.arrival_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            engines = [state.router_url] if state.router_url else state.engines or [fallback_url]
            url = min(engines, key=lambda u: state.in_flight.get(u, 0))
            state.in_flight[url] = state.in_flight.get(url, 0) + 1
            prompt = rng.integers(0, vocab_size, size=req.prompt_tokens).tolist()
            record = RequestRecord(arrival_s=req.arrival_s, prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens)
            try:
                record = await send_request(client, req, prompt, start + req.arrival_s, None, 0.0, base_url=url,
                                            record=record)  # fmt: skip
            except asyncio.CancelledError:
                # Still in flight when the load ended (the drain ran out, Ctrl-C): a request that did not finish
                # is one not served, in every share of the summary and in requests.csv; the gaps it streamed
                # until then count in the gap shares (often the slowest streams, stuck in the fault).
                record.error = UNFINISHED_ERROR
                state.records.append(record)
                state.done_at_s.append(state.elapsed())
                raise
            finally:
                state.in_flight[url] -= 1
            state.records.append(record)
            state.done_at_s.append(state.elapsed())

        await asyncio.gather(*(one(r) for r in plan))
