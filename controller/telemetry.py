"""The controller's own Prometheus metrics (``moeslo_*``, see docs/metrics.md).

Created once, on an injected registry, so each test makes a fresh one and
reads values back with ``registry.get_sample_value``.  The service only
calls the small methods here; it never touches a metric object.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from contracts.catalogue import (
    BURN_RATE,
    CURRENT_REPLICAS,
    DECISIONS,
    DESIRED_REPLICAS,
    ERROR_BUDGET_REMAINING,
    ERRORS,
    EVALUATION_BUCKETS_S,
    EVALUATION_DURATION_HISTOGRAM,
    FORECAST_COVERAGE,
    FORECAST_HISTORY,
    FORECAST_RELIABLE,
    FORECAST_REQUESTS_PER_SECOND,
    FORECAST_TOKENS_PER_SECOND,
    FORECAST_WAPE,
    HOST_REPLICA_BUDGET,
    LATENCY_CORRECTION,
    LEADER,
    PROMPT_LENGTH_CV2,
    PROMPT_LENGTH_P99_OVER_MEAN,
    REBALANCES,
    REFIT_DURATION_HISTOGRAM,
    SLI,
    TTFT_INFEASIBLE_REQUESTS,
    TTFT_INFEASIBLE_SHARE,
    total,
)
from controller.types import ForecastView

ERROR_COMPONENTS = ("prometheus", "scrape", "actuator", "store")


class ControllerMetrics:
    """Every ``moeslo_*`` series the controller service exports."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.desired_replicas = Gauge(
            DESIRED_REPLICAS, "Replicas the last decision asked for", ["policy"], registry=registry
        )
        self.current_replicas = Gauge(
            CURRENT_REPLICAS, "Replicas observed", ["policy"], registry=registry
        )
        self.decisions = Counter(
            total(DECISIONS), "Decisions made", ["policy", "action", "reason"], registry=registry
        )
        self.sli = Gauge(SLI, "Current SLI values", ["policy", "sli"], registry=registry)
        self.error_budget_remaining = Gauge(
            ERROR_BUDGET_REMAINING,
            "Fraction of the window's error budget left",
            ["policy", "slo"],
            registry=registry,
        )
        self.burn_rate = Gauge(
            BURN_RATE, "Error-budget burn rate over the window", ["policy", "slo", "window"],
            registry=registry,
        )
        self.evaluation_duration = Histogram(
            EVALUATION_DURATION_HISTOGRAM,
            "One controller tick, all policies, to its logged decisions (the forecast refits after it are timed apart)",
            buckets=EVALUATION_BUCKETS_S,
            registry=registry,
        )
        self.refit_duration = Histogram(
            REFIT_DURATION_HISTOGRAM,
            "The forecast refits after one controller tick, all policies (within the tick's refit budget)",
            buckets=EVALUATION_BUCKETS_S,
            registry=registry,
        )
        self.errors = Counter(total(ERRORS), "Errors by adapter", ["component"], registry=registry)
        for component in ERROR_COMPONENTS:
            self.errors.labels(component=component)
        self.leader = Gauge(
            LEADER, "1 on the replica that holds the leader lease", registry=registry
        )
        self.rebalances = Counter(
            total(REBALANCES), "Expert rebalances by outcome", ["policy", "outcome"], registry=registry
        )
        self._forecast_gauges(registry)
        # Labelled children by (metric name, label values): prometheus_client's labels() validates and
        # locks on every call, which costs more than the whole decision core at 100 policies a tick.
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._last: dict[tuple[str, tuple[str, ...]], float] = {}

    def _forecast_gauges(self, registry: CollectorRegistry) -> None:
        self.forecast_requests = Gauge(
            FORECAST_REQUESTS_PER_SECOND, "Forecast request rate one lead time ahead "
            "(point, interval bounds, and sized: the most the next lead time may see at the sizing quantile)",
            ["policy", "bound"], registry=registry,
        )
        self.forecast_tokens = Gauge(
            FORECAST_TOKENS_PER_SECOND, "Forecast prompt and output tokens per second (point and sized)",
            ["policy", "kind", "bound"], registry=registry,
        )
        self.forecast_wape = Gauge(
            FORECAST_WAPE, "Rolling WAPE of the request-rate forecasts scored against what arrived",
            ["policy"], registry=registry,
        )
        self.forecast_coverage = Gauge(
            FORECAST_COVERAGE, "Share of actual request rates that fell inside the forecast interval",
            ["policy"], registry=registry,
        )
        self.forecast_reliable = Gauge(
            FORECAST_RELIABLE, "1 while the forecast sizes the fleet, 0 while sizing is reactive",
            ["policy"], registry=registry,
        )
        self.forecast_history = Gauge(
            FORECAST_HISTORY, "History the policy's forecaster holds", ["policy"], registry=registry
        )
        self.replica_budget = Gauge(
            HOST_REPLICA_BUDGET, "Most replicas the actuator has room for (local host CPUs)",
            ["policy"], registry=registry,
        )
        self.ttft_infeasible_share = Gauge(
            TTFT_INFEASIBLE_SHARE, "Share of requests no fleet can serve within the TTFT objective",
            ["policy"], registry=registry,
        )
        self.prompt_length_cv2 = Gauge(
            PROMPT_LENGTH_CV2, "Squared coefficient of variation of prompt lengths the capacity model sizes for",
            ["policy"], registry=registry,
        )
        self.prompt_length_p99_over_mean = Gauge(
            PROMPT_LENGTH_P99_OVER_MEAN, "p99 prompt length over the mean the capacity model sizes for",
            ["policy"], registry=registry,
        )
        self.latency_correction = Gauge(
            LATENCY_CORRECTION, "Online correction of the capacity model: the load multiplier it sizes with for each "
            "latency SLI (observed p99 over predicted, smoothed; 1: the profile as is)", ["policy", "sli"],
            registry=registry,
        )
        self.ttft_infeasible = Counter(
            TTFT_INFEASIBLE_REQUESTS, "Requests no fleet can serve within the TTFT objective (share x rate x tick)",
            ["policy"], registry=registry,
        )

    def _child(self, metric: Gauge | Counter, *values: str) -> Any:
        key = (metric._name, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def _drop(self, metric: Gauge | Counter, *values: str) -> None:
        self._last.pop((metric._name, values), None)
        if self._children.pop((metric._name, values), None) is not None:
            with contextlib.suppress(KeyError):
                metric.remove(*values)

    def _set_or_drop(self, metric: Gauge, value: float | None, *values: str) -> None:
        """Known values are set; unknown ones (None) are removed, so no stale value lingers."""
        if value is None:
            self._drop(metric, *values)
            self._last.pop((metric._name, values), None)
            return
        key = (metric._name, values)
        if self._last.get(key) != value:  # most values repeat between ticks: skip the locked write
            self._child(metric, *values).set(value)
            self._last[key] = value

    def record_decision(
        self, policy: str, *, action: str, reason: str, desired: int | None, current: int | None
    ) -> None:
        self._child(self.decisions, policy, action, reason).inc()
        if desired is not None:
            self._child(self.desired_replicas, policy).set(desired)
        if current is not None:
            self._child(self.current_replicas, policy).set(current)

    def set_current_replicas(self, policy: str, replicas: int) -> None:
        self._child(self.current_replicas, policy).set(replicas)

    def set_slis(self, policy: str, values: Mapping[str, float | None]) -> None:
        for name, value in values.items():
            self._set_or_drop(self.sli, value, policy, name)

    def set_error_budget(self, policy: str, slo: str, remaining: float | None) -> None:
        self._set_or_drop(self.error_budget_remaining, remaining, policy, slo)

    def set_burn_rate(self, policy: str, slo: str, window: str, rate: float | None) -> None:
        self._set_or_drop(self.burn_rate, rate, policy, slo, window)

    def set_forecast(self, policy: str, view: ForecastView | None, *, in_use: bool) -> None:
        """The forecast gauges of one policy (all dropped while it has no forecast)."""
        get = (lambda _name: None) if view is None else (lambda name: getattr(view, name))
        for bound, name in (("point", "request_rate_rps"), ("lower", "request_rate_lower_rps"),
                            ("upper", "request_rate_upper_rps"), ("sized", "sized_request_rate_rps")):
            self._set_or_drop(self.forecast_requests, get(name), policy, bound)
        for kind in ("prompt", "output"):
            self._set_or_drop(self.forecast_tokens, get(f"{kind}_tokens_per_s"), policy, kind, "point")
            self._set_or_drop(self.forecast_tokens, get(f"sized_{kind}_tokens_per_s"), policy, kind, "sized")
        self._set_or_drop(self.forecast_wape, get("wape"), policy)
        self._set_or_drop(self.forecast_coverage, get("coverage"), policy)
        self._set_or_drop(self.forecast_history, get("history_s"), policy)
        self._set_or_drop(self.forecast_reliable, None if view is None else float(in_use), policy)

    def set_replica_budget(self, policy: str, budget: int | None) -> None:
        self._set_or_drop(self.replica_budget, None if budget is None else float(budget), policy)

    def record_infeasible(self, policy: str, share: float | None, requests: float) -> None:
        """The infeasible share now, and the requests it stands for since the last tick (an estimate)."""
        self._set_or_drop(self.ttft_infeasible_share, share, policy)
        if share is not None and requests > 0:
            self.ttft_infeasible.labels(policy=policy).inc(share * requests)

    def record_length_tail(self, policy: str, cv2: float | None, p99_over_mean: float | None) -> None:
        """The prompt-length tail the capacity model sizes for (absent until it has read one)."""
        self._set_or_drop(self.prompt_length_cv2, cv2, policy)
        self._set_or_drop(self.prompt_length_p99_over_mean, p99_over_mean, policy)

    def record_corrections(self, policy: str, ttft: float | None, itl: float | None) -> None:
        """The capacity model's online corrections (absent while the policy has no model)."""
        self._set_or_drop(self.latency_correction, ttft, policy, "ttft")
        self._set_or_drop(self.latency_correction, itl, policy, "itl")

    def observe_evaluation(self, duration_s: float) -> None:
        self.evaluation_duration.observe(duration_s)

    def observe_refits(self, duration_s: float) -> None:
        self.refit_duration.observe(duration_s)

    def error(self, component: str) -> None:
        self.errors.labels(component=component).inc()

    def record_rebalance(self, policy: str, outcome: str) -> None:
        self.rebalances.labels(policy=policy, outcome=outcome).inc()

    def set_leader(self, leader: bool) -> None:
        self.leader.set(1 if leader else 0)

    def forget_policy(self, policy: str) -> None:
        """Drop every per-policy gauge of a deleted policy (counters stay: they are history)."""
        gauges = {g._name: g for g in (self.desired_replicas, self.current_replicas, self.sli,
                                       self.error_budget_remaining, self.burn_rate, self.forecast_requests,
                                       self.forecast_tokens, self.forecast_wape, self.forecast_coverage,
                                       self.forecast_reliable, self.forecast_history, self.replica_budget,
                                       self.ttft_infeasible_share, self.prompt_length_cv2,
                                       self.prompt_length_p99_over_mean, self.latency_correction)}
        for name, values in [key for key in self._children if key[0] in gauges and key[1][0] == policy]:
            self._drop(gauges[name], *values)
