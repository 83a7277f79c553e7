"""Predictive pre-scaling: replicas for the load forecast one lead time ahead.

Per policy it forecasts the offered request rate (:class:`controller.forecast.AutoForecaster`, one observation
per tick: the engines' rate, or the one their admitted prompt tokens imply while none has finished, plus what the
entry router refused, :mod:`controller.entry_demand`) and derives prompt and output tokens/s from it with the
smoothed tokens per request (lengths drift far more slowly than arrivals, and one forecaster instead of three
keeps refits cheap), then asks the policy's capacity model how many replicas the busiest bin of the next lead
time needs at the *upper* quantile of its prediction interval (``policy.forecast.quantile``).  So:

- scale-ups happen one lead time (replica start-up) before the forecast need arrives;
- a scale-down is advised only when the forecast over the whole next lead time
  stays below the current fleet (the core then enforces the cooldown).

Floors: the need of the load observed now, and the queue-depth floor (the engines' queue plus the entry router's,
``router_queued``).  Observed p99 latencies correct the capacity model online (per policy).  Every forecast is
audited against what arrived (:class:`controller.forecast.audit.ForecastAudit`); the advice says whether the
forecast is ``warming_up`` or ``forecast_unreliable``, and :class:`controller.sizing.SizingAdvisor` then sizes
reactively instead.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from controller.bursts import burst_load
from controller.capacity import DEFAULT_PROFILE, CapacityModel, Load, ReplicaProfile, Targets
from controller.entry_demand import admitted_load, admitted_rate, offered_load, router_waiting, served_load
from controller.forecast import AutoForecaster, ForecastConfig
from controller.forecast.audit import MIN_SCORED, AuditBounds, ForecastAudit
from controller.policy import Policy
from controller.refit_budget import CHEAP_REFIT_BINS, RefitBudget
from controller.types import Advice, ForecastView, LoadHistory, PolicyObservation, Reason, Scalar

log = logging.getLogger(__name__)

__all__ = ["AUDIT_QUANTILE", "Assessment", "PredictiveAdvisor", "PredictiveConfig"]

AUDIT_QUANTILE = 0.9
"""The forecast audit scores the coverage of the central interval at this quantile (nominally 80 %),
whatever quantile the policy sizes for."""
LENGTH_SMOOTHING = 0.05
"""Weight of each tick's tokens and requests in the decayed sums that give tokens per request."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PredictiveConfig:
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    """Bin width should equal the controller's tick; horizon is raised to each policy's lead time
    and the minimum history to its ``forecast.min_history_s``."""
    profile: ReplicaProfile = DEFAULT_PROFILE
    """Capacity of one replica for policies that name no profile of their own."""
    rate_window_s: float | None = None
    """The observed request rates are arrivals counted over this window: the forecast audit does not hold
    their Poisson noise against the forecast (None: rates taken as exact)."""
    correct_online: bool = True
    min_requests_for_correction: float = 20.0
    """Fewer finished requests than this in the SLI window: its p99s are a few requests' worst (a fresh
    replica's first ones among them), so they do not correct the capacity model (the reactive advisor
    distrusts such an SLI the same way)."""
    refits_per_tick: int = 1
    """Most model refits (backtest, selection, fit: tens of milliseconds each once Holt or ARIMA is a
    candidate, from 37 bins at a 2-minute lead time) one tick spends over all policies; a forecaster whose refit
    waits keeps forecasting with its current model.  Cheap refits (under ``CHEAP_REFIT_BINS`` bins, fitting
    neither) do not count: they have their own budget, and a tick runs refits of one kind only."""
    cheap_refit_bins_per_tick: int = 512
    """Most history bins the cheap refits (about 0.03 ms a bin) one tick spends over all
    policies: many policies started together reach their early refits (when the history doubles) on the
    same ticks, and sixteen at once held a 100-policy tick 130 ms; beyond it they wait for a later tick."""

    def __post_init__(self) -> None:
        if self.cheap_refit_bins_per_tick < CHEAP_REFIT_BINS:  # else the longest short refit never fits
            raise ValueError(f"cheap_refit_bins_per_tick must be >= {CHEAP_REFIT_BINS}, "
                             f"got {self.cheap_refit_bins_per_tick}")  # fmt: skip


@dataclass
class _ReadyHistory:
    """Ready replicas at each observation, back to the start of the SLI window.

    The window's p99s were made by every fleet size it held; its tail comes mostly from its thinnest
    stretch, so the correction compares them with the prediction for the fewest ready replicas.  Against
    the size of the moment, a p99 made before a scale-up reads as a model too optimistic and one made
    before a scale-down as too pessimistic: the corrections then swing the fleet up and down.
    """

    seen: deque[tuple[float, int]] = field(default_factory=deque)
    window_s: float = 300.0
    """The last SLI window read (the SLI's default until one is): older sizes are forgotten."""

    def record(self, at_s: float, ready: int, window_s: float | None) -> None:
        """One observation's ready replicas; sizes older than the window are forgotten (the last one before
        its start is kept: it still held then)."""
        if window_s is not None:
            self.window_s = window_s
        if not self.seen or at_s > self.seen[-1][0]:
            self.seen.append((at_s, ready))
        start_s = self.seen[-1][0] - self.window_s
        while len(self.seen) > 1 and self.seen[1][0] <= start_s:
            self.seen.popleft()

    @property
    def fewest(self) -> int:
        """The fewest ready replicas the window held."""
        return min(ready for _, ready in self.seen)


@dataclass
class _PolicyForecast:
    """Everything the advisor keeps for one policy (rebuilt when the policy's sizing settings change, carrying over
    what the new settings leave true: :meth:`carry_over`)."""

    key: tuple[object, ...]
    rate: AutoForecaster
    capacity: CapacityModel
    audit: ForecastAudit
    min_history_bins: int
    bins: int = 0
    """The bin of the last observation, counted on the clock from the first (missed bins count): the audit
    matches each forecast with the actual of the bin it was made for."""
    last_observed_at_s: float | None = None
    origin_s: float | None = None
    """When bin 0 began: each observation's bin is counted from it, so ticks further apart than a bin (a slow
    source) leave no remainder to add up and the history stays on the clock's bins."""
    ready_seen: _ReadyHistory = field(default_factory=_ReadyHistory)
    last_corrected_at_s: float | None = None
    refit_error: str | None = None
    """Why the forecaster's last refit failed (None: it did not)."""
    _decayed_requests: float = 0.0
    _decayed_prompt: float = 0.0
    _decayed_output: float = 0.0

    def carry_over(self, previous: _PolicyForecast) -> None:
        """Take what ``previous`` (the policy's state before its settings changed) learnt: the load history on its
        clock (the fitted forecaster too where its configuration is the same), the lengths, the fleet sizes the SLI
        window held, the capacity model's corrections and prompt-length tail, and the audit's scores and verdict
        (judged again under the new bounds).  Only what the settings make wrong restarts: corrections made to
        another profile, a forecaster for another horizon (a moving average on the same history at once, refitted
        after the tick)."""
        if previous.rate.config == self.rate.config:
            self.rate = previous.rate
        else:
            self.rate.history.extend(previous.rate.history.values())
            self.rate.quick_fit()
        self.audit = previous.audit.rebound(self.audit.bounds)
        self.capacity.carry_over(previous.capacity)
        self.bins, self.last_observed_at_s = previous.bins, previous.last_observed_at_s  # gaps after it still fill
        if previous.rate.config.bin_s == self.rate.config.bin_s:  # else anchored again at the next observation
            self.origin_s = previous.origin_s
        self.ready_seen, self.last_corrected_at_s = previous.ready_seen, previous.last_corrected_at_s
        self._decayed_requests = previous._decayed_requests
        self._decayed_prompt, self._decayed_output = previous._decayed_prompt, previous._decayed_output

    def skip_missed(self, at_s: float) -> bool:
        """Before an observation at ``at_s``: the bins since the last one that were never observed (the
        source was down, ticks failed or ran long) take the last value, so the history keeps the clock's bins
        and a daily season its phase; a gap too long to fill restarts the forecaster and its audit.  False when
        ``at_s`` falls in a bin already observed (ticks closer than a bin): that observation is not learnt."""
        bin_s = self.rate.config.bin_s
        if self.last_observed_at_s is None or self.origin_s is None:
            self.origin_s = at_s - self.bins * bin_s  # after a warm start, its bins come before this one
            return True
        missed = round((at_s - self.origin_s) / bin_s) - self.bins
        if missed < 0:
            return False
        if missed > 0:
            if self.rate.skip(missed):
                self.audit = ForecastAudit(self.audit.bounds)
            self.bins += missed
        return True

    def observe(self, rate: float, prompt: float, output: float, *, served_rate: float | None = None) -> None:
        """One tick: the forecaster learns ``rate`` (offered), or the rate ``prompt`` implies while none has finished;
        the lengths are ``prompt`` and ``output`` tokens/s over ``served_rate`` requests/s (default ``rate``)."""
        served = rate if served_rate is None else served_rate
        learnt = rate - served + admitted_rate(served, prompt, self.mean_prompt_tokens)
        self.audit.observe(self.bins, learnt)
        self.rate.observe(learnt)
        self.bins += 1
        if served <= 0:
            return  # prompts are counted as they are admitted, requests as they finish: none yet
        # Tokens per request as decayed sums of tokens over decayed sums of requests: each tick
        # weighs by its volume, so the first ticks' handful of requests do not set the lengths
        # for the next twenty ticks.
        keep = 1.0 - LENGTH_SMOOTHING
        self._decayed_requests = keep * self._decayed_requests + served
        self._decayed_prompt = keep * self._decayed_prompt + prompt
        self._decayed_output = keep * self._decayed_output + output

    def correction_weight(self, at_s: float, window_s: float, first_step_s: float) -> float:
        """Weight of the SLI window read at ``at_s`` in the online corrections: the time it adds to the last
        one read (``first_step_s`` for the first), over the window.  Ticks a fraction of the window apart
        re-read mostly the same requests; counting each read in full would correct on one window's p99
        again and again, faster than the fleet it sizes can change what that p99 measures.
        """
        step_s = first_step_s if self.last_corrected_at_s is None else at_s - self.last_corrected_at_s
        self.last_corrected_at_s = at_s if self.last_corrected_at_s is None else max(at_s, self.last_corrected_at_s)
        return -math.expm1(-max(step_s, 0.0) / max(window_s, 1e-9))

    @property
    def mean_prompt_tokens(self) -> float | None:
        return self._decayed_prompt / self._decayed_requests if self._decayed_requests > 0 else None

    @property
    def mean_output_tokens(self) -> float | None:
        return self._decayed_output / self._decayed_requests if self._decayed_requests > 0 else None

    @property
    def warm(self) -> bool:
        return len(self.rate.history) >= self.min_history_bins


@dataclass(frozen=True, kw_only=True, slots=True)
class Assessment:
    """What the predictive advisor sees for one policy this tick."""

    needs: tuple[tuple[int, str], ...]
    """(replicas, reason): the current load, the queue's drain, and the forecast when it is warm."""
    forecast: ForecastView | None
    """None while the forecaster warms up."""
    details: dict[str, Scalar]

    @property
    def forecast_status(self) -> tuple[str, ...]:
        """``(warming_up,)``, ``(forecast_unreliable,)``, or ``()`` when the forecast may be used."""
        if self.forecast is None:
            return (Reason.WARMING_UP,)
        return () if self.forecast.reliable else (Reason.FORECAST_UNRELIABLE,)

    @property
    def observed_needs(self) -> tuple[tuple[int, str], ...]:
        """The needs of what is observed now (no forecast)."""
        return tuple((n, r) for n, r in self.needs if r != Reason.FORECAST)

    @staticmethod
    def most(needs: Sequence[tuple[int, str]]) -> tuple[int, tuple[str, ...]]:
        need = max(n for n, _ in needs)
        return need, tuple(dict.fromkeys(str(r) for n, r in needs if n == need))


def _sizing_key(policy: Policy) -> tuple[object, ...]:
    objectives = policy.objectives
    thresholds = (objectives.ttft.threshold_s, objectives.itl.threshold_s, objectives.ttft.allowance)
    return (policy.forecast, policy.profile, policy.lead_time_s, thresholds, policy.scaling.headroom)


class PredictiveAdvisor:
    """Replicas needed over the next lead time at the forecast's upper quantile."""

    name = "predictive"

    def __init__(self, config: PredictiveConfig | None = None) -> None:
        self.config = config or PredictiveConfig()
        self._state: dict[str, _PolicyForecast] = {}
        self.last_forecast: dict[str, tuple[float, float, float]] = {}
        """Per policy: (point, lower, upper) request-rate forecast one lead time ahead (for plots)."""
        self._refits = RefitBudget(self.config.refits_per_tick, self.config.cheap_refit_bins_per_tick)
        self._refits_pending_s: float | None = None
        """The time of the last tick assessed, while its refits have not run."""

    def refit(self) -> None:
        """Refit the forecasters that came due at the last tick, as its budget allows (the others keep their models,
        updated bin by bin, until a later tick's budget).  Run after the tick's decisions, so that none of them
        waits on a model fit; where the caller does not, the next tick runs it before anything else reads the
        advisor's state (:meth:`catch_up`), on the same history, so the decisions are the same either way.  A failed
        refit leaves that policy's model as it was, and says so in its decisions' details until one succeeds."""
        now_s, self._refits_pending_s = self._refits_pending_s, None
        if now_s is not None:
            fits = {name: state.rate.fits for name, state in self._state.items()}
            failed = self._refits.refit_all({name: state.rate for name, state in self._state.items()}, now_s)
            for name, state in self._state.items():
                if name in failed or state.rate.fits > fits[name]:
                    state.refit_error = failed.get(name)

    def catch_up(self, now_s: float) -> None:
        """The last tick's refits, where its caller did not run them, once a tick at ``now_s`` begins."""
        if self._refits_pending_s is not None and now_s != self._refits_pending_s:
            self.refit()

    @property
    def refits_deferred(self) -> int:
        """Refits that waited for a later tick's budget (since start)."""
        return self._refits.deferred

    def capacity(self, policy: Policy) -> CapacityModel:
        """The policy's capacity model (with its online corrections)."""
        return self._policy_state(policy).capacity

    def warm_start(self, policy: Policy, history: LoadHistory) -> bool:
        """Seed a policy's history (one value per tick, oldest first), e.g. after a restart; False when ignored.

        Not once the policy was observed live (a warm start that ran late): its bins would land after the live
        ones, on the live bins' clock, and the live observations of as many bins would be dropped."""
        self.refit()  # what the last tick left due, before the seeded history changes it (as after that tick)
        state = self._policy_state(policy)
        if state.last_observed_at_s is not None:
            log.info("warm start of %s ignored: already observed live", policy.name)
            return False
        for r, p, o in zip(history.rates_rps, history.prompt_tokens_per_s, history.output_tokens_per_s, strict=True):
            state.observe(float(r), float(p), float(o))
        state.rate.quick_fit()  # forecasts at once; the full refit waits for a tick's refit budget
        return True

    def history_bins(self, policy_name: str) -> int:
        state = self._state.get(policy_name)
        return 0 if state is None else len(state.rate.history)

    def _policy_state(self, policy: Policy) -> _PolicyForecast:
        key = _sizing_key(policy)
        state = self._state.get(policy.name)
        if state is not None and state.key == key:
            return state
        base = self.config.forecast
        settings = policy.forecast
        min_bins = max(4, math.ceil(settings.min_history_s / base.bin_s))
        forecast_config = replace(
            base,
            horizon_s=max(base.horizon_s, float(policy.lead_time_s), base.bin_s),
            min_history_bins=min(min_bins, base.min_history_bins),
        )
        objectives = policy.objectives
        targets = Targets(
            ttft_s=objectives.ttft.threshold_s,
            itl_s=objectives.itl.threshold_s,
            headroom=policy.scaling.headroom,
            ttft_allowance=objectives.ttft.allowance,
        )
        fresh = _PolicyForecast(
            key=key,
            rate=AutoForecaster(forecast_config, refit_phase=zlib.crc32(policy.name.encode()), auto_refit=False),
            capacity=CapacityModel(policy.profile or self.config.profile, targets),
            audit=ForecastAudit(
                AuditBounds(
                    max_wape=settings.max_wape, min_coverage=settings.min_coverage, window=settings.audit_forecasts,
                    min_scored=min(MIN_SCORED, settings.audit_forecasts), count_window_s=self.config.rate_window_s,
                )
            ),
            min_history_bins=min_bins,
        )
        if state is not None:
            fresh.carry_over(state)  # a settings change keeps what the new settings leave true
        self._state[policy.name] = fresh
        return fresh

    def forget(self, policy_name: str) -> None:
        self._state.pop(policy_name, None)
        self.last_forecast.pop(policy_name, None)

    def assess(self, policy: Policy, observation: PolicyObservation, now_s: float) -> Assessment | None:
        """Every need this advisor sees for the policy (None without request and token rates)."""
        obs = observation
        served, offered = served_load(obs), offered_load(obs)  # offered: and what the entry router refused
        if served is None or offered is None:
            return None
        self.catch_up(now_s)
        self._refits_pending_s = now_s
        state = self._policy_state(policy)
        admitted = admitted_load(served, state.mean_prompt_tokens)  # a rate also while none has finished
        if state.last_observed_at_s is None or obs.observed_at_s > state.last_observed_at_s:
            if state.skip_missed(obs.observed_at_s):
                # The forecaster learns the offered rate; lengths come from the requests the tokens are of.
                state.observe(offered.request_rate_rps, served.prompt_tokens_per_s, served.output_tokens_per_s,
                              served_rate=served.request_rate_rps)  # fmt: skip
            state.last_observed_at_s = obs.observed_at_s
        ready = obs.ready_replicas if obs.ready_replicas is not None else obs.current_replicas or 0
        sli = obs.sli
        state.ready_seen.record(obs.observed_at_s, ready, None if sli is None else sli.window_s)
        capacity = state.capacity
        if self.config.correct_online and sli is not None and self._enough_requests(sli.requests_in_window):
            # The p99s are of the served requests: the model is corrected against the load that made them,
            # on the fleet that made them.
            weight = state.correction_weight(obs.observed_at_s, sli.window_s, self.config.forecast.bin_s)
            capacity.correct(load=served, ready_replicas=state.ready_seen.fewest,
                             ttft_p99_s=sli.ttft_p99_s, itl_p99_s=sli.itl_p99_s, weight=weight)  # fmt: skip
            if obs.prefill_tokens_per_s is not None and ready > 0:
                capacity.correct_prefill_speed(prompt_tokens_per_prefill_s=obs.prefill_tokens_per_s,
                                               running_per_replica=(obs.running_requests or 0.0) / ready,
                                               weight=weight)  # fmt: skip
        details: dict[str, Scalar] = {
            "ttft_correction": round(capacity.ttft_correction, 4),
            "itl_correction": round(capacity.itl_correction, 4),
            "prefill_speed_correction": round(capacity.prefill_speed_correction, 4),
        }
        if state.refit_error is not None:
            details["forecast_refit_error"] = state.refit_error
        targets = capacity.targets
        if capacity.itl_limit_s() > targets.itl_s * targets.headroom:  # the floor, not the objective, sizes ITL
            details["itl_floor_s"] = round(capacity.itl_floor_s, 6)
        needs = self._load_needs(policy, capacity, obs, admitted, ready)
        if offered.request_rate_rps > served.request_rate_rps:
            # Refusals at the entry router are demand now: their need carries its own reason, a pressure
            # reason, so a scale-up for it that buys nothing is held like one for a queue.
            needs.append((capacity.replicas_needed(offered), Reason.ROUTER_REFUSED))
        view = self._forecast_need(policy, state, needs, details)
        if view is not None and not view.reliable:
            details["forecast_audit"] = state.audit.why_unreliable()
        return Assessment(needs=tuple(needs), forecast=view, details=details)

    def _enough_requests(self, requests_in_window: float | None) -> bool:
        return requests_in_window is None or requests_in_window >= self.config.min_requests_for_correction

    def advise(self, policy: Policy, observation: PolicyObservation, now_s: float) -> Advice:
        """The most any need asks for; ``warming_up`` / ``forecast_unreliable`` say what the forecast is worth."""
        assessment = self.assess(policy, observation, now_s)
        if assessment is None:
            return Advice(replicas_needed=None, reasons=(Reason.INSUFFICIENT_DATA,))
        need, reasons = assessment.most(assessment.needs)
        view = assessment.forecast
        return Advice(
            replicas_needed=need,
            reasons=(*reasons, *assessment.forecast_status),
            forecast_request_rate_rps=None if view is None else view.request_rate_rps,
            forecast_request_rate_upper_rps=None if view is None else view.sized_request_rate_rps,
            forecast_horizon_s=None if view is None else view.horizon_s,
            forecast=view,
            details=assessment.details,
        )

    @staticmethod
    def _load_needs(
        policy: Policy, capacity: CapacityModel, obs: PolicyObservation, now_load: Load, ready: int
    ) -> list[tuple[int, str]]:
        """Replicas the current load needs, the SLI window's busiest half-minute needs, and those that drain the
        queue within the lead time."""
        needs: list[tuple[int, str]] = [(capacity.replicas_needed(now_load), Reason.CURRENT_LOAD)]
        burst = burst_load(obs, now_load)
        if burst is not None:
            # The headroom is for what the model does not see; a burst it sees must only fit the targets.
            needs.append((capacity.replicas_needed(burst, headroom=1.0), Reason.ARRIVAL_BURST))
        engines, at_entry = obs.queue_depth or 0.0, router_waiting(obs)
        if engines + at_entry > 0:
            # Requests held at the entry router wait for this fleet as much as the engines' own queue.
            floor = capacity.queue_floor(
                queue_depth=engines + at_entry, ready_replicas=ready, load=now_load, drain_s=float(policy.lead_time_s)
            )
            if floor > 0:
                needs.extend((floor, r) for r, n in ((Reason.QUEUE_DEPTH, engines), (Reason.ROUTER_QUEUE, at_entry))
                             if n > 0)  # fmt: skip
        return needs

    def _forecast_need(
        self, policy: Policy, state: _PolicyForecast, needs: list[tuple[int, str]], details: dict[str, Scalar]
    ) -> ForecastView | None:
        """Add what the forecast of the next lead time needs to ``needs``, and describe the forecast.

        None while the forecaster warms up (no forecast, or less history than the policy asks for).
        """
        quantile = policy.forecast.quantile
        rate_fc = state.rate.forecast(quantile=quantile)
        prompt_per_request = state.mean_prompt_tokens
        output_per_request = state.mean_output_tokens
        if rate_fc is None or prompt_per_request is None or output_per_request is None or not state.warm:
            details["model"] = "warming_up"
            return None
        # Every bin has the same lengths, so the need grows with the rate: the busiest bin of
        # the next lead time decides (one capacity inversion instead of one per bin).
        upper_rate = max(float(np.max(rate_fc.upper)), 0.0)
        forecast_need = state.capacity.replicas_needed(
            Load(
                request_rate_rps=upper_rate,
                prompt_tokens_per_s=upper_rate * prompt_per_request,
                output_tokens_per_s=upper_rate * output_per_request,
            )
        )
        needs.append((forecast_need, Reason.FORECAST))
        point = max(float(rate_fc.point[-1]), 0.0)
        lower = float(rate_fc.lower[-1])
        # The audit judges one interval whatever the fleet is sized for: a coverage bound on the sizing
        # interval would flag a quantile-0.75 forecast (nominally 50 % covered) half the time, and a
        # quantile-0.5 one (no interval) always.
        audited = rate_fc if quantile == AUDIT_QUANTILE else state.rate.at_quantile(rate_fc, AUDIT_QUANTILE)
        state.audit.expect(state.bins - 1 + len(rate_fc.point), point=point, lower=float(audited.lower[-1]),
                           upper=float(audited.upper[-1]))
        self.last_forecast[policy.name] = (point, lower, float(rate_fc.upper[-1]))
        details["model"] = rate_fc.model
        details["forecast_lower_rps"] = lower
        audit = state.audit
        return ForecastView(
            model=rate_fc.model,
            horizon_s=len(rate_fc.point) * rate_fc.bin_s,
            quantile=quantile,
            request_rate_rps=point,
            request_rate_lower_rps=lower,
            request_rate_upper_rps=float(rate_fc.upper[-1]),
            sized_request_rate_rps=upper_rate,
            prompt_tokens_per_s=point * prompt_per_request,
            output_tokens_per_s=point * output_per_request,
            sized_prompt_tokens_per_s=upper_rate * prompt_per_request,
            sized_output_tokens_per_s=upper_rate * output_per_request,
            wape=audit.wape,
            coverage=audit.coverage,
            reliable=audit.reliable,
            history_s=len(state.rate.history) * rate_fc.bin_s,
        )
