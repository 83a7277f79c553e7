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

from collections.abc import Mapping
from dataclasses import dataclass, replace

from prometheus_client.parser import text_string_to_metric_families

from contracts.catalogue import OUTCOME_LABEL, REJECTED_OUTCOME, ROUTER_QUEUED, ROUTER_REQUESTS, total
from controller.policy import Policy
from controller.sources.counters import CounterHistory, counter_rate
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


REFUSED = "refused"


class RefusalRates:
    """Per router endpoint, the rate of refusals over ``window_s`` (as ``rate()`` over the same window)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._history: dict[str, CounterHistory] = {}
        self._last: dict[str, float] = {}

    def record(self, endpoint: str, now_s: float, refused_total: float) -> None:
        history = self._history.setdefault(endpoint, CounterHistory())
        history.add(REFUSED, refused_total, self._last.get(endpoint))
        self._last[endpoint] = refused_total
        # Twice the window: the read at or before the window's start stays, so the rate covers all of it.
        history.record(now_s, lambda _key: True, 2 * self.window_s)

    def rate(self, endpoint: str) -> float | None:
        """Refusals per second over the window up to the last read (None before a second read)."""
        history = self._history.get(endpoint)
        if history is None or not history.points:
            return None
        return counter_rate(history, REFUSED, history.points[-1][0], self.window_s)


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
