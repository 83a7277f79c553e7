"""A synthetic fleet for the status page: policies, a decision log and the runtime view.

Each policy gets a daily load curve with noise, a forecast one lead time ahead with its
interval, replicas that follow the load (scale decisions when they change), SLIs that dip for
the policies meant to burn, the worst layer's imbalance, and a rebalance with its verification
every few hours.  Decisions carry the ``inputs`` keys the service's core records, so the page
reads them exactly as it reads a real log.  Rows are written with one ``executemany`` per
batch (SQLite only), so a day of 100 policies (576,000 decisions) takes seconds, not minutes.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from controller.policy import Policy
from controller.runtime import PolicyRuntime
from controller.sources import BURN_WINDOWS
from controller.store import Store

__all__ = ["FleetView", "SyntheticFleet", "build_fleet"]

KINDS = ("steady", "steady", "steady", "steady", "steady", "steady", "paging", "ticket", "stale", "spent")
LAYERS = 24
_INSERT = (
    "INSERT INTO decisions (policy, policy_version, at, tick_s, action, reason, current_replicas, desired_replicas,"
    " mode, outcome, detail, inputs) VALUES (?, 1, ?, ?, ?, ?, ?, ?, 'enforce', ?, ?, ?)"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticFleet:
    policies: int = 100
    hours: float = 24.0
    tick_s: float = 15.0
    seed: int = 0


class FleetView:
    """The part of the controller service the read API needs, answering from memory."""

    def __init__(self, runtimes: dict[str, PolicyRuntime], last_tick_at: datetime, decisions: int = 0) -> None:
        self.runtimes = runtimes
        self._last_tick_at = last_tick_at
        self.decisions = decisions
        """Decisions written into the log."""

    @property
    def is_leader(self) -> bool:
        return True

    @property
    def last_tick_at(self) -> datetime | None:
        return self._last_tick_at

    def runtime(self, name: str) -> PolicyRuntime | None:
        return self.runtimes.get(name)

    def check_target(self, policy: Policy) -> list[str]:
        return []


def _kind(i: int) -> str:
    return KINDS[i % len(KINDS)]


def _policy(i: int) -> Policy:
    return Policy.model_validate({
        "name": f"policy-{i:03d}",
        "description": f"Synthetic policy {i} <{_kind(i)}> & friends",
        "target": {"kind": "deployment", "namespace": "bench", "name": f"model-{i:03d}"},
        "scaling": {"min_replicas": 1, "max_replicas": 16},
    })


def _trend(i: int, t_s: float) -> float:
    return (4.0 + (i % 7)) * (1.0 + 0.6 * math.sin(2 * math.pi * (t_s % 86400) / 86400 + i))


def _load(i: int, t_s: float, rng: random.Random) -> float:
    return max(0.0, _trend(i, t_s) * (1.0 + rng.gauss(0.0, 0.05)))


def _ratio(kind: str, t_s: float, end_s: float, rng: random.Random) -> float:
    recent = end_s - t_s < 3600
    if kind == "paging" and recent:
        return 0.80 + rng.random() * 0.05
    if kind == "ticket" and end_s - t_s < 6 * 3600:
        return 0.975 + rng.random() * 0.005
    return min(1.0, 0.9985 + rng.gauss(0.0, 0.0006))


def _inputs(load: float, forecast: float, ratio: float, replicas: int, desired: int, cv: float) -> dict[str, Any]:
    return {
        "now_s": 0.0, "mode": "enforce", "min_replicas": 1, "max_replicas": 16, "max_step": 4,
        "scale_down_cooldown_s": 180, "observed_at_s": 0.0, "data_age_s": 0.0, "current_replicas": replicas,
        "ready_replicas": replicas, "queue_depth": 0.0, "running_requests": 8.0, "request_rate_rps": load,
        "prompt_tokens_per_s": load * 900, "output_tokens_per_s": load * 250, "kv_cache_usage": 0.4,
        "source_errors": 0, "sli_age_s": 0.0, "sli_requests_in_window": load * 300, "ttft_good_ratio": ratio,
        "itl_good_ratio": min(1.0, ratio + 0.0005), "ttft_p99_s": 0.3, "itl_p99_s": 0.018, "imbalance_cv_max": cv,
        "sizing.replicas_needed": desired, "sizing.reasons": "current_load,forecast",
        "sizing.forecast_request_rate_rps": forecast, "sizing.forecast_request_rate_upper_rps": forecast * 1.12,
        "sizing.forecast_horizon_s": 120, "sizing.reactive.ready_replicas": replicas,
        "sizing.reactive.worst_burn_rate": 0.5, "sizing.reactive.worst_latency_ratio": 0.9,
        "sizing.predictive.ttft_correction": 1.8, "sizing.predictive.itl_correction": 1.9,
        "sizing.predictive.model": "moving_average_8", "sizing.predictive.forecast_lower_rps": forecast * 0.9,
        "replicas_needed": desired, "since_last_change_s": 165.0,
    }


def _rebalance_rows(name: str, at: datetime, t_s: float, cv: float, rng: random.Random) -> list[tuple[Any, ...]]:
    after = cv * 0.4
    measured = after * (1.0 + rng.gauss(0.1, 0.1))
    plan = {"imbalance_before_cv": cv, "imbalance_after_cv": after, "moves": 12}
    verify = {"ok": True, "reason": "verified", "measured_cv": measured, "predicted_cv": after,
              "measured_minus_predicted": measured - after, "noise_cv": 0.03, "denoised_cv": max(0.0, measured - 0.01)}
    rebalance = {"policy": name, "endpoint": "http://engine:8000", "kind": "rebalance", "outcome": "applied",
                 "decision": None, "plan": plan, "swap": None, "verify": None, "error": None}
    check = {**rebalance, "kind": "verify", "outcome": "verified", "verify": verify}
    later = at + timedelta(seconds=60)
    detail = f"http://engine:8000: predicted worst-layer CV {cv:.3f} -> {after:.3f}, 12 expert moves"
    return [
        (name, _sql_time(at), t_s, "rebalance", "imbalance_sustained", None, None, "applied", detail,
         json.dumps(rebalance)),
        (name, _sql_time(later), t_s + 60, "verify_rebalance", "verified", None, None, "verified",
         f"{detail}; measured {measured:.3f}", json.dumps(check)),
    ]


def _sql_time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _policy_rows(i: int, fleet: SyntheticFleet, end: datetime) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
    """Every decision row of one policy, and what its last tick saw (for the runtime view)."""
    rng = random.Random(fleet.seed * 1000 + i)
    name, kind = f"policy-{i:03d}", _kind(i)
    ticks = int(fleet.hours * 3600 / fleet.tick_s)
    end_s = end.timestamp()
    rows: list[tuple[Any, ...]] = []
    replicas = 2
    last: dict[str, Any] = {}
    every = max(1, int(4 * 3600 / fleet.tick_s))
    first = min(int(3600 / fleet.tick_s), ticks // 2)
    for k in range(ticks):
        t_s = end_s - (ticks - k) * fleet.tick_s
        at = datetime.fromtimestamp(t_s, UTC)
        load = _load(i, t_s, rng)
        forecast = _trend(i, t_s + 120) * (1.0 + rng.gauss(0.0, 0.02))
        need = _trend(i, t_s + 120) * 1.12 / 4.0
        # Hysteresis, as the core's cooldown gives: up at once, down only with room to spare.
        desired = max(1, min(16, math.ceil(need) if need > replicas or need < replicas - 1.3 else replicas))
        ratio = _ratio(kind, t_s, end_s, rng)
        cv = max(0.0, 0.09 + 0.04 * math.sin(t_s / 5000 + i) + rng.gauss(0, 0.01))
        action = "hold" if desired == replicas else ("scale_up" if desired > replicas else "scale_down")
        reasons = [action, "forecast" if action != "scale_down" else "low_utilization"]
        detail = f"{action.replace('_', ' ')} {replicas} -> {desired}: sizing needs {desired} (current_load,forecast)"
        inputs = {**_inputs(load, forecast, ratio, replicas, desired, cv), "reasons": reasons}
        rows.append((name, _sql_time(at), t_s, action, reasons[1], replicas, desired,
                     "held" if action == "hold" else "applied", detail, json.dumps(inputs)))
        if k % every == first and i % 3 == 0:  # a rebalance and its check every 4 h, one policy in three
            rows.extend(_rebalance_rows(name, at, t_s, cv + 0.1, rng))
        replicas = desired
        last = {"load": load, "forecast": forecast, "ratio": ratio, "replicas": replicas, "cv": cv, "reasons": reasons,
                "detail": detail}
    return rows, last


def _runtime(i: int, last: dict[str, Any], end: datetime) -> PolicyRuntime | None:
    kind = _kind(i)
    if kind == "stale" and i % 20 == 8:
        return None  # never observed: the page's "no data yet"
    ratio = last["ratio"]
    rates = {w: (1.0 - ratio) / 0.01 * (1.3 if w in ("5m", "30m", "1h") else 1.0) for w in BURN_WINDOWS}
    if kind == "ticket":
        rates = {w: (4.0 if w in ("1d", "2h") else 2.0) for w in BURN_WINDOWS}
    remaining = -0.4 if kind == "spent" else (0.2 if kind in ("paging", "ticket") else 0.85)
    forecast = last["forecast"]
    return PolicyRuntime(
        current_replicas=last["replicas"], desired_replicas=last["replicas"], stale=kind == "stale",
        observed_at=end - timedelta(seconds=200 if kind == "stale" else 5),
        sli={"ttft_good_ratio": ratio, "itl_good_ratio": min(1.0, ratio + 0.0005), "ttft_p99_seconds": 0.31,
             "itl_p99_seconds": 0.018, "imbalance_cv_max": last["cv"], "queue_depth": 0.0,
             "requests_in_window": last["load"] * 300},
        error_budget_remaining={"ttft": remaining, "itl": min(1.0, remaining + 0.1)},
        burn_rates={"ttft": dict(rates), "itl": {w: r * 0.5 for w, r in rates.items()}},
        errors=["prometheus unavailable: connection refused"] if kind == "stale" else [],
        seen={"request_rate_rps": last["load"], "queue_depth": 0.0, "kv_cache_usage": 0.4,
              "ready_replicas": last["replicas"], "replica_budget": None},
        forecast={"model": "moving_average_8", "horizon_s": 120, "quantile": 0.9, "request_rate_rps": forecast,
                  "request_rate_lower_rps": forecast * 0.9, "request_rate_upper_rps": forecast * 1.12,
                  "sized_request_rate_rps": forecast * 1.12, "wape": 0.08, "coverage": 0.82, "reliable": True,
                  "in_use": i % 5 != 4},
        decision={"action": last["reasons"][0], "reasons": last["reasons"], "detail": last["detail"]},
    )


def build_fleet(
    store: Store, fleet: SyntheticFleet, *, end: datetime | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FleetView:
    """Write the fleet's policies and decision log into ``store`` (SQLite); return its runtime view."""
    end = end or datetime.now(UTC)
    runtimes: dict[str, PolicyRuntime] = {}
    written = 0
    for i in range(fleet.policies):
        store.create_policy(_policy(i))
        rows, last = _policy_rows(i, fleet, end)
        with store.engine.begin() as conn:
            conn.exec_driver_sql(_INSERT, rows)
        written += len(rows)
        runtime = _runtime(i, last, end)
        if runtime is not None:
            runtimes[f"policy-{i:03d}"] = runtime
        if progress is not None:
            progress(i + 1, fleet.policies)
    return FleetView(runtimes, end, written)
