"""vLLM's finished requests as normalized TTFT observations."""

from __future__ import annotations

from types import SimpleNamespace

from exporters.ttft_normalized import finished_ttfts


def _finished(queued_ts: float, scheduled_ts: float, first_token_ts: float, generated: int) -> SimpleNamespace:
    """vLLM's ``FinishedRequestStats`` as it derives them: timestamps it never reached stay 0."""
    return SimpleNamespace(queued_time=scheduled_ts - queued_ts, prefill_time=first_token_ts - scheduled_ts,
                           num_prompt_tokens=100, num_generation_tokens=generated)  # fmt: skip


def test_a_request_without_a_first_token_is_no_ttft_observation() -> None:
    """Aborted while queued (never scheduled) or in prefill, a request's queue + prefill time was negative:
    clamped to 0 s, it counted as a good TTFT."""
    finished = [
        _finished(1000.0, 1000.5, 1001.0, 8),  # served: 1 s to its first token
        _finished(1000.0, 0.0, 0.0, 0),  # never scheduled
        _finished(1000.0, 1000.5, 0.0, 0),  # aborted in prefill
    ]
    assert finished_ttfts(finished) == [(1.0, 100)]
