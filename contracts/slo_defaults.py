"""The mission's numbers: every default SLO, imbalance bound and control timing in one place.

Policies, the replay, the capacity model, the rebalancer, the alert and
dashboard generators and the local stack all start from these, so changing
the mission means changing this file.
"""

from __future__ import annotations

TTFT_THRESHOLD_S = 0.5
"""Time to first token a request must meet (500 ms)."""
TTFT_REFERENCE_PROMPT_TOKENS = 1000
"""The prompt length the TTFT threshold is stated for (the mission's "for a 1K-token input")."""
TTFT_PER_1K_PROMPT_TOKENS_S = 0.05
"""The long-prompt allowance the engines export a normalized TTFT histogram for: 50 ms per 1,000 prompt
tokens beyond the reference (about the prefill time of 1,000 tokens on the default profile with a batch
decoding beside it).  Policies keep the flat objective (no allowance) unless they ask for one."""
ITL_THRESHOLD_S = 0.02
"""Inter-token latency every gap must meet (20 ms)."""
LATENCY_TARGET = 0.99
"""Share of requests (TTFT) and gaps (ITL) that must meet their threshold."""
MAX_IMBALANCE_CV = 0.15
"""Largest CV (stddev/mean) of per-rank expert load a layer may show."""
COMPLIANCE_WINDOW = "30d"
"""The SLO's compliance window (a Prometheus duration)."""
SCALE_DOWN_COOLDOWN_S = 180
"""Seconds after a scale event before the controller scales down (also the rebalancer's cooldown)."""
LEAD_TIME_S = 120
"""Seconds a new replica takes to serve: how far ahead the controller must act."""
MAX_SCALE_DOWN_RATE = 2.0
"""A scale-down keeps at least the current replicas over this (Knative's ``max-scale-down-rate``): half the fleet."""
SIZING_HEADROOM = 0.85
"""The share of each latency objective (and of KV and batch capacity) the fleet is sized to."""

__all__ = [
    "COMPLIANCE_WINDOW",
    "ITL_THRESHOLD_S",
    "LATENCY_TARGET",
    "LEAD_TIME_S",
    "MAX_IMBALANCE_CV",
    "MAX_SCALE_DOWN_RATE",
    "SCALE_DOWN_COOLDOWN_S",
    "SIZING_HEADROOM",
    "TTFT_PER_1K_PROMPT_TOKENS_S",
    "TTFT_REFERENCE_PROMPT_TOKENS",
    "TTFT_THRESHOLD_S",
]
