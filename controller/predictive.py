"""Predictive pre-scaling: a ScalingAdvisor that sizes the fleet for the forecast load.

Per policy it forecasts the request rate (:class:`controller.forecast.AutoForecaster`,
one observation per tick) and derives prompt and output tokens/s from it with the
smoothed tokens per request (lengths drift far more slowly than arrivals, and one
forecaster instead of three keeps refits cheap), then asks
the capacity model how many replicas each forecast bin needs at the *upper*
quantile of its prediction interval.  The advice is the most any bin over the
next lead time needs, so:

- scale-ups happen one lead time (pod start-up) before the forecast need arrives;
- a scale-down is advised only when the forecast over the whole next lead time
  stays below the current fleet (the core then enforces the cooldown).

Floors: the need of the load observed now, and the reactive queue-depth floor.
Observed p99 latencies correct the capacity model online.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from controller.capacity import CapacityModel, Load
from controller.forecast import AutoForecaster, ForecastConfig
from controller.policy import Policy
from controller.types import Advice, PolicyObservation, Reason, Scalar

__all__ = ["PredictiveAdvisor", "PredictiveConfig"]

LENGTH_SMOOTHING = 0.05
"""EWMA weight of each tick's mean prompt and output tokens per request."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PredictiveConfig:
    quantile: float = 0.9
    """Upper quantile of the forecast interval that the fleet is sized for."""
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    """Bin width should equal the controller's tick; horizon is raised to the policy's lead time."""
    correct_online: bool = True

    def __post_init__(self) -> None:
        if not 0.5 <= self.quantile < 1:
            raise ValueError(f"quantile must be in [0.5, 1), got {self.quantile}")


@dataclass
class _PolicyForecasts:
    rate: AutoForecaster
    last_observed_at_s: float | None = None
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None

    def observe_lengths(self, rate: float, prompt: float, output: float) -> None:
        if rate <= 0:
            return
        if self.mean_prompt_tokens is None or self.mean_output_tokens is None:
            self.mean_prompt_tokens, self.mean_output_tokens = prompt / rate, output / rate
            return
        w = LENGTH_SMOOTHING
        self.mean_prompt_tokens = (1 - w) * self.mean_prompt_tokens + w * prompt / rate
        self.mean_output_tokens = (1 - w) * self.mean_output_tokens + w * output / rate


class PredictiveAdvisor:
    """Replicas needed over the next lead time at the forecast's upper quantile."""

    name = "predictive"

    def __init__(self, capacity: CapacityModel | None = None, config: PredictiveConfig | None = None) -> None:
        self.capacity = capacity or CapacityModel()
        self.config = config or PredictiveConfig()
        self._state: dict[str, _PolicyForecasts] = {}
        self.last_forecast: dict[str, tuple[float, float, float]] = {}
        """Per policy: (point, lower, upper) request-rate forecast one lead time ahead (for plots)."""

    def _forecasts(self, policy: Policy) -> _PolicyForecasts:
        state = self._state.get(policy.name)
        if state is None:
            base = self.config.forecast
            horizon_s = max(base.horizon_s, float(policy.lead_time_s), base.bin_s)
            config = ForecastConfig(
                bin_s=base.bin_s,
                horizon_s=horizon_s,
                keep_s=base.keep_s,
                refit_every_bins=base.refit_every_bins,
                fit_window_bins=base.fit_window_bins,
                selection_bins=base.selection_bins,
                season_s=base.season_s,
                min_history_bins=base.min_history_bins,
                candidates=base.candidates,
                ma_window_bins=base.ma_window_bins,
            )
            state = _PolicyForecasts(AutoForecaster(config))
            self._state[policy.name] = state
        return state

    def advise(self, policy: Policy, observation: PolicyObservation, now_s: float) -> Advice:
        obs = observation
        values = (obs.request_rate_rps, obs.prompt_tokens_per_s, obs.output_tokens_per_s)
        if any(v is None or not math.isfinite(v) or v < 0 for v in values):
            return Advice(replicas_needed=None, reasons=(Reason.INSUFFICIENT_DATA,))
        rate, prompt, output = (float(v) for v in values if v is not None)
        now_load = Load(request_rate_rps=rate, prompt_tokens_per_s=prompt, output_tokens_per_s=output)
        state = self._forecasts(policy)
        if state.last_observed_at_s is None or obs.observed_at_s > state.last_observed_at_s:
            state.rate.observe(rate)
            state.observe_lengths(rate, prompt, output)
            state.last_observed_at_s = obs.observed_at_s
        ready = obs.ready_replicas if obs.ready_replicas is not None else obs.current_replicas or 0
        if self.config.correct_online and obs.sli is not None:
            self.capacity.correct(
                load=now_load, ready_replicas=ready, ttft_p99_s=obs.sli.ttft_p99_s, itl_p99_s=obs.sli.itl_p99_s
            )

        details: dict[str, Scalar] = {
            "ttft_correction": round(self.capacity.ttft_correction, 4),
            "itl_correction": round(self.capacity.itl_correction, 4),
        }
        needs = self._load_needs(policy, obs, now_load, ready)
        point, upper, horizon_s = self._forecast_need(policy, state, obs, needs, details)
        need = max(n for n, _ in needs)
        reasons = tuple(dict.fromkeys(str(r) for n, r in needs if n == need))
        return Advice(
            replicas_needed=need,
            reasons=reasons,
            forecast_request_rate_rps=point,
            forecast_request_rate_upper_rps=upper,
            forecast_horizon_s=horizon_s,
            details=details,
        )

    def _load_needs(
        self, policy: Policy, obs: PolicyObservation, now_load: Load, ready: int
    ) -> list[tuple[int, str]]:
        """Replicas the current load needs, and those that drain the queue within the lead time."""
        needs: list[tuple[int, str]] = [(self.capacity.replicas_needed(now_load), "current_load")]
        queue = obs.queue_depth
        if queue is not None and queue > 0:
            floor = self.capacity.queue_floor(
                queue_depth=queue, ready_replicas=ready, load=now_load, drain_s=float(policy.lead_time_s)
            )
            if floor > 0:
                needs.append((floor, Reason.QUEUE_DEPTH))
        return needs

    def _forecast_need(
        self,
        policy: Policy,
        state: _PolicyForecasts,
        obs: PolicyObservation,
        needs: list[tuple[int, str]],
        details: dict[str, Scalar],
    ) -> tuple[float | None, float | None, float | None]:
        """Add what the forecast of the next lead time needs to ``needs``; (point, upper, horizon_s) of it.

        Without a forecast yet, the current count is a need: nothing says the load will stay low.
        """
        rate_fc = state.rate.forecast(quantile=self.config.quantile)
        prompt_per_request = state.mean_prompt_tokens
        output_per_request = state.mean_output_tokens
        if rate_fc is None or prompt_per_request is None or output_per_request is None:
            details["model"] = "warming_up"
            if obs.current_replicas is not None:
                needs.append((obs.current_replicas, "warming_up"))
            return None, None, None
        # Every bin has the same lengths, so the need grows with the rate: the busiest bin of
        # the next lead time decides (one capacity inversion instead of one per bin).
        upper_rate = float(np.max(rate_fc.upper))
        forecast_need = self.capacity.replicas_needed(
            Load(
                request_rate_rps=upper_rate,
                prompt_tokens_per_s=upper_rate * prompt_per_request,
                output_tokens_per_s=upper_rate * output_per_request,
            )
        )
        needs.append((forecast_need, Reason.FORECAST))
        point = float(rate_fc.point[-1])
        lower = float(rate_fc.lower[-1])
        self.last_forecast[policy.name] = (point, lower, float(rate_fc.upper[-1]))
        details["model"] = rate_fc.model
        details["forecast_lower_rps"] = lower
        return point, upper_rate, len(rate_fc.upper) * rate_fc.bin_s
