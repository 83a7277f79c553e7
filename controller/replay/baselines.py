"""The scaling strategies a replay compares (the baselines and ours), each turning an observation into a replica count.

- ``static``: sized once for the trace's peak (what many deployments do).
- ``hpa``: the Kubernetes HorizontalPodAutoscaler algorithm with the mission's recommended
  settings: 70 % utilization target, 10 % tolerance, 3-minute scale-down stabilization,
  scale-up at most max(4 pods, 100 %) per 15 s sync.  Utilization is the share of the
  SLO-sustainable throughput (prefill and decode) each ready replica carries.
- ``dynamo``: a Dynamo-style planner: every adjustment interval, an ARIMA point forecast
  of the next interval's request rate and prompt/output lengths, turned into replicas by
  throughput interpolation against the profile (no lead time, no interval, immediate
  scale-down).
- ``moeslo``: the production decision core, built by
  :func:`controller.builder.build_decision_core`, what the service runs (not a copy).
- ``oracle``: knows the future load; orders each replica one start-up time before it
  is needed and drops it as soon as it is not: the lower bound of replica-hours.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from typing import Protocol

import numpy as np

from contracts.traces import FloatArray
from controller.builder import CoreOptions, build_decision_core
from controller.capacity import CapacityModel, ReplicaProfile
from controller.forecast.models import Arima
from controller.policy import ForecastSettings, LocalTarget, Policy, Scaling
from controller.sizing import SizingAdvisor
from controller.types import PolicyObservation

STRATEGY_NAMES = ("static", "hpa", "dynamo", "moeslo", "oracle")


class ReplayStrategy(Protocol):
    @property
    def name(self) -> str: ...

    def desired(self, observation: PolicyObservation, now_s: float, tick: int) -> int: ...


class StaticStrategy:
    name = "static"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas

    def desired(self, observation: PolicyObservation, now_s: float, tick: int) -> int:
        return self.replicas


class OracleStrategy:
    """Replicas for the real load of every tick, ordered one start-up time ahead."""

    name = "oracle"

    def __init__(self, needs_per_tick: FloatArray, *, lead_ticks: int) -> None:
        needs = np.asarray(needs_per_tick, dtype=np.float64)
        padded = np.r_[needs, np.full(lead_ticks, needs[-1] if len(needs) else 0.0)]
        windows = np.lib.stride_tricks.sliding_window_view(padded, lead_ticks + 1)
        self.plan = windows.max(axis=1).astype(np.int64)

    def desired(self, observation: PolicyObservation, now_s: float, tick: int) -> int:
        # Decided at the end of tick `tick`: cover ticks tick+1 .. tick+1+lead.
        return int(self.plan[min(tick + 1, len(self.plan) - 1)])


class HpaStrategy:
    """The HPA's replica calculation with stabilization windows."""

    name = "hpa"

    def __init__(
        self,
        *,
        prefill_tokens_per_s_at_slo: float,
        decode_tokens_per_s_at_slo: float,
        target_utilization: float = 0.7,
        tolerance: float = 0.1,
        scale_down_stabilization_s: float = 180.0,
    ) -> None:
        self.prefill = prefill_tokens_per_s_at_slo
        self.decode = decode_tokens_per_s_at_slo
        self.target = target_utilization
        self.tolerance = tolerance
        self.window_s = scale_down_stabilization_s
        self._recommendations: deque[tuple[float, int]] = deque()

    def desired(self, observation: PolicyObservation, now_s: float, tick: int) -> int:
        current = observation.current_replicas or 0
        ready = observation.ready_replicas or 0
        prompt = observation.prompt_tokens_per_s or 0.0
        output = observation.output_tokens_per_s or 0.0
        if ready == 0:
            recommendation = max(current, 1)
        else:
            utilization = (prompt / self.prefill + output / self.decode) / ready
            ratio = utilization / self.target
            recommendation = current if abs(ratio - 1.0) <= self.tolerance else math.ceil(ready * ratio)
            recommendation = max(recommendation, 1)
        recommendation = min(recommendation, max(current * 2, current + 4))
        self._recommendations.append((now_s, recommendation))
        while self._recommendations and self._recommendations[0][0] < now_s - self.window_s:
            self._recommendations.popleft()
        if recommendation >= current:
            return recommendation
        return max(r for _, r in self._recommendations)


class DynamoStyleStrategy:
    """ARIMA point forecast of the next interval's load, replicas by throughput interpolation."""

    name = "dynamo"

    def __init__(
        self,
        capacity: CapacityModel,
        *,
        interval_s: float = 180.0,
        refit_every: int = 10,
        history: int = 240,
    ) -> None:
        self.capacity = capacity
        self.interval_s = interval_s
        self.refit_every = refit_every
        self.history = history
        self._sums = np.zeros(3)
        self._ticks = 0
        self._last_lengths = (0.0, 0.0)
        self._series: list[list[float]] = [[], [], []]
        self._models = [Arima(order=(1, 1), fit_window=history) for _ in range(3)]
        self._since_fit = -1
        self._last_adjust_s: float | None = None
        self._replicas: int | None = None

    def desired(self, observation: PolicyObservation, now_s: float, tick: int) -> int:
        current = observation.current_replicas or 0
        rate = observation.request_rate_rps or 0.0
        prompt = observation.prompt_tokens_per_s or 0.0
        output = observation.output_tokens_per_s or 0.0
        self._sums += np.array([rate, prompt, output])
        self._ticks += 1
        if self._last_adjust_s is not None and now_s - self._last_adjust_s < self.interval_s:
            return self._replicas if self._replicas is not None else current
        # Interval means: request rate, and prompt / output tokens per request weighted by requests.
        requests = self._sums[0]
        means = np.array(
            [
                requests / self._ticks,
                self._sums[1] / requests if requests > 0 else self._last_lengths[0],
                self._sums[2] / requests if requests > 0 else self._last_lengths[1],
            ]
        )
        self._last_lengths = (float(means[1]), float(means[2]))
        self._sums[:] = 0.0
        self._ticks = 0
        self._last_adjust_s = now_s
        refit = self._since_fit < 0 or self._since_fit >= self.refit_every
        predicted = []
        for i, model in enumerate(self._models):
            series = self._series[i]
            series.append(float(means[i]))
            del series[: -self.history]
            if len(series) < 5:
                predicted.append(float(means[i]))
                continue
            if refit:
                model.fit(np.asarray(series))
            else:
                model.update(float(means[i]))
            predicted.append(float(model.forecast(1)[0]))
        if len(self._series[0]) >= 5:
            self._since_fit = 0 if refit else self._since_fit + 1
        rate_next, isl, osl = (max(v, 0.0) for v in predicted)
        if rate_next <= 0:
            self._replicas = 1
            return 1
        prefill_at_slo, decode_at_slo = self.capacity.sustainable_rates(
            mean_prompt_tokens=max(isl, 1.0), mean_output_tokens=max(osl, 1.0)
        )
        replicas = math.ceil(rate_next * isl / prefill_at_slo + rate_next * osl / decode_at_slo)
        self._replicas = max(replicas, 1)
        return self._replicas


class CoreStrategy:
    """The production decision core (:func:`controller.builder.build_decision_core`), driven tick by tick."""

    name = "moeslo"

    def __init__(
        self,
        profile: ReplicaProfile,
        *,
        tick_s: float,
        lead_time_s: int,
        cooldown_s: int,
        max_replicas: int,
        quantile: float,
        refit_every_ticks: int,
        season_s: float | None,
    ) -> None:
        options = CoreOptions(
            tick_interval_s=tick_s,
            profile=profile,
            refit_every_ticks=refit_every_ticks,
            season_s=season_s,
            isolate_advisor_errors=False,
        )
        self.core = build_decision_core(options)
        sizing = self.core.advisors[0]
        assert isinstance(sizing, SizingAdvisor)
        self.advisor = sizing.predictive
        self.policy = Policy(
            name="replay",
            target=LocalTarget(),
            scaling=Scaling(
                min_replicas=1,
                max_replicas=max_replicas,
                scale_down_cooldown_s=cooldown_s,
                max_step=max_replicas,
            ),
            lead_time_s=lead_time_s,
            forecast=ForecastSettings(quantile=quantile),
        )
        self.reasons: dict[str, int] = {}

    def desired(self, observation: PolicyObservation, now_s: float, tick: int) -> int:
        from controller.types import TickInput

        obs = replace(observation, policy=self.policy.name)
        effects = self.core.tick(
            TickInput(now_s=now_s, policies={self.policy.name: self.policy}, observations={self.policy.name: obs})
        )
        decision = effects.for_policy(self.policy.name)
        for reason in decision.reasons:
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if decision.apply and decision.desired_replicas is not None:
            return decision.desired_replicas
        return observation.current_replicas or 0
