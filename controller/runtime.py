"""What the tick loop keeps in memory about each policy between ticks (the read API shows it)."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from contracts.errors import MoesloError
from controller.slo import error_budget_remaining
from controller.sources import BURN_WINDOWS
from controller.sources.base import burn_rates_of
from controller.types import Decision, PolicyObservation, SliSnapshot

if TYPE_CHECKING:
    from controller.policy import Policy
    from controller.telemetry import ControllerMetrics

SLO_NAMES = ("ttft", "itl")

FORECAST_NOT_IN_USE = ("warming_up", "forecast_unreliable", "forecast_disabled")
"""Reasons that say the forecast did not size the fleet this tick."""


@dataclass
class PolicyRuntime:
    """What the tick loop last learnt about one policy (kept in memory, rebuilt on restart)."""

    current_replicas: int | None = None
    desired_replicas: int | None = None
    stale: bool = True
    observed_at: datetime | None = None
    sli: dict[str, float | None] = field(default_factory=dict)
    error_budget_remaining: dict[str, float | None] = field(default_factory=dict)
    burn_rates: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seen: dict[str, Any] = field(default_factory=dict)
    """What the core saw: load, queue, running batch, KV usage, ready replicas, replica budget."""
    forecast: dict[str, Any] | None = None
    """The forecast (``ForecastView`` as JSON) and whether it sized the fleet (``in_use``)."""
    decision: dict[str, Any] | None = None
    """The last decision: action, reasons, detail."""


@dataclass
class Creations:
    """When each listed policy was created: one missing from a later listing, or listed with another creation time
    (deleted and created again between two ticks, for another model say), is gone, and what was learnt of it too."""

    created_at: dict[str, datetime] = field(default_factory=dict)

    def gone(self, listed: Mapping[str, datetime], unreadable: Collection[str], known: Iterable[str] = ()) -> list[str]:
        """The policies gone since the last listing (``known``: names the caller still keeps); remembers ``listed``.
        A policy this version cannot read (a newer controller wrote it) is not gone: what it runs stays."""
        seen = self.created_at.keys() | set(known)
        gone = {name for name in seen - listed.keys() if name not in unreadable}
        gone |= {name for name, at in listed.items() if self.created_at.get(name, at) != at}
        self.created_at = {name: at for name, at in self.created_at.items() if name in unreadable} | dict(listed)
        return sorted(gone)


def json_safe(values: Mapping[str, Any]) -> dict[str, Any]:
    """Non-finite floats become None: JSON has no NaN or infinity, and the API must not fail on them."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()}


def sli_view(obs: PolicyObservation | None) -> dict[str, float | None]:
    """The SLIs a tick saw, as ``/v1/status`` shows them (all None without an observation or its SLIs)."""
    sli = obs.sli if obs is not None else None
    return json_safe({
        "ttft_good_ratio": sli.ttft_good_ratio if sli else None,
        "itl_good_ratio": sli.itl_good_ratio if sli else None,
        "ttft_p99_seconds": sli.ttft_p99_s if sli else None,
        "itl_p99_seconds": sli.itl_p99_s if sli else None,
        "imbalance_cv_max": sli.imbalance_cv_max if sli else None,
        "queue_depth": obs.queue_depth if obs else None,
        "router_queued": obs.router_queued if obs else None,
        "requests_in_window": sli.requests_in_window if sli else None,
    })


def seen_view(obs: PolicyObservation | None) -> dict[str, Any]:
    """The load and fleet a tick saw, as ``/v1/status`` shows them under ``seen`` (empty without an observation)."""
    return {} if obs is None else json_safe({
        "request_rate_rps": obs.request_rate_rps,
        "request_rate_peak_rps": obs.request_rate_peak_rps,
        "prompt_tokens_per_s": obs.prompt_tokens_per_s,
        "output_tokens_per_s": obs.output_tokens_per_s,
        "queue_depth": obs.queue_depth,
        "router_queued": obs.router_queued,
        "router_refused_rps": obs.router_refused_rps,
        "running_requests": obs.running_requests,
        "kv_cache_usage": obs.kv_cache_usage,
        "ready_replicas": obs.ready_replicas,
        "replica_budget": obs.replica_budget,
        "prefix_cache_hit_rate": obs.prefix_cache_hit_rate,
    })


def report_forecast(
    runtime: PolicyRuntime, metrics: ControllerMetrics, policy: str, obs: PolicyObservation | None, decision: Decision,
    *, tick_interval_s: float,
) -> None:
    """What the core saw and forecast, for /v1/status and the forecast gauges."""
    view = decision.forecast
    in_use = view is not None and not any(r in FORECAST_NOT_IN_USE for r in decision.reasons)
    metrics.set_forecast(policy, view, in_use=in_use)
    metrics.set_replica_budget(policy, None if obs is None else obs.replica_budget)
    runtime.forecast = None if view is None else json_safe({**view.to_json(), "in_use": in_use})
    runtime.seen = seen_view(obs)
    share = _sizing_number(decision, "ttft_infeasible_share")
    runtime.seen["ttft_infeasible_share"] = share
    rate = 0.0 if obs is None or obs.request_rate_rps is None else obs.request_rate_rps
    metrics.record_infeasible(policy, share, rate * tick_interval_s)
    metrics.record_length_tail(
        policy, _sizing_number(decision, "prompt_cv2"), _sizing_number(decision, "prompt_p99_over_mean")
    )
    metrics.record_corrections(policy, _sizing_number(decision, "predictive.ttft_correction"),
                               _sizing_number(decision, "predictive.itl_correction"))  # fmt: skip


def report_budgets(runtime: PolicyRuntime, metrics: ControllerMetrics, policy: Policy, sli: SliSnapshot | None) -> None:
    """Each SLO's error budget left over the policy's window and its burn rates, for /v1/status and the gauges."""
    for slo in SLO_NAMES:
        objective = getattr(policy.objectives, slo)
        ratios: Mapping[str, float] = getattr(sli, f"{slo}_good_ratio_by_window") if sli else {}
        window_ratio = ratios.get(policy.window)
        remaining = None if window_ratio is None else error_budget_remaining(window_ratio, objective.target)
        runtime.error_budget_remaining[slo] = remaining
        metrics.set_error_budget(policy.name, slo, remaining)
        burns = burn_rates_of({w: r for w, r in ratios.items() if w in BURN_WINDOWS}, objective.target)
        runtime.burn_rates[slo] = burns
        for window in BURN_WINDOWS:
            metrics.set_burn_rate(policy.name, slo, window, burns.get(window))


def _sizing_number(decision: Decision, key: str) -> float | None:
    """A number the sizing advisor put in the decision's inputs (None: it did not)."""
    value = decision.inputs.get(f"sizing.{key}")
    return float(value) if isinstance(value, int | float) else None


def fault_text(exc: Exception) -> str:
    """An error as a policy's status and log show it: the project's own say what they are; others are named."""
    return str(exc) if isinstance(exc, MoesloError) else f"{type(exc).__name__}: {exc}"


__all__ = [
    "Creations", "PolicyRuntime", "fault_text", "json_safe", "report_budgets", "report_forecast", "seen_view",
    "sli_view",
]
