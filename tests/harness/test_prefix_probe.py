"""The prefix probe's cached share: read from the engine's hit counter only over requests that all succeeded."""

from __future__ import annotations

from typing import Any

import pytest

from harness import prefix_probe as probe_module
from harness.loadgen import LoadRequest, RequestRecord


def _probe(monkeypatch: pytest.MonkeyPatch, *, failed_cached: int) -> dict[str, Any]:
    """Four pairs of 64-token prompts; every cached one hits its 48 shared tokens, and the first ``failed_cached``
    measured ones fail after their prefill (a stream cut after its first token)."""
    hits = [0.0]
    prefix: list[int] = []
    measured_cached = [0]

    async def send(_client: Any, _request: LoadRequest, prompt: list[int], *_args: Any) -> RequestRecord:
        record = RequestRecord(arrival_s=0.0, prompt_tokens=len(prompt), max_tokens=1, status=200, ttft_s=0.01)
        if not prefix:
            prefix.extend(prompt[:48])  # the priming request: it fills the cache, it is not measured
        elif prompt[:48] == prefix:
            hits[0] += 48.0
            measured_cached[0] += 1
            if measured_cached[0] <= failed_cached:
                record.error = "the engine could not complete the request"
        return record

    async def counted(_client: Any) -> float:
        return hits[0]

    monkeypatch.setattr(probe_module, "send_request", send)
    monkeypatch.setattr(probe_module, "_hits", counted)
    return probe_module.prefix_probe("http://replica", prompt_tokens=64, vocab_size=500, model=None, seed=1, pairs=4)


def test_the_cached_share_comes_from_the_engine_when_every_cached_request_succeeded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stats = _probe(monkeypatch, failed_cached=0)
    assert stats["cached_share"] == pytest.approx(0.75) and stats["cached_share_source"] == "engine counters"


def test_a_failed_cached_request_leaves_the_share_as_sent_not_read_high(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its hits were counted and it was not: 4 x 48 hits over 3 x 64 tokens read as a share of 1.0."""
    stats = _probe(monkeypatch, failed_cached=1)
    assert stats["cached_share"] == pytest.approx(48 / 64) and stats["cached_share_source"] == "as sent"
    assert len(stats["cached_ttft_s"]) == 3
