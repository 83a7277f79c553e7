"""Run one workload through scaling strategies on identical simulated fleets.

Each setting gets a fresh fleet in the same true world (same start-up draws, same
initial size: what the first start-up time of load needs), and is asked for a
replica count at the end of every tick, from what its real counterpart would read
(:mod:`controller.replay.signals`).  Every policy starts at the same moment with the
same empty history; the first ``warmup_s`` (30 minutes) are scored apart.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from contracts.slo_defaults import LEAD_TIME_S
from contracts.traces import PREFIX_BLOCK_TOKENS, FloatArray, IntArray
from controller.capacity import CapacityModel, Load, ReplicaProfile, Targets
from controller.replay.dynamo import DynamoPlanner, PlannerSettings
from controller.replay.fleet import RequestFleet
from controller.replay.fluid import FluidFleet
from controller.replay.prefix_cache import pooled_hit_rate
from controller.replay.scoring import Score, TickOutcomes, score
from controller.replay.settings import Setting, parse_setting
from controller.replay.signals import FleetView, MetricsPipeline
from controller.replay.strategies import (
    CoreStrategy,
    DynamoLoadStrategy,
    DynamoStrategy,
    HpaLoadStrategy,
    KedaStrategy,
    OracleStrategy,
    ReplayStrategy,
    StaticStrategy,
    production_core,
)
from controller.replay.workload import Workload
from controller.replay.world import ProfileCache, World, true_targets

__all__ = ["PolicyRun", "ReplayConfig", "ReplayContext", "run_setting"]


@dataclass(frozen=True, kw_only=True)
class ReplayConfig:
    tick_s: float = 15.0
    world: World = field(default_factory=lambda: World(startup_s=float(LEAD_TIME_S)))
    """The true world; its ``startup_s`` is also every controller's lead time."""
    scrape_s: float = 30.0
    """Prometheus scrape interval of the replicas' metrics (kube-prometheus-stack's default)."""
    dynamo_scrape_s: float = 5.0
    """Dynamo's frontend PodMonitor interval."""
    adapter_rate_window_s: float = 120.0
    """``rate(...[2m])`` of prometheus-adapter's sample rule, for the HPA's custom metric."""
    refit_every_ticks: int = 240
    """Refit moeslo's forecaster at most this often (every hour at 15 s ticks; sooner while history is short)."""
    max_replicas: int | None = None
    """Every policy's upper bound; None: twice what the controllers' model asks for the trace's peak
    (an operator's quota; KEDA's own default is 100)."""
    targets: Targets = field(default_factory=Targets)
    """The SLO targets and the length tail the controllers assume (the nominal ones); ``targets.ttft_allowance``
    is the TTFT objective's long-prompt allowance, by which the fleet judges every request."""
    season_s: float | None = 86_400.0
    warmup_s: float = 1800.0
    reference_lengths: tuple[float, float] = (1155.0, 211.0)
    """Mean prompt and output tokens an operator benchmarks with (Azure 2023 conversation):
    the mix at which the HPA's custom metric converts tokens/s to a load share."""

    @property
    def startup_s(self) -> float:
        return self.world.startup_s

    @property
    def lead_ticks(self) -> int:
        return math.ceil(self.world.startup_s / self.tick_s)


def _needs(loads: tuple[FloatArray, FloatArray, FloatArray], model_at: Callable[[float], CapacityModel],
           tick_s: float) -> FloatArray:  # fmt: skip
    rates, prompt, output = loads
    out = np.zeros(len(rates))
    for k in range(len(rates)):
        load = Load(request_rate_rps=float(rates[k]), prompt_tokens_per_s=float(prompt[k]),
                    output_tokens_per_s=float(output[k]))  # fmt: skip
        out[k] = model_at(k * tick_s).replicas_needed(load)
    return out


class ReplayContext:
    """What every run of one workload shares: the true world, the nominal profile, derived sizes."""

    def __init__(self, workload: Workload, profile: ReplicaProfile, config: ReplayConfig) -> None:
        self.workload = workload
        self.profile = profile
        self.config = config
        self.true_targets = true_targets(config.targets, workload.prompt_samples)
        self.truth = ProfileCache(profile, config.world, self.true_targets)
        self._true_needs: dict[float, FloatArray] = {}
        self.initial_replicas = self._initial_replicas()
        self.max_replicas = config.max_replicas or min(2 * self.peak_need(config.targets.headroom), 10_000)
        requests = workload.requests
        if requests is not None and requests.prefix_blocks is not None:
            self._calibrate_hit_rate(requests.prompt_tokens, requests.prefix_blocks)

    def _calibrate_hit_rate(self, prompts: IntArray, blocks: tuple[IntArray, ...]) -> None:
        """The oracle's prefix-cache hit rate: what its own fleet achieves on this trace.

        First guess: one LRU as large as the initial fleet's caches together; then the oracle runs once
        with it, and the hit rate its fleet achieved is what the true world is sized with.
        """
        pooled = self.initial_replicas * (self.profile.kv_capacity_tokens // PREFIX_BLOCK_TOKENS)
        self._set_hit_rate(pooled_hit_rate(prompts, blocks, pooled))
        outcomes = run_setting(parse_setting("oracle"), self).outcomes
        if outcomes.cached_tokens is not None and outcomes.prompt_tokens is not None:
            self._set_hit_rate(float(outcomes.cached_tokens.sum()) / max(float(outcomes.prompt_tokens.sum()), 1.0))

    def _set_hit_rate(self, hit_rate: float) -> None:
        self.truth = ProfileCache(self.profile, self.config.world, self.true_targets, hit_rate)
        self._true_needs.clear()
        self.initial_replicas = self._initial_replicas()

    def _initial_replicas(self) -> int:
        """What the true load of the first start-up time needs (every policy starts with it)."""
        loads, config = self._loads, self.config
        first = slice(0, min(config.lead_ticks + 1, self.workload.ticks))
        head = _needs((loads[0][first], loads[1][first], loads[2][first]), self.truth.model_at, config.tick_s)
        return max(int(head.max()), 1)

    @property
    def _loads(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        w = self.workload
        return w.rates_rps, w.prompt_tokens_per_s, w.output_tokens_per_s

    def nominal_capacity(self, headroom: float | None = None) -> CapacityModel:
        targets = self.config.targets
        if headroom is not None:
            targets = replace(targets, headroom=headroom)
        return CapacityModel(self.profile, targets)

    def true_needs(self, headroom: float) -> FloatArray:
        """Replicas the true world needs for each tick's true load, at ``headroom``."""
        if headroom not in self._true_needs:
            targets = replace(self.true_targets, headroom=headroom)
            cache = ProfileCache(self.profile, self.config.world, targets, self.truth.prefix_hit_rate)
            self._true_needs[headroom] = _needs(self._loads, cache.model_at, self.config.tick_s)
        return self._true_needs[headroom]

    def peak_need(self, headroom: float) -> int:
        """Replicas the controllers' model asks for the busiest ticks (the top 1 % by tokens/s)."""
        w = self.workload
        tokens = w.prompt_tokens_per_s + w.output_tokens_per_s
        top = np.argsort(tokens)[-max(len(tokens) // 100, 1) :]
        model = self.nominal_capacity(headroom)
        loads = self._loads
        return max(int(_needs((loads[0][top], loads[1][top], loads[2][top]), lambda _: model, 1.0).max()), 1)

    @property
    def dynamo_ttft_target_s(self) -> float:
        """The TTFT target an operator gives Dynamo's planner (mean TTFT, no per-request allowance): the
        objective at the trace's mean prompt."""
        targets = self.config.targets
        mean_prompt = float(np.mean(self.workload.prompt_samples)) if self.workload.prompt_samples is not None else 0.0
        return targets.ttft_s + targets.ttft_allowance.allowance_s(mean_prompt)

    @cached_property
    def reference_rates(self) -> tuple[float, float]:
        prompt, output = self.config.reference_lengths
        return self.nominal_capacity().sustainable_rates(mean_prompt_tokens=prompt, mean_output_tokens=output)


def build_strategy(setting: Setting, ctx: ReplayContext) -> ReplayStrategy:
    config = ctx.config
    policy = setting.policy
    if policy == "static":
        return StaticStrategy(ctx.peak_need(setting.number("headroom")))
    if policy == "oracle":
        return OracleStrategy(np.maximum(ctx.true_needs(setting.number("headroom")), 1), lead_ticks=config.lead_ticks)
    if policy == "hpa":
        prefill, decode = ctx.reference_rates
        return HpaLoadStrategy(
            target=setting.number("target"),
            prefill_tokens_per_s_at_slo=prefill,
            decode_tokens_per_s_at_slo=decode,
            max_replicas=ctx.max_replicas,
            rate_window_s=config.adapter_rate_window_s,
            scale_down_window_s=setting.number("scale_down_window_s"),
        )
    if policy in ("keda-queue", "keda-kv"):
        gauge = "waiting" if policy == "keda-queue" else "kv_usage_sum"
        return KedaStrategy(name=policy, gauge=gauge, threshold=setting.number("threshold"),
                            max_replicas=ctx.max_replicas)  # fmt: skip
    if policy == "dynamo":
        settings = PlannerSettings(
            predictor=setting.text("predictor"),
            headroom=setting.number("headroom"),
            ttft_target_ms=ctx.dynamo_ttft_target_s * 1000.0,
            itl_target_ms=config.targets.itl_s * 1000.0,
            max_replicas=ctx.max_replicas,
        )
        return DynamoStrategy(DynamoPlanner(ctx.profile, settings), scrape_s=config.dynamo_scrape_s)
    if policy == "dynamo-load":
        return DynamoLoadStrategy(scale_up=setting.number("scale_up"), scale_down=setting.number("scale_down"),
                                  max_replicas=ctx.max_replicas, tick_s=config.tick_s)  # fmt: skip
    core = production_core(
        profile=ctx.profile, tick_s=config.tick_s, refit_every_ticks=config.refit_every_ticks, season_s=config.season_s
    )
    return CoreStrategy.for_replay(
        core,
        lead_time_s=round(config.startup_s),
        cooldown_s=round(setting.number("cooldown_s")),
        max_replicas=ctx.max_replicas,
        quantile=setting.number("quantile"),
        headroom=setting.number("headroom"),
        ttft=config.targets,
    )


@dataclass(kw_only=True)
class PolicyRun:
    setting: Setting
    outcomes: TickOutcomes
    wall_s: float
    cpu_s: float
    """CPU time of the process that ran it (on a shared machine, wall time also counts other people's work)."""
    forecast_rps: FloatArray | None = None
    """(point, lower, upper) request-rate forecast one lead time ahead, per tick (moeslo only)."""
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.setting.label

    def score(self, start_s: float = 0.0, end_s: float = math.inf) -> Score:
        return score(self.outcomes, start_s, end_s)


def make_fleet(ctx: ReplayContext) -> RequestFleet | FluidFleet:
    """Every request simulated (request mode), or per-tick aggregates (fluid mode)."""
    w, config = ctx.workload, ctx.config
    if w.requests is not None:
        return RequestFleet(
            w.requests,
            ctx.truth,
            initial_replicas=ctx.initial_replicas,
            tick_s=config.tick_s,
            ttft_target_s=config.targets.ttft_s,
            itl_target_s=config.targets.itl_s,
            ttft_allowance=config.targets.ttft_allowance,
        )
    return FluidFleet(
        w.rates_rps, w.prompt_tokens_per_s, w.output_tokens_per_s, ctx.truth,
        initial_replicas=ctx.initial_replicas, tick_s=config.tick_s, prompt_samples=w.prompt_samples,
    )  # fmt: skip


def run_setting(setting: Setting, ctx: ReplayContext, *, on_tick: Callable[[int], None] | None = None) -> PolicyRun:
    began, began_cpu = time.perf_counter(), time.process_time()
    strategy = build_strategy(setting, ctx)
    config = ctx.config
    fleet = make_fleet(ctx)
    n = ctx.workload.ticks
    targets = config.targets
    pipeline = MetricsPipeline(tick_s=config.tick_s, ticks=n, scrape_s=config.scrape_s,
                               ttft_threshold_s=targets.ttft_s, itl_threshold_s=targets.itl_s)  # fmt: skip
    provisioned = np.zeros(n, dtype=np.int64)
    ready = np.zeros(n, dtype=np.int64)
    scaled = np.zeros(n, dtype=bool)
    forecasts = np.full((3, n), np.nan) if isinstance(strategy, CoreStrategy) else None
    for k in range(n):
        now_s = (k + 1) * config.tick_s
        fleet.advance(now_s)
        pipeline.record(k, fleet.sample(now_s))
        provisioned[k] = fleet.billed(now_s)
        ready[k] = fleet.ready_count(now_s)
        view = FleetView(pipeline=pipeline, tick=k, now_s=now_s, spec_replicas=fleet.provisioned,
                         ready_replicas=int(ready[k]))  # fmt: skip
        scaled[k] = fleet.scale_to(strategy.desired(view), now_s)
        if forecasts is not None and isinstance(strategy, CoreStrategy):
            last = strategy.last_forecast()
            if last is not None:
                forecasts[:, k] = last
        if on_tick is not None:
            on_tick(k)
    base = fleet.outcomes(n)
    outcomes = replace(base, provisioned=provisioned, ready=ready, scaled=scaled)
    return PolicyRun(
        setting=setting,
        outcomes=outcomes,
        wall_s=time.perf_counter() - began,
        cpu_s=time.process_time() - began_cpu,
        forecast_rps=forecasts,
        reasons=dict(sorted(strategy.reasons.items())) if isinstance(strategy, CoreStrategy) else {},
    )
