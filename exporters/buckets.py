"""Histogram bucket edges shared by the Prometheus exporter and the alert generator.

The alert rules count "good" events from the cumulative bucket at the SLO
threshold (``le="0.5"``), so every SLO threshold must be an exact edge of the
histogram the exporter writes.  Both sides import the edges from here, which
keeps them from drifting apart.

Edges are vLLM's (``vllm/v1/metrics/loggers.py``, ``PrometheusStatLogger``):
TTFT uses vLLM's list unchanged (it already contains 0.5).  vLLM's ITL list
starts 0.01, 0.025 and has no 0.02 edge, so ours adds 0.02 for the mission's
20 ms ITL objective; everything else is unchanged so dashboards built for vLLM
keep working.
"""

from __future__ import annotations

from collections.abc import Sequence

VLLM_TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""vLLM's ``vllm:time_to_first_token_seconds`` edges."""

VLLM_ITL_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""vLLM's ``vllm:inter_token_latency_seconds`` edges (no 0.02)."""

TTFT_BUCKETS_S: tuple[float, ...] = VLLM_TTFT_BUCKETS_S
"""Edges moeslo's exporter uses for ``vllm:time_to_first_token_seconds``."""

ITL_BUCKETS_S: tuple[float, ...] = tuple(sorted({*VLLM_ITL_BUCKETS_S, 0.02}))
"""Edges moeslo's exporter uses for ``vllm:inter_token_latency_seconds``: vLLM's plus 0.02."""

TTFT_METRIC = "vllm:time_to_first_token_seconds"
ITL_METRIC = "vllm:inter_token_latency_seconds"

BUCKETS_BY_METRIC: dict[str, tuple[float, ...]] = {
    TTFT_METRIC: TTFT_BUCKETS_S,
    ITL_METRIC: ITL_BUCKETS_S,
}
"""The edges moeslo's exporter writes, by histogram name."""

VLLM_BUCKETS_BY_METRIC: dict[str, tuple[float, ...]] = {
    TTFT_METRIC: VLLM_TTFT_BUCKETS_S,
    ITL_METRIC: VLLM_ITL_BUCKETS_S,
}
"""The edges a stock vLLM server writes (the moeslo plugin leaves its histograms alone)."""


def format_le(edge_s: float) -> str:
    """The ``le`` label value prometheus_client writes for an edge (``0.5``, ``1.0``, ``2560.0``)."""
    return repr(float(edge_s))


def le_matcher(edge_s: float) -> str:
    """A PromQL matcher for the bucket at ``edge_s``.

    Python clients write whole edges as ``1.0``, Go clients as ``1``; Prometheus 2
    keeps the label as written, so whole edges match both spellings.
    """
    text = format_le(edge_s)
    if text.endswith(".0"):
        return f'le=~"{text[:-2]}|{text[:-2]}\\\\.0"'
    return f'le="{text}"'


def is_bucket_edge(threshold_s: float, edges_s: Sequence[float]) -> bool:
    """True when ``threshold_s`` equals one of ``edges_s`` exactly (as the ``le`` label would)."""
    return any(format_le(edge) == format_le(threshold_s) for edge in edges_s)


__all__ = [
    "BUCKETS_BY_METRIC",
    "ITL_BUCKETS_S",
    "ITL_METRIC",
    "TTFT_BUCKETS_S",
    "TTFT_METRIC",
    "VLLM_BUCKETS_BY_METRIC",
    "VLLM_ITL_BUCKETS_S",
    "VLLM_TTFT_BUCKETS_S",
    "format_le",
    "is_bucket_edge",
    "le_matcher",
]
