"""The TTFT and ITL histograms' edges around the objectives: the p99 a controller reads from them is near the truth."""

from __future__ import annotations

import numpy as np

from contracts.catalogue import (
    ITL_BUCKETS_S,
    TTFT_BUCKETS_S,
    VLLM_ITL_BUCKETS_S,
    VLLM_SLO_CUSTOM_BUCKETS,
    VLLM_TTFT_BUCKETS_S,
)
from contracts.histograms import histogram_quantile


def _bucketed_p99(gaps: np.ndarray, edges: tuple[float, ...]) -> float:
    cumulative = {edge: float((gaps <= edge).sum()) for edge in edges}
    cumulative[float("inf")] = float(len(gaps))
    p99 = histogram_quantile(0.99, cumulative)
    assert p99 is not None
    return p99


def test_a_p99_of_gaps_under_the_objective_reads_within_2_5_ms() -> None:
    # Token gaps of a replica with room: 13-16 ms, the tail well under the 20 ms objective.
    gaps = np.random.default_rng(0).uniform(0.013, 0.016, 20_000)
    exact = float(np.quantile(gaps, 0.99))
    assert abs(_bucketed_p99(gaps, ITL_BUCKETS_S) - exact) <= 0.0025
    # vLLM's own edges (10 ms, 25 ms) read it at the objective or over: a healthy fleet looks full.
    assert _bucketed_p99(gaps, VLLM_ITL_BUCKETS_S) > 0.02


def test_the_edges_keep_vllms_and_the_objective() -> None:
    assert set(VLLM_ITL_BUCKETS_S) <= set(ITL_BUCKETS_S)
    assert 0.02 in ITL_BUCKETS_S and list(ITL_BUCKETS_S) == sorted(ITL_BUCKETS_S)


def test_a_ttft_p99_under_the_objective_reads_within_50_ms() -> None:
    ttfts = np.random.default_rng(1).uniform(0.30, 0.38, 20_000)
    exact = float(np.quantile(ttfts, 0.99))
    assert abs(_bucketed_p99(ttfts, TTFT_BUCKETS_S) - exact) <= 0.05
    assert _bucketed_p99(ttfts, VLLM_TTFT_BUCKETS_S) > 0.49  # vLLM's 0.25-0.5 s bucket: read at the objective


def test_vllm_is_started_with_both_edge_sets() -> None:
    assert VLLM_SLO_CUSTOM_BUCKETS == {"time_to_first_token": TTFT_BUCKETS_S, "inter_token_latency": ITL_BUCKETS_S}
    assert set(VLLM_TTFT_BUCKETS_S) <= set(TTFT_BUCKETS_S) and 0.5 in TTFT_BUCKETS_S
