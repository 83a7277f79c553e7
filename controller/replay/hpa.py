"""The Kubernetes HorizontalPodAutoscaler (autoscaling/v2) algorithm, as the controller runs it.

Ported from kubernetes/kubernetes ``pkg/controller/podautoscaler/`` (master, v1.33+):

- ``horizontal.go``: ``reconcileAutoscaler`` (bounds first, then the metric
  proposal), ``recordInitialRecommendation`` (the recommendation history is
  **seeded with the current spec replica count** on the first sync),
  ``computeReplicasForMetrics`` (max over metrics; none valid, or some invalid and
  the rest would scale down: keep the count), the legacy path
  ``normalizeDesiredReplicas`` / ``stabilizeRecommendation`` /
  ``convertDesiredReplicasWithRules`` / ``calculateScaleUpLimit`` (used when
  ``spec.behavior`` is nil, which is how KEDA creates its HPA:
  kedacore/keda ``controllers/keda/hpa.go`` ``newHPAForScaledObject``), and the
  behavior path ``normalizeDesiredReplicasWithBehaviors`` /
  ``stabilizeRecommendationWithBehaviors`` / ``convertDesiredReplicasWithBehaviorRate``
  / ``calculateScaleUpLimitWithScalingRules`` / ``calculateScaleDownLimitWithBehaviors``
  / ``getReplicasChangePerPeriod`` / ``storeScaleEvent``;
- ``replica_calculator.go``: ``Tolerances.isWithin`` (inclusive band),
  ``calcPlainMetricReplicas`` (Pods metric, AverageValue: the missing-pod and
  unready-pod rules), ``GetExternalPerPodMetricReplicas`` (External metric,
  AverageValue: KEDA's default; no readiness logic, ``status.replicas`` pods);
- ``metrics/utilization.go``: ``GetMetricUsageRatio`` (milli-units, integer division).

Defaults from ``config/v1alpha1/defaults.go`` and ``apis/autoscaling/v2/defaults.go``:
15 s sync, 300 s downscale stabilization, tolerance 0.1, behavior scale-up
``{window 0, Max of [4 pods / 15 s, 100 % / 15 s]}`` and scale-down
``{window 300 s, 100 % / 15 s}``.

Everything here is pure arithmetic over an explicit clock: the replay calls
:meth:`HorizontalPodAutoscaler.sync` every 15 simulated seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from contracts.errors import ValidationError

__all__ = [
    "DEFAULT_BEHAVIOR",
    "Behavior",
    "HorizontalPodAutoscaler",
    "HpaPolicy",
    "ScalingRules",
    "external_per_pod_replicas",
    "pods_average_value_replicas",
]

SYNC_PERIOD_S = 15.0
DOWNSCALE_STABILIZATION_S = 300.0
TOLERANCE = 0.1


@dataclass(frozen=True, kw_only=True, slots=True)
class HpaPolicy:
    """One ``HPAScalingPolicy``: at most ``value`` pods (or percent) of change per ``period_s``."""

    kind: Literal["Pods", "Percent"]
    value: int
    period_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class ScalingRules:
    """``HPAScalingRules`` of one direction."""

    window_s: float
    policies: tuple[HpaPolicy, ...]
    select: Literal["Max", "Min", "Disabled"] = "Max"


@dataclass(frozen=True, kw_only=True, slots=True)
class Behavior:
    scale_up: ScalingRules
    scale_down: ScalingRules


DEFAULT_BEHAVIOR = Behavior(
    scale_up=ScalingRules(
        window_s=0.0,
        policies=(HpaPolicy(kind="Pods", value=4, period_s=15.0), HpaPolicy(kind="Percent", value=100, period_s=15.0)),
    ),
    scale_down=ScalingRules(
        window_s=DOWNSCALE_STABILIZATION_S, policies=(HpaPolicy(kind="Percent", value=100, period_s=15.0),)
    ),
)
"""``SetDefaults_HorizontalPodAutoscalerBehavior`` with the controller's 300 s downscale window."""


def _within(ratio: float, tolerance: float) -> bool:
    """``Tolerances.isWithin``: ``1 - tol <= ratio <= 1 + tol`` (inclusive)."""
    return 1.0 - tolerance <= ratio <= 1.0 + tolerance


def milli(value: float) -> int:
    """A metric value as the milli-quantity the HPA computes with (``Quantity.MilliValue()``)."""
    return math.ceil(round(value * 1000.0, 6))


def pods_average_value_replicas(
    ready_values_milli: list[int],
    *,
    missing: int,
    unready: int,
    target_milli: int,
    current: int,
    tolerance: float = TOLERANCE,
) -> int | None:
    """``calcPlainMetricReplicas``: a Pods metric with an AverageValue target.

    ``ready_values_milli`` are the pods that reported a value; ``missing`` pods run
    without a series yet (a replica loading its weights exports nothing), ``unready``
    pods are Pending.  None when no pod reported (the HPA's "did not receive metrics").
    """
    if not ready_values_milli:
        return None
    ready = len(ready_values_milli)
    ratio = (sum(ready_values_milli) // ready) / target_milli
    up_with_unready = unready > 0 and ratio > 1.0
    if not up_with_unready and missing == 0:
        return current if _within(ratio, tolerance) else math.ceil(ratio * ready)
    values = list(ready_values_milli)
    if missing:
        if ratio < 1.0:
            values += [target_milli] * missing  # on the way down, missing pods count as at target
        elif ratio > 1.0:
            values += [0] * missing  # on the way up, as idle
    if up_with_unready:
        values += [0] * unready
    new_ratio = (sum(values) // len(values)) / target_milli
    if _within(new_ratio, tolerance) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current  # the unknown pods could flip the direction: do nothing
    replicas = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
        return current
    return replicas


def external_per_pod_replicas(
    total_milli: int, *, target_average_milli: int, status_replicas: int, tolerance: float = TOLERANCE
) -> int:
    """``GetExternalPerPodMetricReplicas``: an External metric with an AverageValue target (KEDA's)."""
    if status_replicas <= 0:
        return math.ceil(total_milli / target_average_milli)
    ratio = total_milli / (target_average_milli * status_replicas)
    if _within(ratio, tolerance):
        return status_replicas
    return math.ceil(total_milli / target_average_milli)


@dataclass(kw_only=True)
class _History:
    recommendations: list[tuple[int, float]] = field(default_factory=list)
    up_events: list[tuple[int, float]] = field(default_factory=list)
    down_events: list[tuple[int, float]] = field(default_factory=list)


class HorizontalPodAutoscaler:
    """One HPA object's reconcile loop; ``behavior=None`` is the legacy path (KEDA's default)."""

    def __init__(
        self,
        *,
        min_replicas: int = 1,
        max_replicas: int,
        behavior: Behavior | None = None,
        downscale_stabilization_s: float = DOWNSCALE_STABILIZATION_S,
    ) -> None:
        if min_replicas < 1 or max_replicas < min_replicas:
            raise ValidationError(f"need 1 <= min_replicas <= max_replicas, got {min_replicas}, {max_replicas}")
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.behavior = behavior
        self.downscale_stabilization_s = downscale_stabilization_s
        self.history = _History()
        self._seeded = False

    def sync(self, now_s: float, *, spec_replicas: int, proposals: list[int | None]) -> int:
        """One reconcile: the replica count to set, from each metric's proposal (None: metric invalid)."""
        current = spec_replicas
        if not self._seeded:  # recordInitialRecommendation
            self.history.recommendations = [(current, now_s)]
            self._seeded = True
        if current == 0 and self.min_replicas != 0:
            return current  # scaling disabled
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        else:
            valid = [p for p in proposals if p is not None]
            if not valid or (len(valid) < len(proposals) and max(valid) < current):
                return current
            raw = max(valid)
            if self.behavior is None:
                desired = self._normalize_legacy(now_s, current, raw)
            else:
                desired = self._normalize_with_behaviors(now_s, current, raw, self.behavior)
        if desired != current and self.behavior is not None:
            self._store_scale_event(now_s, current, desired)
        return desired

    def _store(self, now_s: float, raw: int, *, older_than_s: float) -> None:
        """Replace one recommendation older than the window (or append): the history stays bounded."""
        recs = self.history.recommendations
        for i, (_, t) in enumerate(recs):
            if t < now_s - older_than_s:
                recs[i] = (raw, now_s)
                return
        recs.append((raw, now_s))

    def _normalize_legacy(self, now_s: float, current: int, raw: int) -> int:
        """``stabilizeRecommendation`` + ``convertDesiredReplicasWithRules``."""
        window = self.downscale_stabilization_s
        kept = [v for v, t in self.history.recommendations if not t < now_s - window]
        stabilized = max([raw, *kept])
        self._store(now_s, raw, older_than_s=window)
        up_cap = int(max(2.0 * current, 4.0))
        high = min(self.max_replicas, up_cap)
        if stabilized < self.min_replicas:
            return self.min_replicas
        return min(stabilized, high)

    def _normalize_with_behaviors(self, now_s: float, current: int, raw: int, behavior: Behavior) -> int:
        """``stabilizeRecommendationWithBehaviors`` + ``convertDesiredReplicasWithBehaviorRate``."""
        up_window, down_window = behavior.scale_up.window_s, behavior.scale_down.window_s
        up_rec = down_rec = raw
        for value, t in self.history.recommendations:
            if t > now_s - up_window:
                up_rec = min(up_rec, value)
            if t > now_s - down_window:
                down_rec = max(down_rec, value)
        stabilized = min(max(current, up_rec), down_rec)
        self._store(now_s, raw, older_than_s=max(up_window, down_window))
        if stabilized > current:
            limit = max(self._scale_up_limit(now_s, current, behavior.scale_up), current)
            return min(stabilized, self.max_replicas, limit)
        if stabilized < current:
            limit = min(self._scale_down_limit(now_s, current, behavior.scale_down), current)
            return max(stabilized, self.min_replicas, limit)
        return stabilized

    def _changed_within(self, events: list[tuple[int, float]], period_s: float, now_s: float) -> int:
        return sum(change for change, t in events if t > now_s - period_s)

    def _period_start(self, now_s: float, current: int, period_s: float) -> int:
        history = self.history
        return (
            current
            - self._changed_within(history.up_events, period_s, now_s)
            + self._changed_within(history.down_events, period_s, now_s)
        )

    def _scale_up_limit(self, now_s: float, current: int, rules: ScalingRules) -> int:
        if rules.select == "Disabled":
            return current
        proposals = []
        for policy in rules.policies:
            start = self._period_start(now_s, current, policy.period_s)
            if policy.kind == "Pods":
                proposals.append(start + policy.value)
            else:
                proposals.append(math.ceil(start * (1 + policy.value / 100)))
        return min(proposals) if rules.select == "Min" else max(proposals)

    def _scale_down_limit(self, now_s: float, current: int, rules: ScalingRules) -> int:
        if rules.select == "Disabled":
            return current
        proposals = []
        for policy in rules.policies:
            start = self._period_start(now_s, current, policy.period_s)
            if policy.kind == "Pods":
                proposals.append(start - policy.value)
            else:
                proposals.append(int(start * (1 - policy.value / 100)))
        return max(proposals) if rules.select == "Min" else min(proposals)

    def _store_scale_event(self, now_s: float, previous: int, new: int) -> None:
        """``storeScaleEvent``: reuse a slot older than the longest policy period, else append."""
        assert self.behavior is not None
        up = new > previous
        rules = self.behavior.scale_up if up else self.behavior.scale_down
        events = self.history.up_events if up else self.history.down_events
        longest = max((p.period_s for p in rules.policies), default=0.0)
        event = (abs(new - previous), now_s)
        for i, (_, t) in enumerate(events):
            if t < now_s - longest:  # markScaleEventsOutdated: Before(cutoff)
                events[i] = event
                return
        events.append(event)
