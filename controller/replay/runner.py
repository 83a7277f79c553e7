"""Run one workload through every scaling strategy on identical simulated fleets, and summarise.

Each policy gets a fresh fleet (same profile, same start-up delay, same initial
size: what the first two minutes of load need) and is asked for a replica count
at the end of every tick, from what a metrics source would have reported.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from contracts.slo_defaults import LEAD_TIME_S, SCALE_DOWN_COOLDOWN_S
from contracts.traces import FloatArray
from controller.capacity import CapacityModel, Load, ReplicaProfile, Targets
from controller.replay.baselines import (
    STRATEGY_NAMES,
    CoreStrategy,
    DynamoStyleStrategy,
    HpaStrategy,
    OracleStrategy,
    ReplayStrategy,
    StaticStrategy,
)
from controller.replay.fleet import FleetTotals, RequestFleet
from controller.replay.fluid import FluidFleet
from controller.replay.workload import Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayConfig:
    tick_s: float = 15.0
    startup_s: float = float(LEAD_TIME_S)
    """Pod start-up time; also the policies' lead time."""
    cooldown_s: int = SCALE_DOWN_COOLDOWN_S
    quantile: float = 0.9
    refit_every_ticks: int = 240
    """Refit moeslo's forecaster at most this often (every hour at 15 s ticks; sooner while history is short)."""
    hpa_target_utilization: float = 0.7
    hpa_stabilization_s: float = 180.0
    dynamo_interval_s: float = 180.0
    max_replicas: int = 10_000
    targets: Targets = field(default_factory=Targets)
    season_s: float | None = 86_400.0


@dataclass(kw_only=True)
class PolicyRun:
    name: str
    totals: FleetTotals
    wall_s: float
    cpu_s: float
    """CPU time of this process (on a shared machine, wall time also counts other people's work)."""
    times_s: FloatArray
    provisioned: np.ndarray
    ready: np.ndarray
    forecast_point_rps: FloatArray | None = None
    forecast_lower_rps: FloatArray | None = None
    forecast_upper_rps: FloatArray | None = None
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def replica_hours(self) -> float:
        return self.totals.replica_seconds / 3600.0

    @property
    def attainment(self) -> float:
        return self.totals.good_both / self.totals.requests if self.totals.requests else float("nan")

    def summary(self) -> dict[str, object]:
        t = self.totals
        n = max(t.requests, 1)
        return {
            "requests": t.requests,
            "attainment_both": round(t.good_both / n, 5),
            "attainment_ttft": round(t.good_ttft / n, 5),
            "attainment_itl": round(t.good_itl / n, 5),
            "replica_hours": round(self.replica_hours, 3),
            "scale_events": t.scale_events,
            "peak_replicas": int(self.provisioned.max()) if len(self.provisioned) else 0,
            "wall_s": round(self.wall_s, 2),
            "cpu_s": round(self.cpu_s, 2),
            **({"reasons": self.reasons} if self.reasons else {}),
        }


def needs_per_tick(workload: Workload, capacity: CapacityModel) -> FloatArray:
    return np.array(
        [
            capacity.replicas_needed(
                Load(request_rate_rps=float(r), prompt_tokens_per_s=float(p), output_tokens_per_s=float(o))
            )
            for r, p, o in zip(
                workload.rates_rps, workload.prompt_tokens_per_s, workload.output_tokens_per_s, strict=True
            )
        ],
        dtype=np.float64,
    )


def build_policy(
    name: str, workload: Workload, profile: ReplicaProfile, config: ReplayConfig, needs: FloatArray
) -> ReplayStrategy:
    capacity = CapacityModel(profile, config.targets)
    lead_ticks = math.ceil(config.startup_s / config.tick_s)
    if name == "static":
        return StaticStrategy(max(int(needs.max()), 1))
    if name == "oracle":
        return OracleStrategy(np.maximum(needs, 1), lead_ticks=lead_ticks)
    if name == "hpa":
        active = workload.rates_rps > 0
        rate_sum = max(float(workload.rates_rps[active].sum()), 1e-9)
        mean_prompt = float(workload.prompt_tokens_per_s[active].sum()) / rate_sum
        mean_output = float(workload.output_tokens_per_s[active].sum()) / rate_sum
        prefill, decode = capacity.sustainable_rates(mean_prompt_tokens=mean_prompt, mean_output_tokens=mean_output)
        return HpaStrategy(
            prefill_tokens_per_s_at_slo=prefill,
            decode_tokens_per_s_at_slo=decode,
            target_utilization=config.hpa_target_utilization,
            scale_down_stabilization_s=config.hpa_stabilization_s,
        )
    if name == "dynamo":
        return DynamoStyleStrategy(capacity, interval_s=config.dynamo_interval_s)
    if name == "moeslo":
        return CoreStrategy(
            profile,
            tick_s=config.tick_s,
            lead_time_s=int(config.startup_s),
            cooldown_s=config.cooldown_s,
            max_replicas=config.max_replicas,
            quantile=config.quantile,
            refit_every_ticks=config.refit_every_ticks,
            season_s=config.season_s,
        )
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(STRATEGY_NAMES)}")


def _make_fleet(
    workload: Workload, profile: ReplicaProfile, config: ReplayConfig, initial: int
) -> RequestFleet | FluidFleet:
    """Every request simulated (request mode), or per-tick aggregates (fluid mode)."""
    if workload.requests is not None:
        return RequestFleet(
            workload.requests,
            profile,
            initial_replicas=initial,
            startup_s=config.startup_s,
            tick_s=config.tick_s,
            ttft_target_s=config.targets.ttft_s,
            itl_target_s=config.targets.itl_s,
        )
    return FluidFleet(
        workload.rates_rps,
        workload.prompt_tokens_per_s,
        workload.output_tokens_per_s,
        profile,
        initial_replicas=initial,
        startup_s=config.startup_s,
        tick_s=config.tick_s,
        targets=config.targets,
    )


def run_policy(
    name: str,
    workload: Workload,
    profile: ReplicaProfile,
    config: ReplayConfig,
    *,
    needs: FloatArray,
    on_tick: Callable[[int], None] | None = None,
) -> PolicyRun:
    began = time.perf_counter()
    began_cpu = time.process_time()
    policy = build_policy(name, workload, profile, config, needs)
    lead_ticks = math.ceil(config.startup_s / config.tick_s)
    initial = max(int(needs[: lead_ticks + 1].max()), 1)
    tick_s = config.tick_s
    fleet = _make_fleet(workload, profile, config, initial)
    n = workload.ticks
    times: FloatArray = np.arange(1, n + 1, dtype=np.float64) * tick_s
    provisioned = np.zeros(n, dtype=np.int64)
    ready = np.zeros(n, dtype=np.int64)
    forecasts = np.full((3, n), np.nan) if isinstance(policy, CoreStrategy) else None
    for k in range(n):
        now_s = float(times[k])
        fleet.advance(now_s)
        observation = fleet.observe(now_s)
        provisioned[k] = fleet.provisioned
        ready[k] = observation.ready_replicas or 0
        fleet.scale_to(policy.desired(observation, now_s, k), now_s)
        if forecasts is not None and isinstance(policy, CoreStrategy):
            last = policy.advisor.last_forecast.get(policy.policy.name)
            if last is not None:
                forecasts[:, k] = last
        if on_tick is not None:
            on_tick(k)
    totals = fleet.totals(float(times[-1]))
    return PolicyRun(
        name=name,
        totals=totals,
        wall_s=time.perf_counter() - began,
        cpu_s=time.process_time() - began_cpu,
        times_s=times,
        provisioned=provisioned,
        ready=ready,
        forecast_point_rps=None if forecasts is None else forecasts[0],
        forecast_lower_rps=None if forecasts is None else forecasts[1],
        forecast_upper_rps=None if forecasts is None else forecasts[2],
        reasons=dict(sorted(policy.reasons.items())) if isinstance(policy, CoreStrategy) else {},
    )


def run_replay(
    workload: Workload,
    policies: Sequence[str],
    profile: ReplicaProfile,
    config: ReplayConfig,
    *,
    on_tick: Callable[[str, int], None] | None = None,
) -> list[PolicyRun]:
    unknown = [p for p in policies if p not in STRATEGY_NAMES]
    if unknown:
        raise ValueError(f"unknown policies {', '.join(unknown)}; choose from {', '.join(STRATEGY_NAMES)}")
    needs = needs_per_tick(workload, CapacityModel(profile, config.targets))
    runs = []
    for name in policies:
        callback = None if on_tick is None else (lambda k, n=name: on_tick(n, k))
        runs.append(run_policy(name, workload, profile, config, needs=needs, on_tick=callback))
    return runs


def summarise(workload: Workload, runs: Sequence[PolicyRun], profile: ReplicaProfile) -> dict[str, object]:
    by_name = {run.name: run for run in runs}
    oracle = by_name.get("oracle")
    policies: dict[str, object] = {}
    for run in runs:
        entry = run.summary()
        if oracle is not None and oracle.replica_hours > 0:
            entry["replica_hours_vs_oracle"] = round(run.replica_hours / oracle.replica_hours, 4)
        policies[run.name] = entry
    return {
        "trace": workload.name,
        "mode": "request" if workload.requests is not None else "fluid",
        "duration_s": workload.duration_s,
        "tick_s": workload.tick_s,
        "requests": round(float(workload.rates_rps.sum()) * workload.tick_s),
        "mean_tokens_per_s": round(workload.total_tokens / workload.duration_s, 1),
        "profile": profile.name,
        "policies": policies,
    }
