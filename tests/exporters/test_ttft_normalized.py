"""vLLM's finished requests as normalized TTFT observations."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from contracts.catalogue import UNSERVED_FINISH_REASONS
from exporters.ttft_normalized import NormalizedTtftObserver, finished_ttfts


def _finished(queued_ts: float, scheduled_ts: float, first_token_ts: float, generated: int,
              reason: str = "stop") -> SimpleNamespace:  # fmt: skip
    """vLLM's ``FinishedRequestStats`` as it derives them: timestamps it never reached stay 0."""
    return SimpleNamespace(queued_time=scheduled_ts - queued_ts, prefill_time=first_token_ts - scheduled_ts,
                           num_prompt_tokens=100, num_generation_tokens=generated, finish_reason=reason)  # fmt: skip


def test_a_request_without_a_first_token_is_no_ttft_observation() -> None:
    """Aborted while queued (never scheduled) or in prefill, a request's queue + prefill time was negative:
    clamped to 0 s, it counted as a good TTFT."""
    finished = [
        _finished(1000.0, 1000.5, 1001.0, 8),  # served: 1 s to its first token
        _finished(1000.0, 0.0, 0.0, 0),  # never scheduled
        _finished(1000.0, 1000.5, 0.0, 0),  # aborted in prefill
    ]
    assert finished_ttfts(finished) == [(1.0, 100)]


def test_vllm_requests_without_a_first_token_are_counted_by_reason() -> None:
    """vLLM's finish reasons print as ``stop``, ``length``, ``abort`` (its enum's ``str``): an abort while queued
    or in prefill is counted apart from the TTFT observations, as on the embedded engine."""
    reg = CollectorRegistry()
    observer = NormalizedTtftObserver(reg)
    observer.count_without_first_token("m", "0", [
        _finished(1000.0, 1000.5, 1001.0, 8),
        _finished(1000.0, 0.0, 0.0, 0, reason="abort"),
        _finished(1000.0, 1000.5, 0.0, 0, reason="abort"),
    ])  # fmt: skip
    labels = {"model_name": "m", "engine": "0"}
    name = "moeslo_requests_without_first_token_total"
    assert reg.get_sample_value(name, {**labels, "finished_reason": "abort"}) == 2
    assert reg.get_sample_value(name, {**labels, "finished_reason": "stop"}) is None


def test_an_engines_unserved_series_exist_at_zero_before_its_first_failure() -> None:
    """A counter born at its first failure has that first value read as a baseline (by the scrape source, and
    by Prometheus's increase()): the first requests an engine failed before a first token were lost."""
    reg = CollectorRegistry()
    observer = NormalizedTtftObserver(reg)
    observer.add_engine("m", "0")
    name = "moeslo_requests_without_first_token_total"
    for reason in UNSERVED_FINISH_REASONS:
        assert reg.get_sample_value(name, {"model_name": "m", "engine": "0", "finished_reason": reason}) == 0
    observer.count_without_first_token("m", "0", [_finished(1000.0, 0.0, 0.0, 0, reason="error")])
    assert reg.get_sample_value(name, {"model_name": "m", "engine": "0", "finished_reason": "error"}) == 1


def test_a_vllm_ttft_counts_from_the_front_ends_arrival() -> None:
    """As ``vllm:time_to_first_token_seconds``: 0.3 s of tokenization before the engine core queued the request
    count (end-to-end 2.0 s, of which 1.0 s decoding after the first token), not only its queue and prefill."""
    served = _finished(1000.0, 1000.2, 1000.7, 8)
    served.e2e_latency, served.inference_time = 2.0, 1.5  # arrival to the last token; scheduled to the last token
    assert finished_ttfts([served]) == [(pytest.approx(1.0), 100)]
    served.e2e_latency = 1.1  # clocks that disagree never make it shorter than the engine core's part
    assert finished_ttfts([served]) == [(pytest.approx(0.7), 100)]
