"""The data at the decision core's boundary: observations in, decisions out.

Everything here is a frozen, keyword-only dataclass with its unit in each
field name.  Time is always passed in (``now_s``, ``observed_at_s``: seconds
on whatever clock the caller runs -- the monotonic clock in production, the
simulated clock in the trace replay), so the same core runs in both.

Missing data is ``None``, never ``0``: a metrics source that cannot read a
value must say so, because the core treats zeros as real (idle) load and
``None`` as "do not act on this".

Mappings inside these dataclasses are read-only by convention; nothing in the
core mutates them.

Flow::

    TickInput(now_s, policies, observations)
        -> DecisionCore.tick()            (controller.core)
            -> ScalingAdvisor.advise(...)  -> Advice   (controller.advisors, controller.forecast ...)
        -> Effects(decisions, next_tick_s, diagnostics)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal, Protocol, runtime_checkable

from controller.policy import Policy

__all__ = [
    "ACTIONS",
    "Action",
    "Advice",
    "Decision",
    "Effects",
    "ForecastView",
    "LoadHistory",
    "PolicyObservation",
    "Reason",
    "Scalar",
    "ScalingAdvisor",
    "SliSnapshot",
    "TickInput",
]

Scalar = float | int | str | None
"""A value in a decision's ``inputs`` or an advice's ``details``: plain JSON."""

Action = Literal["hold", "scale_up", "scale_down"]
ACTIONS: tuple[Action, ...] = ("hold", "scale_up", "scale_down")


class Reason(StrEnum):
    """Machine-readable reason codes carried by decisions (and asserted by tests).

    A ``StrEnum``: each member *is* its string, so ``"cooldown" in decision.reasons``
    works, and the codes are the ``reason`` label values of
    ``moeslo_decisions_total``.
    """

    # The action itself (always the first reason of a decision).
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    HOLD = "hold"
    # Why the advisors want what they want.
    STEADY = "steady"
    """The advisors' need equals the current replica count."""
    QUEUE_DEPTH = "queue_depth"
    ROUTER_QUEUE = "router_queue"
    """Requests wait at the entry router (``moeslo_router_queued_requests``): demand the engines do not see yet,
    and the one signal that wakes a fleet at zero replicas."""
    ROUTER_REFUSED = "router_refused"
    """The entry router refuses requests (429): the load offered, refusals included, needs this many replicas."""
    ROUTER_IDLE = "router_idle"
    """The entry router holds nothing and the engines are idle: with ``min_replicas: 0`` the fleet may go to zero."""
    SLO_BURN = "slo_burn"
    LATENCY_P99 = "latency_p99"
    LOW_UTILIZATION = "low_utilization"
    HIGH_UTILIZATION = "high_utilization"
    WITHIN_SLO = "within_slo"
    SCALE_UP_PENDING = "scale_up_pending"
    """Replicas asked for earlier are not ready yet; their capacity is counted as coming."""
    FORECAST = "forecast"
    CURRENT_LOAD = "current_load"
    """The load observed now, through the capacity model, needs this many replicas."""
    ARRIVAL_BURST = "arrival_burst"
    """The SLI window's busiest half-minute, beyond Poisson noise, needs this many replicas: on/off traffic
    that one-minute rates average away (``controller.bursts``)."""
    WARMING_UP = "warming_up"
    """The forecaster has too little history yet: the predictive advisor holds the current count."""
    FORECAST_UNRELIABLE = "forecast_unreliable"
    """The forecast's rolling error or interval coverage drifted past the policy's bounds:
    sizing is reactive until it recovers."""
    FORECAST_DISABLED = "forecast_disabled"
    """The policy turned forecasting off: sizing is reactive."""
    SCALE_INEFFECTIVE = "scale_ineffective"
    """A scale-up for this cause bought nothing measurable: more for the same cause is held, and while that
    pressure looks like a tail no fleet size moves (no backlog), the fleet is sized without it."""
    ADVISOR_ERROR = "advisor_error"
    """An advisor raised; its error is in the decision's inputs and the others decided."""
    SLI_MISSING = "sli_missing"
    """No trusted SLI: the reactive advisor may scale up on the queue but never down."""
    # Guardrails.
    INSUFFICIENT_DATA = "insufficient_data"
    STALE_DATA = "stale_data"
    CLOCK_SKEW = "clock_skew"
    """The observation is dated in the future (the source's clock is ahead): it is not used."""
    PARTIAL_DATA = "partial_data"
    """The source reported errors: scale-ups are allowed, scale-downs are not."""
    COOLDOWN = "cooldown"
    STABILIZATION = "stabilization"
    """A scale-down goes no lower than the highest need within the cooldown window."""
    AT_MAX = "at_max"
    AT_MIN = "at_min"
    BELOW_MIN = "below_min"
    ABOVE_MAX = "above_max"
    MAX_STEP = "max_step"
    SCALE_DOWN_RATE = "scale_down_rate"
    """A scale-down goes no lower than ``current / max_scale_down_rate`` in one decision."""
    MODE_ADVISORY = "mode_advisory"
    MODE_OFF = "mode_off"
    READ_ONLY_TARGET = "read_only_target"
    """The policy targets engines found by model name: nothing to actuate."""
    HOST_BUDGET = "host_budget"
    """The actuator has no room for more replicas (e.g. the local host's CPUs are all pinned)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SliSnapshot:
    """Service-level indicators of one policy, as evaluated by a source.

    ``*_good_ratio`` is the fraction of requests at or under the objective's
    threshold over the *short* evaluation window (``window_s``); the
    ``*_by_window`` mappings hold the same ratio over other windows, keyed by
    Prometheus duration (``"5m"``, ``"1h"``, ``"6h"``, ``"30d"``, ...).
    """

    observed_at_s: float
    window_s: float = 300.0
    requests_in_window: float | None = None
    """Requests finished in the window: good ratios over a handful of requests are noise."""
    itl_events_in_window: float | None = None
    """Token gaps the ITL histogram counted in the window (None: unknown; the ITL good ratio is then
    taken as one figure per request, as the replay's is)."""
    ttft_events_in_window: float | None = None
    """Requests the TTFT good ratio is over (None: ``requests_in_window``); fewer where the advisors judge TTFT
    over the requests some fleet can serve (:func:`controller.feasibility.feasible_view`)."""
    ttft_good_ratio: float | None = None
    itl_good_ratio: float | None = None
    ttft_p99_s: float | None = None
    itl_p99_s: float | None = None
    ttft_good_ratio_by_window: Mapping[str, float] = field(default_factory=dict)
    itl_good_ratio_by_window: Mapping[str, float] = field(default_factory=dict)
    imbalance_cv_per_layer: tuple[float, ...] = ()
    """CV (stddev / mean) of per-rank expert load, one value per MoE layer."""
    prompt_tokens_buckets: tuple[tuple[float, float], ...] = ()
    """Finished requests by prompt length over the window: (upper edge in tokens, cumulative count), in edge
    order (``vllm:request_prompt_tokens``); the advisors count from it the requests no fleet can serve."""

    @property
    def imbalance_cv_max(self) -> float | None:
        return max(self.imbalance_cv_per_layer) if self.imbalance_cv_per_layer else None


@dataclass(frozen=True, kw_only=True, slots=True)
class PolicyObservation:
    """What a source saw for one policy's replicas at ``observed_at_s`` (all replicas summed)."""

    policy: str
    observed_at_s: float
    current_replicas: int | None = None
    """Replicas asked for (the workload's spec), or processes started, by whoever scaled last."""
    ready_replicas: int | None = None
    """Replicas serving traffic now (ready pods, healthy processes)."""
    queue_depth: float | None = None
    """Requests waiting, summed over replicas (``vllm:num_requests_waiting``)."""
    router_queued: float | None = None
    """Requests held at the entry router's admission (``moeslo_router_queued_requests``), summed over the
    policy's routers: demand that has reached no engine yet.  None: the policy names no router, or it could
    not be read (the source then says why in ``errors``)."""
    router_refused_rps: float | None = None
    """Requests per second the entry router refused at admission (429, its reject mode; ``outcome="rejected"``
    of ``moeslo_router_requests_total``), summed over the policy's routers: demand that reached no engine, so
    the engines' rates leave it out.  None: no router named, or not read."""
    running_requests: float | None = None
    """Requests in the running batch, summed over replicas (``vllm:num_requests_running``)."""
    request_rate_rps: float | None = None
    request_rate_peak_rps: float | None = None
    """The highest request rate over any half-minute (``controller.bursts.PEAK_STEP_S``) of the SLI window:
    the bursts that the one-minute ``request_rate_rps`` averages away.  None: the source cannot see them."""
    prompt_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None
    kv_cache_usage: float | None = None
    """Mean KV-cache usage over ready replicas, a fraction in [0, 1]."""
    replica_budget: int | None = None
    """Most replicas the actuator can run for this policy now (None: no limit it knows of)."""
    prefix_cache_hit_rate: float | None = None
    """Share of prompt tokens found in the engines' prefix caches over the SLI window (``vllm:prefix_cache_hits``
    over ``vllm:prefix_cache_queries``); None: the engines do not report one."""
    prefill_tokens_per_s: float | None = None
    """Prompt tokens (cached ones included) per second of prefill of the requests finished in the SLI window
    (``vllm:request_prompt_tokens_sum`` over ``vllm:request_prefill_time_seconds_sum``): the speed prompts
    were prefilled at once scheduled.  None: no request finished, or the engines do not report it."""
    sli: SliSnapshot | None = None
    errors: tuple[str, ...] = ()
    """Problems the source met (a failed query, an unreachable replica); empty when all went well."""


@dataclass(frozen=True, slots=True)
class LoadHistory:
    """A policy's past load, one value per tick, oldest first (what forecasters warm-start from)."""

    rates_rps: Sequence[float]
    prompt_tokens_per_s: Sequence[float]
    output_tokens_per_s: Sequence[float]

    def __len__(self) -> int:
        return len(self.rates_rps)


@dataclass(frozen=True, kw_only=True, slots=True)
class TickInput:
    """Everything the core may look at in one tick."""

    now_s: float
    policies: Mapping[str, Policy]
    """Policies by name."""
    observations: Mapping[str, PolicyObservation]
    """Observations by policy name; a policy without one holds with ``insufficient_data``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ForecastView:
    """What the forecast of a policy's load says now, and how far it has been right.

    ``request_rate_*`` are for the bin one lead time ahead (``horizon_s``): the point and its
    interval at ``quantile``.  ``sized_*`` are the most any bin of the next lead time may see at
    the upper quantile: what the fleet is sized for.
    """

    model: str
    horizon_s: float
    quantile: float
    request_rate_rps: float
    request_rate_lower_rps: float
    request_rate_upper_rps: float
    sized_request_rate_rps: float
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    sized_prompt_tokens_per_s: float
    sized_output_tokens_per_s: float
    wape: float | None
    """Rolling WAPE of the forecasts scored so far (None: too few yet)."""
    coverage: float | None
    """Share of actuals that fell inside the forecast interval (None: too few yet)."""
    reliable: bool
    history_s: float
    """How much history the forecaster holds."""

    def to_json(self) -> dict[str, float | str | bool | None]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, kw_only=True, slots=True)
class Advice:
    """One advisor's opinion of how many replicas a policy needs now.

    ``replicas_needed`` is ``None`` when the advisor has nothing to say (not
    enough data or history); the core then relies on the other advisors, and
    holds with ``insufficient_data`` when none has an opinion.  Bounds, cooldown
    and step limits are the core's business, not the advisor's.
    """

    replicas_needed: int | None
    reasons: tuple[str, ...] = ()
    forecast_request_rate_rps: float | None = None
    forecast_request_rate_upper_rps: float | None = None
    forecast_horizon_s: float | None = None
    forecast: ForecastView | None = None
    """The forecast behind this advice (an advisor that forecasts fills it, even when unused)."""
    details: Mapping[str, Scalar] = field(default_factory=dict)
    """Anything else worth logging with the decision (flat, JSON-safe)."""
    undo_to: int | None = None
    """Replicas down to which a scale-up this advisor judged ineffective may be given back at once: the
    scale-down cooldown and stabilization window guard against a load's noise, not against a verdict that
    the replicas bought nothing."""


@runtime_checkable
class ScalingAdvisor(Protocol):
    """Something that says how many replicas a policy needs; the core takes the max over advisors."""

    @property
    def name(self) -> str:
        """Short identifier used as the prefix of this advisor's entries in ``Decision.inputs``."""
        ...

    def advise(self, policy: Policy, observation: PolicyObservation, now_s: float) -> Advice: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """What the core decided for one policy, and why.

    ``apply`` is False when the decision is only logged (advisory mode, a
    read-only target, or a hold).  ``reasons[0]`` is always the action.
    """

    policy: str
    action: Action
    current_replicas: int | None
    desired_replicas: int | None
    reasons: tuple[str, ...]
    detail: str
    inputs: Mapping[str, Scalar]
    decided_at_s: float
    apply: bool = False
    forecast: ForecastView | None = None
    """The forecast an advisor made this tick (for metrics, status and plots; None: none made)."""

    @property
    def delta_replicas(self) -> int:
        if self.current_replicas is None or self.desired_replicas is None:
            return 0
        return self.desired_replicas - self.current_replicas


@dataclass(frozen=True, kw_only=True, slots=True)
class Effects:
    """The outcome of one tick: decisions per policy, when to tick next, and counters."""

    decisions: tuple[Decision, ...]
    next_tick_s: float
    diagnostics: Mapping[str, Scalar]

    def for_policy(self, name: str) -> Decision:
        for decision in self.decisions:
            if decision.policy == name:
                return decision
        raise KeyError(name)

    @property
    def to_apply(self) -> tuple[Decision, ...]:
        """Decisions an actuator should carry out."""
        return tuple(d for d in self.decisions if d.apply)
