"""Open-loop load generator: replays a request trace against an OpenAI-compatible server.

Each request is sent at its (time-compressed) arrival time, streams its
completion, and comes back as a :class:`RequestRecord` with the client's own
TTFT and inter-token gaps.  In-flight requests are bounded
(``max_in_flight``); a request that would exceed the bound waits and the wait
counts in its TTFT, as a real client's would.

Traces are read by :mod:`contracts.traces` (one reader for the whole
project).  The bundled default is the Azure LLM inference trace 2023
(conversation), CC BY 4.0, from Patel et al., "Splitwise: Efficient
generative LLM inference using phase splitting", ISCA 2024
(Azure/AzurePublicDataset).

Usage::

    plan = plan_from_trace(load_request_trace(path), duration_s=60, speedup=2.0)
    records = asyncio.run(run_load("http://127.0.0.1:8000", plan, vocab_size=4096))
    print(summarize(records, wall_s=60))
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import numpy as np

from contracts.attainment import gaps_within_share, within_objectives
from contracts.traces import CountTrace, LengthDistribution, RequestTrace


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadRequest:
    """One request to send: when (seconds from the start) and how long."""

    arrival_s: float
    prompt_tokens: int
    max_tokens: int


@dataclass(slots=True, kw_only=True)
class RequestRecord:
    """What the client saw of one request (monotonic seconds)."""

    arrival_s: float
    """Planned send time, from the start of the run."""
    prompt_tokens: int
    max_tokens: int
    status: int = 0
    """HTTP status; 0 when the connection failed."""
    ttft_s: float | None = None
    """Planned send time to first token (waiting for an in-flight slot included)."""
    itls_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


def plan_from_trace(
    trace: RequestTrace,
    *,
    duration_s: float,
    speedup: float = 1.0,
    start_s: float = 0.0,
    length_scale: float = 1.0,
    max_prompt_tokens: int = 1024,
    max_output_tokens: int = 256,
) -> list[LoadRequest]:
    """The trace's requests arriving in ``duration_s`` of wall time after ``speedup``.

    ``length_scale`` shrinks prompt and output lengths (a small CPU model cannot take the
    production lengths); lengths are then clipped to ``[1, max_*_tokens]``.
    """
    fast = trace.window(start_s, start_s + duration_s * speedup).speedup(speedup)
    prompts = np.clip(np.round(fast.prompt_tokens * length_scale), 1, max_prompt_tokens).astype(int)
    outputs = np.clip(np.round(fast.output_tokens * length_scale), 1, max_output_tokens).astype(int)
    return [
        LoadRequest(arrival_s=float(a), prompt_tokens=int(p), max_tokens=int(o))
        for a, p, o in zip(fast.arrival_s, prompts, outputs, strict=True)
    ]


ArrivalProcess = Literal["poisson", "even"]
"""How arrivals fill a count trace's rates: ``poisson`` within each bin, or ``even``: the k-th arrival at a
uniform point of the k-th unit of expected arrivals, so any window holds its expected count to within
two.  A trace scaled down a thousandfold keeps its shape either way; ``poisson`` adds the counting
noise of a small service (a spread of about 30 % over ten arrivals), ``even`` keeps the relative smoothness the
trace had at full volume, in its length mix too: lengths are drawn in blocks of :data:`LENGTH_STRATA`, one
from each prompt-length stratum (:meth:`LengthDistribution.sample_stratified`)."""

LENGTH_STRATA = 20
"""Prompt-length strata of ``even`` arrivals' blocks: a few seconds of the demo's load, so the controller's
10 s rate window holds whole blocks or nearly (the demo's 10 s windows' mean prompt, five seeds: 0.86-1.12 of
the run's, where independent draws gave 0.70-1.37 and the first windows of seed 0 ran 32 % over it)."""


def plan_from_counts(
    counts: CountTrace,
    lengths: LengthDistribution,
    *,
    start_s: float,
    span_s: float,
    duration_s: float,
    base_rate_rps: float,
    length_scale: float = 1.0,
    max_prompt_tokens: int = 1024,
    max_output_tokens: int = 256,
    seed: int = 0,
    arrivals: ArrivalProcess = "poisson",
) -> list[LoadRequest]:
    """The shape of a count trace over ``[start_s, start_s + span_s)``, compressed into ``duration_s``.

    Rates keep the trace's shape and are scaled so the first tenth of the window averages
    ``base_rate_rps`` (the run is sized from its quiet start); arrivals follow ``arrivals``
    (:data:`ArrivalProcess`), lengths drawn from ``lengths`` (then scaled and clipped as in
    :func:`plan_from_trace`).
    """
    first = int(start_s // counts.bin_s)
    last = int(np.ceil((start_s + span_s) / counts.bin_s))
    shape = np.asarray(counts.counts[first:last], dtype=np.float64)
    if len(shape) == 0 or shape.sum() <= 0:
        raise ValueError(f"the count trace has no requests in [{start_s}, {start_s + span_s}) s")
    if arrivals not in ("poisson", "even"):
        raise ValueError(f"arrivals must be 'poisson' or 'even', got {arrivals!r}")
    bin_s = duration_s / len(shape)
    head = shape[: max(1, len(shape) // 10)]
    rates = shape / max(float(head.mean()), 1e-9) * base_rate_rps
    rng = np.random.default_rng(seed)
    if arrivals == "even":
        times = _even_arrivals(rates, bin_s, rng)
        prompt, output = lengths.sample_stratified(len(times), rng, LENGTH_STRATA)
    else:
        times = _poisson_arrivals(rates, bin_s, rng)
        prompt, output = lengths.sample(len(times), rng)
    return _with_lengths(times, prompt, output, length_scale, max_prompt_tokens, max_output_tokens)


def _poisson_arrivals(rates: np.ndarray, bin_s: float, rng: np.random.Generator) -> np.ndarray:
    per_bin = rng.poisson(rates * bin_s)
    if not per_bin.sum():
        return np.zeros(0)
    return np.sort(np.concatenate([(i + np.sort(rng.random(n))) * bin_s for i, n in enumerate(per_bin) if n]))


def _even_arrivals(rates: np.ndarray, bin_s: float, rng: np.random.Generator) -> np.ndarray:
    expected = np.concatenate([[0.0], np.cumsum(rates * bin_s)])
    count = int(np.floor(expected[-1]))
    units = np.arange(count) + rng.random(count)
    return np.asarray(np.interp(units, expected, np.arange(len(rates) + 1) * bin_s), dtype=np.float64)


def _with_lengths(
    arrivals: np.ndarray, prompt: np.ndarray, output: np.ndarray, length_scale: float,
    max_prompt_tokens: int, max_output_tokens: int,
) -> list[LoadRequest]:
    prompts = np.clip(np.round(prompt * length_scale), 1, max_prompt_tokens).astype(int)
    outputs = np.clip(np.round(output * length_scale), 1, max_output_tokens).astype(int)
    return [
        LoadRequest(arrival_s=float(a), prompt_tokens=int(p), max_tokens=int(o))
        for a, p, o in zip(arrivals, prompts, outputs, strict=True)
    ]


async def run_load(
    base_url: str,
    requests: Sequence[LoadRequest],
    *,
    vocab_size: int,
    model: str | None = None,
    max_in_flight: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    timeout_s: float = 300.0,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    """Replay ``requests`` against ``base_url``; records in request order.

    Prompts are random token ids (seeded), sent as ``prompt: [ids]`` so their
    lengths are exact.  ``on_record`` is called as each request finishes.
    """
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, vocab_size, size=r.prompt_tokens).tolist() for r in requests]
    slots = asyncio.Semaphore(max_in_flight)
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits) as client:
        start = time.monotonic()

        async def one(req: LoadRequest, prompt: list[int]) -> RequestRecord:
            delay = start + req.arrival_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            async with slots:
                record = await send_request(client, req, prompt, start + req.arrival_s, model, temperature)
            if on_record is not None:
                on_record(record)
            return record

        return list(await asyncio.gather(*(one(r, p) for r, p in zip(requests, prompts, strict=True))))


async def send_request(
    client: httpx.AsyncClient,
    req: LoadRequest,
    prompt: list[int],
    planned_s: float,
    model: str | None,
    temperature: float,
    *,
    base_url: str = "",
    record: RequestRecord | None = None,
) -> RequestRecord:
    """Stream one completion; ``base_url`` picks the server when the client has none (a router).  ``record``, when
    given, is filled as the stream goes: a caller that cancels the request keeps what it streamed until then."""
    if record is None:
        record = RequestRecord(arrival_s=req.arrival_s, prompt_tokens=req.prompt_tokens, max_tokens=req.max_tokens)
    payload: dict[str, Any] = {"prompt": prompt, "max_tokens": req.max_tokens, "temperature": temperature,
                               "stream": True, "ignore_eos": True}
    if model is not None:
        payload["model"] = model
    last: float | None = None
    try:
        async with client.stream("POST", f"{base_url}/v1/completions", json=payload) as resp:
            record.status = resp.status_code
            if resp.status_code != 200:
                record.error = (await resp.aread()).decode(errors="replace")[:200]
                return record
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                choices = _event_choices(data, record)
                if choices is None:
                    break
                if not choices:
                    continue  # a usage-only chunk (or a malformed one) carries no token
                now = time.monotonic()
                if last is None:
                    record.ttft_s = now - planned_s
                else:
                    record.itls_s.append(now - last)
                last = now
                record.output_tokens += 1
                record.finish_reason = choices[0].get("finish_reason") or record.finish_reason
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    record.e2e_s = time.monotonic() - planned_s
    return record


def _event_choices(data: str, record: RequestRecord) -> list[dict[str, Any]] | None:
    """A streamed event's choices; None (with ``record.error`` set) for an error event, which ends the stream.

    An event that does not parse fails the request but is read past: a stream the router cut inside an event
    ends in that half event and then the router's error event, whose message is the one to keep."""
    try:
        event = json.loads(data)
        if not isinstance(event, dict):
            raise TypeError(f"an event is an object, got {type(event).__name__}")
        if "error" in event:
            error = event["error"]
            record.error = str(error.get("message") if isinstance(error, dict) else error)
            return None
        choices = event["choices"]
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise TypeError("choices is a list of objects")
        return choices
    except (ValueError, KeyError, TypeError) as exc:
        record.error = f"malformed event ({type(exc).__name__}: {exc}): {data[:120]}"
        return []


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def summarize(records: Sequence[RequestRecord], *, wall_s: float) -> dict[str, Any]:
    """Throughput and latency percentiles of a run (seconds; tokens per second)."""
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    itls = [x for r in ok for x in r.itls_s]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
    output_tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "status_counts": statuses,
        "wall_s": wall_s,
        "output_tokens": output_tokens,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens_per_s": output_tokens / wall_s if wall_s > 0 else None,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else None,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "itl_p50_s": percentile(itls, 50),
        "itl_p99_s": percentile(itls, 99),
        "e2e_p50_s": percentile([r.e2e_s for r in ok if r.e2e_s is not None], 50),
        # Share of the requests within both objectives (TTFT, mean gap), as the replay and the demo score them.
        "within_objectives": (sum(r.ok and within_objectives(r.ttft_s, r.itls_s) for r in records) / len(records)
                              if records else None),
        # Share of the token gaps within the ITL objective: the controller's ITL SLI (from the histogram).
        "token_gaps": len(itls),
        "gaps_within_objective": gaps_within_share(itls),
    }


__all__ = [
    "ArrivalProcess",
    "LoadRequest",
    "RequestRecord",
    "percentile",
    "plan_from_counts",
    "plan_from_trace",
    "run_load",
    "send_request",
    "summarize",
]
