"""Queueing formulas of the capacity model: waits in front of N prefill servers (pure functions)."""

from __future__ import annotations

import math

__all__ = ["erlang_c", "mgn_waits"]


def mgn_waits(replicas: int, rho: float, mean_service_s: float, service_cv2: float) -> tuple[float, float]:
    """Mean and p99 prefill wait of ``replicas`` servers at utilization ``rho`` behind least-loaded routing.

    M/G/N with the Lee-Longton approximation: a request waits with the Erlang-C probability
    ``C(N, N rho)``, and then for an exponential time of mean ``(1 + cv2) / 2 * S / (N (1 - rho))``.
    With one replica this is the Pollaczek-Khinchine M/G/1 queue.
    """
    if rho <= 0:
        return 0.0, 0.0
    waiting = erlang_c(replicas, rho)
    conditional = (1.0 + service_cv2) / 2.0 * mean_service_s / (replicas * (1.0 - rho))
    p99 = conditional * math.log(waiting / 0.01) if waiting > 0.01 else 0.0
    return waiting * conditional, p99


def erlang_c(servers: int, rho: float) -> float:
    """Probability that an arrival waits in M/M/N at per-server utilization ``rho`` (Erlang B recursion)."""
    offered = servers * rho
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    return blocking / (1.0 - rho * (1.0 - blocking))
