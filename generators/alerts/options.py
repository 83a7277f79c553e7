"""The knobs of the generated rules that are not part of an SLO policy (:class:`AlertOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

from controller.slo import MIN_ALERT_REQUESTS
from generators.buckets import EngineBuckets, EngineName


@dataclass(frozen=True, kw_only=True, slots=True)
class AlertOptions:
    """Knobs of the generated rules that are not part of an SLO policy."""

    engine: EngineName | EngineBuckets = "moeslo"
    """Whose histogram buckets the engines write (:mod:`generators.buckets`): moeslo's (ITL has 0.02),
    stock vLLM's (no 0.02), or vLLM's started with the SLO edges (``vllm-slo-buckets``)."""
    evaluation_interval: str = "30s"
    min_requests: int = MIN_ALERT_REQUESTS
    """Low-traffic guard: burn-rate alerts need this many TTFT requests over their short window."""
    for_fraction_of_short_window: float = 0.2
    """``for:`` of a burn-rate alert, as a share of its short window (5m -> 1m, 30m -> 6m)."""
    min_for: str = "1m"
    imbalance_for: str = "10m"
    """Least ``for:`` of the imbalance alert; it is at least twice the policy's imbalance ``sustain_s``."""
    absent_for: str = "10m"
    stall_window: str = "5m"
    """``MoesloEngineStalled``: requests in flight and no first or output token over this window..."""
    stall_for: str = "3m"
    """... for this long (a hung engine pages within about 8 minutes)."""
    unhealthy_for: str = "5m"
    """``MoesloEngineUnhealthy``: how long an engine says it is broken before a page (a supervisor that restarts
    it, as the kubelet's liveness probe does within seconds, ends it first; the restart ticket counts those)."""
    restart_window: str = "1h"
    max_restarts: int = 2
    """``MoesloEngineRestarting``: a ticket when a replica's process restarted more often than this within
    ``restart_window``."""
    forecast_for: str = "30m"
    """How long sizing must have been reactive (forecast unreliable) before a ticket."""
    for_override: str | None = None
    """Use this ``for:`` on every alert (end-to-end tests that cannot wait minutes)."""
    runbook_url: str | None = None
    """The runbooks page (docs/runbooks.md as published): every alert links to its section of it."""


__all__ = ["AlertOptions"]
