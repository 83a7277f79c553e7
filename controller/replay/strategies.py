"""The scaling strategies a replay compares, each reading what its real counterpart reads.

Every strategy sees the fleet only through :class:`controller.replay.signals.FleetView`
(scraped metrics, and the orchestrator's replica counts), and returns the replica
count to set at the end of each tick:

- ``static``: one count for the whole run, sized by the controllers' capacity model
  for the trace's peak (knob: the model's headroom);
- ``hpa``: a Kubernetes HPA (behavior path, documented defaults) on a Pods metric that
  a custom-metrics adapter serves: each pod's share of the fleet's *served* load,
  ``rate(prompt_tokens[2m]) / P + rate(generation_tokens[2m]) / D`` with ``P`` and ``D``
  the profile's SLO-sustainable prefill and decode tokens/s at a reference length mix
  (knob: the AverageValue target);
- ``keda-queue``: KEDA's Prometheus trigger on ``sum(vllm:num_requests_waiting)``,
  External metric with an AverageValue target, legacy HPA path (knob: the threshold);
- ``keda-kv``: the same on ``sum(vllm:kv_cache_usage_perc)`` (knob: the threshold);
- ``dynamo``: NVIDIA Dynamo's SLA planner, throughput-based (knobs: predictor and headroom);
- ``dynamo-load``: Dynamo's load-based planner on aggregated workers, its default mode (knobs: the
  scale-up and scale-down thresholds on each engine's KV demand);
- ``moeslo``: the production decision core, built as the service builds it
  (knobs: forecast quantile and scale-down cooldown);
- ``oracle``: knows each tick's true load and the true world, orders each replica one
  start-up ahead and drops it at once (knob: headroom).  It is a reference, not a
  floor: its attainment depends on its headroom, and policies that keep replicas a
  little longer can beat it at equal replica-hours.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import numpy as np

from contracts.errors import ValidationError
from contracts.slo_defaults import LATENCY_TARGET, SIZING_HEADROOM
from contracts.traces import FloatArray
from controller.builder import CoreOptions, build_decision_core
from controller.capacity import ReplicaProfile, Targets
from controller.core import DecisionCore
from controller.policy import (
    ForecastSettings,
    LatencyObjective,
    LocalTarget,
    Objectives,
    Policy,
    Scaling,
    TtftObjective,
)
from controller.predictive import PredictiveAdvisor
from controller.replay.dynamo import DynamoPlanner
from controller.replay.hpa import (
    DEFAULT_BEHAVIOR,
    DOWNSCALE_STABILIZATION_S,
    HorizontalPodAutoscaler,
    external_per_pod_replicas,
    milli,
    pods_average_value_replicas,
)
from controller.replay.signals import FleetView
from controller.sources.base import RATE_WINDOW_S
from controller.types import TickInput

__all__ = [
    "BASELINES",
    "STRATEGY_NAMES",
    "CoreStrategy",
    "DynamoLoadStrategy",
    "DynamoStrategy",
    "HpaLoadStrategy",
    "KedaStrategy",
    "OracleStrategy",
    "ReplayStrategy",
    "StaticStrategy",
    "production_core",
]

STRATEGY_NAMES = ("static", "hpa", "keda-queue", "keda-kv", "dynamo", "dynamo-load", "moeslo", "oracle")
BASELINES = ("static", "hpa", "keda-queue", "keda-kv", "dynamo", "dynamo-load")
"""What users would pick instead (the oracle is a reference, not a baseline)."""


class ReplayStrategy(Protocol):
    @property
    def name(self) -> str: ...

    def desired(self, view: FleetView) -> int: ...


class StaticStrategy:
    name = "static"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def desired(self, view: FleetView) -> int:
        return self.replicas


class OracleStrategy:
    """Replicas for the true load of every tick, ordered one start-up time ahead."""

    name = "oracle"

    def __init__(self, needs_per_tick: FloatArray, *, lead_ticks: int) -> None:
        needs = np.asarray(needs_per_tick, dtype=np.float64)
        padded = np.r_[needs, np.full(lead_ticks, needs[-1] if len(needs) else 0.0)]
        windows = np.lib.stride_tricks.sliding_window_view(padded, lead_ticks + 1)
        self.plan = windows.max(axis=1).astype(np.int64)

    def desired(self, view: FleetView) -> int:
        # Decided at the end of tick `tick`: cover ticks tick+1 .. tick+1+lead.
        return int(self.plan[min(view.tick + 1, len(self.plan) - 1)])


class HpaLoadStrategy:
    """An HPA on the served-load share per pod, from a custom-metrics adapter (Pods metric, AverageValue)."""

    name = "hpa"

    def __init__(
        self,
        *,
        target: float,
        prefill_tokens_per_s_at_slo: float,
        decode_tokens_per_s_at_slo: float,
        max_replicas: int,
        rate_window_s: float = 120.0,
        scale_down_window_s: float = DOWNSCALE_STABILIZATION_S,
        legacy: bool = False,
    ) -> None:
        self.target_milli = milli(target)
        self.prefill = prefill_tokens_per_s_at_slo
        self.decode = decode_tokens_per_s_at_slo
        self.rate_window_s = rate_window_s
        down = replace(DEFAULT_BEHAVIOR.scale_down, window_s=scale_down_window_s)
        behavior = replace(DEFAULT_BEHAVIOR, scale_down=down)
        self.hpa = HorizontalPodAutoscaler(max_replicas=max_replicas, behavior=None if legacy else behavior,
                                           downscale_stabilization_s=scale_down_window_s)  # fmt: skip

    def desired(self, view: FleetView) -> int:
        pipeline, tick = view.pipeline, view.tick
        with_series = pipeline.gauge(tick, "ready")
        proposal = None
        if with_series is not None and with_series >= 1:
            load = (
                pipeline.rate(tick, "prompt_tokens", self.rate_window_s) / self.prefill
                + pipeline.rate(tick, "output_tokens", self.rate_window_s) / self.decode
            )
            reporting = min(int(with_series), view.ready_replicas)
            per_pod = milli(load / with_series)
            proposal = pods_average_value_replicas(
                [per_pod] * reporting,
                missing=max(view.spec_replicas - reporting, 0),
                unready=0,
                target_milli=self.target_milli,
                current=view.spec_replicas,
            )
        return self.hpa.sync(view.now_s, spec_replicas=view.spec_replicas, proposals=[proposal])


class KedaStrategy:
    """KEDA's Prometheus trigger: ``sum(<gauge>)`` as an External metric, AverageValue, legacy HPA."""

    def __init__(self, *, name: str, gauge: str, threshold: float, max_replicas: int) -> None:
        self.name = name
        self.gauge = gauge
        self.threshold_milli = milli(threshold)
        self.hpa = HorizontalPodAutoscaler(max_replicas=max_replicas, behavior=None)

    def desired(self, view: FleetView) -> int:
        value = view.pipeline.gauge(view.tick, self.gauge)
        proposal = None
        if value is not None:
            # ExecutePromQuery: NaN / Inf -> 0; no series (sum of nothing) -> 0 with ignoreNullValues.
            total = milli(max(value, 0.0))
            proposal = external_per_pod_replicas(
                total, target_average_milli=self.threshold_milli, status_replicas=view.spec_replicas
            )
        return self.hpa.sync(view.now_s, spec_replicas=view.spec_replicas, proposals=[proposal])


class DynamoStrategy:
    """Dynamo's SLA planner, reading its frontend's histograms (PodMonitor scrape every 5 s)."""

    name = "dynamo"

    def __init__(self, planner: DynamoPlanner, *, scrape_s: float = 5.0) -> None:
        self.planner = planner
        self.scrape_s = scrape_s

    def desired(self, view: FleetView) -> int:
        planner = self.planner
        if not planner.due(view.now_s):
            return view.spec_replicas
        window = view.pipeline.frontend_window(
            view.tick, planner.settings.adjustment_interval_s, scrape_s=self.scrape_s
        )
        decided = planner.tick(
            view.now_s,
            window,
            ready_workers=view.ready_replicas,
            deployment_ready=view.ready_replicas >= view.spec_replicas,
        )
        return view.spec_replicas if decided is None else decided


class DynamoLoadStrategy:
    """Dynamo's load-based planner with ``mode: agg`` (ai-dynamo/dynamo ``components/src/dynamo/planner/core/``
    ``load_scaling.py``, ``state_machine.py``): every ``load_adjustment_interval`` (5 s) it reads each engine's
    latest forward-pass metrics, and with ``u = (scheduled decode KV + queued decode KV + queued prefill
    tokens) / max_kv_tokens`` adds one worker when any engine's ``u`` passes ``scale_up``, removes one when
    every engine's is under ``scale_down``, and only observes while a scaling is in progress (replicas asked
    for != ready).  Its ``throughput`` target is (1.0, 0.6), ``latency`` (0.4, 0.1), ``load`` the user's pair.

    One adaptation, stated: the replay decides once a tick (15 s), so a scale-down removes up to one worker per
    interval in the tick, at the tick's reading (the removed engines' KV does not move in seconds)."""

    name = "dynamo-load"

    def __init__(
        self, *, scale_up: float, scale_down: float, max_replicas: int, tick_s: float, interval_s: float = 5.0
    ) -> None:
        if not 0.0 < scale_down < scale_up:
            raise ValidationError(f"dynamo-load needs 0 < scale_down < scale_up, got {scale_down} and {scale_up}")
        self.scale_up = scale_up
        self.scale_down = scale_down
        self.max_replicas = max_replicas
        self.intervals_per_tick = max(round(tick_s / interval_s), 1)
        self.interval_s = interval_s

    def desired(self, view: FleetView) -> int:
        spec = view.spec_replicas
        if spec != view.ready_replicas:
            return spec  # a scaling in progress: the planner only observes
        demand = view.pipeline.gauge(view.tick, "kv_demand_max", scrape_s=self.interval_s)
        if demand is None:
            return spec
        if demand > self.scale_up:
            return min(spec + 1, self.max_replicas)
        if demand < self.scale_down:
            return max(spec - self.intervals_per_tick, 1)
        return spec


def production_core(
    *, profile: ReplicaProfile, tick_s: float, refit_every_ticks: int, season_s: float | None,
    rate_window_s: float = RATE_WINDOW_S,
) -> DecisionCore:
    """The decision core as the service builds it (:func:`controller.builder.build_decision_core`)."""
    options = CoreOptions(
        tick_interval_s=tick_s,
        profile=profile,
        refit_every_ticks=refit_every_ticks,
        season_s=season_s,
        rate_window_s=rate_window_s,
        isolate_advisor_errors=False,
    )
    return build_decision_core(options)


class CoreStrategy:
    """The production decision core, driven tick by tick with the production source's observations."""

    name = "moeslo"

    def __init__(self, core: DecisionCore, policy: Policy) -> None:
        self.core = core
        self.policy = policy
        self.reasons: dict[str, int] = {}

    @classmethod
    def for_replay(
        cls,
        core: DecisionCore,
        *,
        lead_time_s: int,
        cooldown_s: int,
        max_replicas: int,
        quantile: float,
        headroom: float = SIZING_HEADROOM,
        ttft: Targets | None = None,
    ) -> CoreStrategy:
        """The policy a user would write: the replay's bounds and lead time, the knobs' quantile, cooldown and
        sizing headroom, and the replay's TTFT objective (threshold and long-prompt allowance)."""
        targets = ttft or Targets()
        allowance = targets.ttft_allowance
        objectives = Objectives(
            ttft=TtftObjective(
                threshold_s=targets.ttft_s, target=LATENCY_TARGET,
                reference_prompt_tokens=allowance.reference_prompt_tokens,
                per_1k_prompt_tokens_s=allowance.per_1k_prompt_tokens_s,
            ),
            itl=LatencyObjective(threshold_s=targets.itl_s, target=LATENCY_TARGET),
        )  # fmt: skip
        policy = Policy(
            name="replay",
            target=LocalTarget(),
            objectives=objectives,
            scaling=Scaling(
                min_replicas=1, max_replicas=max_replicas, scale_down_cooldown_s=cooldown_s, max_step=max_replicas,
                headroom=headroom,
            ),
            lead_time_s=lead_time_s,
            forecast=ForecastSettings(quantile=quantile),
        )
        return cls(core, policy)

    @property
    def predictive(self) -> PredictiveAdvisor | None:
        for advisor in self.core.advisors:
            if isinstance(advisor, PredictiveAdvisor):
                return advisor
            inner = getattr(advisor, "predictive", None)
            if isinstance(inner, PredictiveAdvisor):
                return inner
        return None

    def last_forecast(self) -> tuple[float, float, float] | None:
        advisor = self.predictive
        return None if advisor is None else advisor.last_forecast.get(self.policy.name)

    def desired(self, view: FleetView) -> int:
        obs = replace(view.observation(), policy=self.policy.name)
        effects = self.core.tick(
            TickInput(now_s=view.now_s, policies={self.policy.name: self.policy}, observations={self.policy.name: obs})
        )
        decision = effects.for_policy(self.policy.name)
        for reason in decision.reasons:
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if decision.apply and decision.desired_replicas is not None:
            return decision.desired_replicas
        return view.spec_replicas
