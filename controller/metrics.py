"""The controller's own Prometheus metrics (``moeslo_*``, see docs/metrics.md).

Created once, on an injected registry, so each test makes a fresh one and
reads values back with ``registry.get_sample_value``.  The service only
calls the small methods here; it never touches a metric object.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

EVALUATION_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ERROR_COMPONENTS = ("prometheus", "scrape", "actuator", "store")


class ControllerMetrics:
    """Every ``moeslo_*`` series the controller service exports."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.desired_replicas = Gauge(
            "moeslo_desired_replicas", "Replicas the last decision asked for", ["policy"], registry=registry
        )
        self.current_replicas = Gauge(
            "moeslo_current_replicas", "Replicas observed", ["policy"], registry=registry
        )
        self.decisions = Counter(
            "moeslo_decisions_total", "Decisions made", ["policy", "action", "reason"], registry=registry
        )
        self.sli = Gauge("moeslo_sli", "Current SLI values", ["policy", "sli"], registry=registry)
        self.error_budget_remaining = Gauge(
            "moeslo_error_budget_remaining",
            "Fraction of the window's error budget left",
            ["policy", "slo"],
            registry=registry,
        )
        self.burn_rate = Gauge(
            "moeslo_burn_rate", "Error-budget burn rate over the window", ["policy", "slo", "window"],
            registry=registry,
        )
        self.evaluation_duration = Histogram(
            "moeslo_evaluation_duration_seconds",
            "One controller tick, all policies",
            buckets=EVALUATION_BUCKETS_S,
            registry=registry,
        )
        self.errors = Counter("moeslo_errors_total", "Errors by adapter", ["component"], registry=registry)
        for component in ERROR_COMPONENTS:
            self.errors.labels(component=component)
        self.leader = Gauge(
            "moeslo_leader", "1 on the replica that holds the leader lease", registry=registry
        )
        self.rebalances = Counter(
            "moeslo_rebalances_total", "Expert rebalances by outcome", ["policy", "outcome"], registry=registry
        )
        self._slis_seen: dict[str, set[str]] = {}
        self._burn_seen: dict[str, set[tuple[str, str]]] = {}
        self._budget_seen: dict[str, set[str]] = {}

    def record_decision(
        self, policy: str, *, action: str, reason: str, desired: int | None, current: int | None
    ) -> None:
        self.decisions.labels(policy=policy, action=action, reason=reason).inc()
        if desired is not None:
            self.desired_replicas.labels(policy=policy).set(desired)
        if current is not None:
            self.current_replicas.labels(policy=policy).set(current)

    def set_current_replicas(self, policy: str, replicas: int) -> None:
        self.current_replicas.labels(policy=policy).set(replicas)

    def set_slis(self, policy: str, values: Mapping[str, float | None]) -> None:
        """Known SLIs are set; unknown ones (None) are removed, so no stale value lingers."""
        seen = self._slis_seen.setdefault(policy, set())
        for name, value in values.items():
            if value is None:
                if name in seen:
                    self.sli.remove(policy, name)
                    seen.discard(name)
                continue
            self.sli.labels(policy=policy, sli=name).set(value)
            seen.add(name)

    def set_error_budget(self, policy: str, slo: str, remaining: float | None) -> None:
        seen = self._budget_seen.setdefault(policy, set())
        if remaining is None:
            if slo in seen:
                self.error_budget_remaining.remove(policy, slo)
                seen.discard(slo)
            return
        self.error_budget_remaining.labels(policy=policy, slo=slo).set(remaining)
        seen.add(slo)

    def set_burn_rate(self, policy: str, slo: str, window: str, rate: float | None) -> None:
        seen = self._burn_seen.setdefault(policy, set())
        if rate is None:
            if (slo, window) in seen:
                self.burn_rate.remove(policy, slo, window)
                seen.discard((slo, window))
            return
        self.burn_rate.labels(policy=policy, slo=slo, window=window).set(rate)
        seen.add((slo, window))

    def observe_evaluation(self, duration_s: float) -> None:
        self.evaluation_duration.observe(duration_s)

    def error(self, component: str) -> None:
        self.errors.labels(component=component).inc()

    def record_rebalance(self, policy: str, outcome: str) -> None:
        self.rebalances.labels(policy=policy, outcome=outcome).inc()

    def set_leader(self, leader: bool) -> None:
        self.leader.set(1 if leader else 0)

    def forget_policy(self, policy: str) -> None:
        """Drop every per-policy series of a deleted policy (decision counters stay: they are history)."""
        for gauge in (self.desired_replicas, self.current_replicas):
            with contextlib.suppress(KeyError):
                gauge.remove(policy)
        for name in self._slis_seen.pop(policy, set()):
            self.sli.remove(policy, name)
        for slo in self._budget_seen.pop(policy, set()):
            self.error_budget_remaining.remove(policy, slo)
        for slo, window in self._burn_seen.pop(policy, set()):
            self.burn_rate.remove(policy, slo, window)
