"""The router's Prometheus series, created once per registry (inject a fresh one per test).

Labels: ``replica`` is a replica URL, ``decision`` a policy's reason word (:mod:`router.policies`), ``outcome``
one of :data:`OUTCOMES`.  A replica that leaves the set (the controller scaled it away) takes its gauges with it,
but its request counts stay, so a rate over a window that saw it stays right: with replicas listed by the
controller, ``moeslo_router_requests_total`` holds one set of series per replica URL ever routed to, until the
router restarts (a pod's IP, so a few per scale-up).  Children are bound once per replica, so a request costs
dictionary lookups, not label parsing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from contracts.catalogue import (
    DECISION_LABEL,
    OUTCOME_LABEL,
    REJECTED_OUTCOME,
    REPLICA_LABEL,
    ROUTER_EJECTIONS,
    ROUTER_OBSERVED_TTFT_HISTOGRAM,
    ROUTER_OUTSTANDING,
    ROUTER_OVERHEAD_BUCKETS_S,
    ROUTER_OVERHEAD_HISTOGRAM,
    ROUTER_PREDICTED_TTFT_HISTOGRAM,
    ROUTER_QUEUE_WAIT_HISTOGRAM,
    ROUTER_QUEUED,
    ROUTER_REPLICA_HEALTHY,
    ROUTER_REQUESTS,
    ROUTER_TTFT_ERROR_BUCKETS_S,
    ROUTER_TTFT_ERROR_HISTOGRAM,
    TTFT_BUCKETS_S,
)

INVALID_REQUEST_OUTCOME = "invalid_request"
OUTCOMES = ("ok", "upstream_status", "upstream_error", "upstream_failed_mid_stream", "client_disconnected",
            REJECTED_OUTCOME, "unavailable", INVALID_REQUEST_OUTCOME)  # fmt: skip
"""``ok``: relayed (any 2xx); ``upstream_status``: the replica's own 4xx/5xx relayed (or a stream it ended with
an error event); ``upstream_error``: no usable answer (502/504); ``upstream_failed_mid_stream``: a stream broke
after it began; ``rejected``: 429 at admission; ``unavailable``: no healthy replica (503); ``invalid_request``: a
body that is not a JSON object (400, under replica and decision ``none``)."""
NO_REPLICA_LABEL = "none"


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry, replicas: Sequence[str]) -> None:
        self.registry = registry
        self._requests = Counter(ROUTER_REQUESTS, "Requests by replica, policy decision and outcome.",
                                 [REPLICA_LABEL, DECISION_LABEL, OUTCOME_LABEL], registry=registry)  # fmt: skip
        predicted = Histogram(ROUTER_PREDICTED_TTFT_HISTOGRAM, "TTFT the cost model predicted for the chosen replica.",
                              [REPLICA_LABEL], buckets=TTFT_BUCKETS_S, registry=registry)  # fmt: skip
        observed = Histogram(ROUTER_OBSERVED_TTFT_HISTOGRAM, "TTFT seen by the router (first streamed byte).",
                             [REPLICA_LABEL], buckets=TTFT_BUCKETS_S, registry=registry)  # fmt: skip
        error = Histogram(ROUTER_TTFT_ERROR_HISTOGRAM, "Observed minus predicted TTFT of streamed requests.",
                          [REPLICA_LABEL], buckets=ROUTER_TTFT_ERROR_BUCKETS_S, registry=registry)  # fmt: skip
        self.overhead = Histogram(ROUTER_OVERHEAD_HISTOGRAM,
                                  "Router time per request before its upstream send (parse, state, policy).",
                                  buckets=ROUTER_OVERHEAD_BUCKETS_S, registry=registry)  # fmt: skip
        # A wait in line is the fleet's lack of room, not the router's work: kept out of the overhead histogram.
        self.queue_wait = Histogram(ROUTER_QUEUE_WAIT_HISTOGRAM,
                                    "Time a request was held at admission (queue mode), however its wait ended.",
                                    buckets=TTFT_BUCKETS_S, registry=registry)  # fmt: skip
        outstanding = Gauge(ROUTER_OUTSTANDING, "Requests in flight from the router.", [REPLICA_LABEL],
                            registry=registry)  # fmt: skip
        healthy = Gauge(ROUTER_REPLICA_HEALTHY, "1 while the replica takes requests, 0 while ejected.",
                        [REPLICA_LABEL], registry=registry)  # fmt: skip
        ejections = Counter(ROUTER_EJECTIONS, "Replicas taken out of routing after a failure.", [REPLICA_LABEL],
                            registry=registry)  # fmt: skip
        self.queued = Gauge(ROUTER_QUEUED, "Requests held at admission (queue mode): the router's own queue.",
                            registry=registry)  # fmt: skip
        self._families: tuple[MetricWrapperBase, ...] = (predicted, observed, error, outstanding, healthy, ejections)
        self._predicted: dict[str, Histogram] = {}
        self._observed: dict[str, Histogram] = {}
        self._error: dict[str, Histogram] = {}
        self.outstanding: dict[str, Gauge] = {}
        self.healthy: dict[str, Gauge] = {}
        self.ejections: dict[str, Counter] = {}
        for name in replicas:
            self.add_replica(name)

    def _bindings(self) -> list[tuple[MetricWrapperBase, dict[str, Any]]]:
        children: list[dict[str, Any]] = [self._predicted, self._observed, self._error, self.outstanding,
                                          self.healthy, self.ejections]  # fmt: skip
        return list(zip(self._families, children, strict=True))

    def add_replica(self, name: str) -> None:
        """Bind a replica's children (healthy until ejected)."""
        for family, children in self._bindings():
            children[name] = family.labels(name)
        self.healthy[name].set(1)

    def remove_replica(self, name: str) -> None:
        """A replica left the set: its series go (its counts of requests stay in ``moeslo_router_requests``)."""
        for family, children in self._bindings():
            if children.pop(name, None) is not None:
                family.remove(name)

    def request(self, replica: str | None, decision: str, outcome: str) -> None:
        self._requests.labels(replica or NO_REPLICA_LABEL, decision, outcome).inc()

    def predicted(self, replica: str, ttft_s: float) -> None:
        if (child := self._predicted.get(replica)) is not None:
            child.observe(ttft_s)

    def observed(self, replica: str, ttft_s: float, predicted_s: float | None) -> None:
        if (child := self._observed.get(replica)) is None:
            return  # the replica left the set while this request ran
        child.observe(ttft_s)
        if predicted_s is not None:
            self._error[replica].observe(ttft_s - predicted_s)


__all__ = ["INVALID_REQUEST_OUTCOME", "NO_REPLICA_LABEL", "OUTCOMES", "ROUTER_QUEUE_WAIT_HISTOGRAM",
           "RouterMetrics"]
