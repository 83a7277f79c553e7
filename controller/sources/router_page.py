"""The entry router's ``/metrics`` page, read by the scrape source: its queue and its refusals.

A policy that names an entry router with ``endpoints`` has each router's page read
once per tick.  Two figures come from it:

- ``moeslo_router_queued_requests`` (queue mode: requests held at admission), summed
  over the routers, is the observation's ``router_queued``;
- ``moeslo_router_requests_total{outcome="rejected"}`` (reject mode: 429 at
  admission) becomes ``router_refused_rps``: the counter is accumulated per router
  the way Prometheus's ``increase()`` does (a drop is a restart, counting from
  zero) and its rate taken over the source's rate window, as the engines' rates are.

A router that could not be read makes both unknown (a sum without it would
understate the demand), with the reason in the observation's errors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from prometheus_client.parser import text_string_to_metric_families

from contracts.catalogue import OUTCOME_LABEL, REJECTED_OUTCOME, ROUTER_QUEUED, ROUTER_REQUESTS, total
from controller.policy import Policy
from controller.types import PolicyObservation

__all__ = ["RefusalRates", "RouterReading", "parse_router_page", "parse_router_queue", "with_router"]

REQUESTS_TOTAL = total(ROUTER_REQUESTS)


@dataclass(frozen=True, slots=True)
class RouterReading:
    """What one read of one router's page said."""

    queued: float
    """Requests held at admission now."""
    refused_total: float
    """Requests refused at admission since the router started (0 before its first refusal: the counter's
    ``rejected`` series appears only then)."""


def parse_router_page(text: str) -> RouterReading | None:
    """The router's queue and refusals from its /metrics page (None: the page has no queue series, so it is
    not a moeslo router; ``ValueError`` if malformed)."""
    queued: list[float] = []
    refused = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ROUTER_QUEUED:
                queued.append(float(sample.value))
            elif sample.name == REQUESTS_TOTAL and sample.labels.get(OUTCOME_LABEL) == REJECTED_OUTCOME:
                refused += float(sample.value)
    return RouterReading(queued=sum(queued), refused_total=refused) if queued else None


def parse_router_queue(text: str) -> float | None:
    """``moeslo_router_queued_requests`` summed from a router's /metrics page (None: not a router's page)."""
    reading = parse_router_page(text)
    return None if reading is None else reading.queued


@dataclass
class _Refusals:
    """One router's refusals, accumulated across its restarts, with their history over the rate window."""

    last_total: float | None = None
    accumulated: float = 0.0
    points: deque[tuple[float, float]] = field(default_factory=deque)


class RefusalRates:
    """Per router endpoint, the rate of refusals over ``window_s`` (as ``rate()`` over the same window)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._by_endpoint: dict[str, _Refusals] = {}

    def record(self, endpoint: str, now_s: float, refused_total: float) -> None:
        state = self._by_endpoint.setdefault(endpoint, _Refusals())
        before = state.last_total
        if before is not None:
            state.accumulated += refused_total if refused_total < before else refused_total - before
        state.last_total = refused_total
        state.points.append((now_s, state.accumulated))
        # Keep one point at or before the window's start, so the rate covers the whole window.
        while len(state.points) > 2 and state.points[1][0] <= now_s - self.window_s:
            state.points.popleft()

    def rate(self, endpoint: str) -> float | None:
        """Refusals per second over the window (None before a second read)."""
        state = self._by_endpoint.get(endpoint)
        if state is None or len(state.points) < 2:
            return None
        (then_s, then), (now_s, now) = state.points[0], state.points[-1]
        return (now - then) / (now_s - then_s) if now_s > then_s else None


def with_router(
    obs: PolicyObservation,
    policy: Policy,
    readings: Mapping[str, RouterReading | str],
    refusals: RefusalRates,
) -> PolicyObservation:
    """The observation with its policy's router queue and refusals (None, with the reasons in ``errors``,
    unless every router was read)."""
    if policy.router is None:
        return obs
    endpoints = policy.router.endpoints
    if not endpoints:
        return replace(obs, errors=(*obs.errors, "router: no endpoints to scrape (router.endpoints is empty)"))
    read = [readings[e] for e in endpoints]
    failed = [r for r in read if isinstance(r, str)]
    if failed:
        return replace(obs, errors=(*obs.errors, *failed))
    rates = [refusals.rate(e) for e in endpoints]
    known = [r for r in rates if r is not None]
    return replace(
        obs,
        router_queued=sum(r.queued for r in read if not isinstance(r, str)),
        router_refused_rps=sum(known) if len(known) == len(rates) else None,
    )
