"""``moeslo_ttft_normalized_seconds`` for engines we do not own (vLLM): one observer, fed finished requests.

The embedded engine's exporter (:mod:`exporters.prometheus`) observes the same
histogram from its own stats; this observer gives the vLLM stat-logger plugin
(:mod:`exporters.vllm_ttft`) the same names, labels, buckets and definition
(:mod:`contracts.ttft_objective`), without importing vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from contracts.catalogue import (
    BASE_LABELS,
    FINISHED_REASON_LABEL,
    PER_1K_PROMPT_TOKENS_LABEL,
    REFERENCE_PROMPT_TOKENS_LABEL,
    REQUESTS_WITHOUT_FIRST_TOKEN,
    TTFT_BUCKETS_S,
    TTFT_NORMALIZED_HISTOGRAM,
    UNSERVED_FINISH_REASONS,
)
from contracts.ttft_objective import EXPORTED_BY_DEFAULT, TtftAllowance

__all__ = ["NormalizedTtftObserver", "finished_ttfts"]



class NormalizedTtftObserver:
    """Observes each finished request's normalized TTFT, once per exported allowance."""

    def __init__(
        self, registry: CollectorRegistry, *, allowances: Sequence[TtftAllowance] = EXPORTED_BY_DEFAULT
    ) -> None:
        self._histogram = Histogram(
            TTFT_NORMALIZED_HISTOGRAM, "TTFT minus the long-prompt allowance, in seconds.",
            [*BASE_LABELS, REFERENCE_PROMPT_TOKENS_LABEL, PER_1K_PROMPT_TOKENS_LABEL],
            registry=registry, buckets=TTFT_BUCKETS_S,
        )  # fmt: skip
        self._allowances = tuple(allowances)
        self._without_first_token = Counter(
            REQUESTS_WITHOUT_FIRST_TOKEN, "Requests ended before their first token, by finish reason.",
            [*BASE_LABELS, FINISHED_REASON_LABEL], registry=registry,
        )  # fmt: skip

    def add_engine(self, model_name: str, engine: str) -> None:
        """An engine's series, empty until its first request finishes: without them the TTFT-metric-absent
        ticket read an engine that has served nothing yet as one not scraped (vLLM's own histograms exist from
        its start).  The finish reasons the TTFT SLI counts as bad start at zero too: a counter born at its first
        failure has that value read as a baseline, by the scrape source and by Prometheus's ``increase()``."""
        self._series(model_name, engine)
        for reason in UNSERVED_FINISH_REASONS:
            self._without_first_token.labels(model_name, engine, reason)

    def _series(self, model_name: str, engine: str) -> list[tuple[TtftAllowance, Histogram]]:
        return [
            (allowance, self._histogram.labels(model_name, engine, *allowance.labels().values()))
            for allowance in self._allowances
        ]

    def observe(self, model_name: str, engine: str, requests: Iterable[tuple[float, int]]) -> None:
        """``(ttft_s, prompt_tokens)`` of requests that finished on one engine."""
        series = self._series(model_name, engine)
        for ttft_s, prompt_tokens in requests:
            for allowance, histogram in series:
                histogram.observe(allowance.normalized_s(ttft_s, prompt_tokens))

    def count_without_first_token(self, model_name: str, engine: str, finished: Iterable[Any]) -> None:
        """vLLM's finished requests that generated nothing, by finish reason (its enum prints ``stop``,
        ``length``, ``abort``, ``error``, ``repetition``): those :func:`finished_ttfts` leaves out."""
        for f in finished:
            if getattr(f, "num_generation_tokens", 1) == 0:
                self._without_first_token.labels(model_name, engine, str(f.finish_reason)).inc()


def finished_ttfts(finished: Iterable[Any]) -> list[tuple[float, int]]:
    """``(ttft_s, prompt_tokens)`` of vLLM's finished-request stats, from the request's arrival at the front end.

    A request that finished without a first token (aborted while queued or in prefill, refused) is no TTFT
    observation, as on vLLM's own TTFT histogram: vLLM leaves its unreached timestamps at 0, so its queue or
    prefill time is negative (or it generated nothing), and it is skipped, never counted as a good 0 s."""
    return [
        (_from_arrival(f), int(f.num_prompt_tokens))
        for f in finished
        if f.queued_time >= 0 and f.prefill_time >= 0 and getattr(f, "num_generation_tokens", 1) > 0
    ]


def _from_arrival(f: Any) -> float:
    """The time from the front end's arrival to the first token, as ``vllm:time_to_first_token_seconds`` counts it:
    the end-to-end latency (arrival to the last token, at the front end) less the inference time after the first
    token (engine-core timestamps).  The engine core's queue plus prefill time alone left out tokenization and the
    hop to the core, so the normalized TTFT read lower than vLLM's own for the same request."""
    core_s = float(f.queued_time) + float(f.prefill_time)
    e2e_s, inference_s = float(getattr(f, "e2e_latency", 0.0)), float(getattr(f, "inference_time", 0.0))
    if e2e_s <= 0 or inference_s < f.prefill_time:
        return core_s  # stats without those fields: the engine core's part
    return max(core_s, e2e_s - (inference_s - float(f.prefill_time)))
