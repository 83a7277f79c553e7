"""The reactive scaling advisor: replicas needed from SLI feedback and queue depth.

It is the core's default opinion until forecasting is available, and stays as
the reactive floor beside the predictive advisor (the core takes the max).
It says what it would like; bounds, cooldown and step limits are the core's.

Scale up (proportionally, HPA-style, from the capacity of *ready* replicas, so
replicas already asked for but still starting are counted as coming):

- ``queue_depth``: more than ``queue_per_replica_high`` waiting requests per
  ready replica.  A replica with a queue is saturated, so its running batch is
  its capacity: need = ceil((running + waiting) / (running / ready)).  Requests
  held at the entry router (``router_queued``) wait too and count with the
  engines' queue (``router_queue``);
- ``slo_burn``: the short-window burn rate of TTFT or ITL exceeds
  ``burn_rate_scale_up`` (budget spent faster than the window allows);
- ``latency_p99``: p99 TTFT or ITL above its threshold: need grows by the ratio;
- both only for an SLI whose misses are beyond chance at its objective
  (:func:`controller.slo.misses_beyond_chance`; ``burn_within_chance`` in the details
  says one was left out): over a 30 s window a replica's few hundred token gaps burn
  above 1 by chance alone;
- ``high_utilization``: mean KV-cache usage above ``kv_scale_up_usage``: size
  the ready replicas for ``target_kv_usage`` (HPA-style, before queues form).

The SLIs are windowed (5 minutes by default), so they keep showing an overload
for a window after it ended: they ask for one step per SLI window, and within
it only for what they asked already (``scale_up_pending`` once it is there).

Scale down (``low_utilization``) only when the SLIs are trusted and healthy
(burn rate below ``burn_rate_scale_down``, p99 under ``latency_headroom`` of
the threshold), nothing waits, and KV-cache usage says the load fits in
fewer replicas at ``target_kv_usage``, and nothing waits at the entry router
either.  It asks for fewer than one replica only when the policy allows zero and
names its entry router, and the router and the engines are idle
(:func:`controller.entry_demand.entry_idle`): a fleet at zero has no engines and
so no engine signals, and the router's queue is what wakes it.  The core brings
a fleet below ``min_replicas`` back to the bound without data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from controller.entry_demand import entry_idle, router_waiting
from controller.policy import Policy
from controller.slo import burn_rate, misses_beyond_chance
from controller.types import Advice, PolicyObservation, Reason, SliSnapshot

__all__ = ["ReactiveAdvisor", "ReactiveConfig"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ReactiveConfig:
    queue_per_replica_high: float = 1.0
    """Waiting requests per ready replica above which the queue asks for more replicas."""
    min_requests_for_sli: float = 20.0
    """Fewer finished requests than this in the SLI window: the good ratios are not trusted."""
    sli_max_age_s: float = 120.0
    """An SLI snapshot older than this is ignored."""
    burn_rate_scale_up: float = 1.0
    burn_rate_scale_down: float = 0.5
    latency_headroom: float = 0.6
    """Scale down only while p99 latencies sit under this fraction of their thresholds."""
    target_kv_usage: float = 0.7
    """KV-cache usage the fleet is sized for, on the way up (above ``kv_scale_up_usage``) and down."""
    kv_scale_up_usage: float = 0.85
    """Mean KV-cache usage above which the ready replicas are about to saturate: scale up to the target."""
    up_step_fraction: float = 0.25
    """A burning SLO adds this share of the ready replicas (at least one)."""
    max_up_factor: float = 2.0
    """One tick's need is at most this multiple of the ready replicas (plus one)."""

    def __post_init__(self) -> None:
        problems = []
        if self.queue_per_replica_high < 0:
            problems.append(f"queue_per_replica_high must be >= 0, got {self.queue_per_replica_high}")
        if not 0 < self.target_kv_usage <= 1:
            problems.append(f"target_kv_usage must be in (0, 1], got {self.target_kv_usage}")
        if not self.target_kv_usage <= self.kv_scale_up_usage <= 1:
            problems.append(f"kv_scale_up_usage must be in [target_kv_usage, 1], got {self.kv_scale_up_usage}")
        if self.burn_rate_scale_down > self.burn_rate_scale_up:
            problems.append("burn_rate_scale_down must be <= burn_rate_scale_up")
        if self.max_up_factor < 1:
            problems.append(f"max_up_factor must be >= 1, got {self.max_up_factor}")
        if problems:
            raise ValueError("; ".join(problems))


class ReactiveAdvisor:
    """Replicas needed now, from what the replicas report now (no history, no forecast)."""

    name = "reactive"

    def __init__(self, config: ReactiveConfig | None = None) -> None:
        self.config = config or ReactiveConfig()
        self._sli_steps: dict[str, tuple[float, int]] = {}
        """Per policy: when the SLIs last asked for more replicas, and how many."""

    def forget(self, policy_name: str) -> None:
        """A deleted policy's SLI step goes with it (one created again under the name is another workload)."""
        self._sli_steps.pop(policy_name, None)

    def advise(self, policy: Policy, observation: PolicyObservation, now_s: float) -> Advice:
        cfg = self.config
        current = observation.current_replicas
        if current is None:
            return Advice(replicas_needed=None, reasons=(Reason.INSUFFICIENT_DATA,))
        ready = current if observation.ready_replicas is None else min(observation.ready_replicas, current)
        sli = self._trusted_sli(observation.sli, now_s)
        queue = observation.queue_depth
        at_entry = router_waiting(observation)
        if queue is None and observation.router_queued is None and sli is None:
            return Advice(replicas_needed=None, reasons=(Reason.INSUFFICIENT_DATA,))

        ceiling = math.ceil(ready * cfg.max_up_factor) + 1
        up_needs = self._queue_needs(observation, ready, ceiling)
        kv = observation.kv_cache_usage
        if kv is not None and ready > 0 and kv > cfg.kv_scale_up_usage:
            sized = math.ceil(round(ready * kv / cfg.target_kv_usage, 9))
            up_needs.append((min(ceiling, max(ready + 1, sized)), Reason.HIGH_UTILIZATION))
        pressure = _sli_pressure(policy, sli, max(1.0, (observation.running_requests or 0.0) / max(ready, 1)))
        worst_burn, worst_latency_ratio = pressure.worst_burn, pressure.worst_latency_ratio
        sli_needs: list[tuple[int, str]] = []
        if pressure.up_burn is not None and pressure.up_burn > cfg.burn_rate_scale_up:
            sli_needs.append((ready + max(1, math.ceil(ready * cfg.up_step_fraction)), Reason.SLO_BURN))
        if pressure.up_latency_ratio is not None and pressure.up_latency_ratio > 1.0:
            grown = math.ceil(ready * min(pressure.up_latency_ratio, cfg.max_up_factor))
            sli_needs.append((max(ready + 1, grown), Reason.LATENCY_P99))
        if sli is not None and sli_needs:
            up_needs.extend(self._one_sli_step_per_window(policy.name, sli.window_s, sli_needs, current, now_s))

        details = {
            "ready_replicas": ready,
            "worst_burn_rate": worst_burn,
            "worst_latency_ratio": worst_latency_ratio,
            "burn_within_chance": pressure.within_chance,
        }
        if up_needs:
            need = max(n for n, _ in up_needs)
            reasons = tuple(dict.fromkeys(r for _, r in up_needs))
            if need <= current:
                # The replicas this pressure calls for were already asked for and are starting.
                return Advice(replicas_needed=current, reasons=(*reasons, Reason.SCALE_UP_PENDING), details=details)
            return Advice(replicas_needed=need, reasons=reasons, details=details)

        if sli is None:
            return Advice(replicas_needed=current, reasons=(Reason.SLI_MISSING,), details=details)
        healthy = (worst_burn is None or worst_burn < cfg.burn_rate_scale_down) and (
            worst_latency_ratio is None or worst_latency_ratio < cfg.latency_headroom
        )
        if healthy and queue is not None and queue == 0 and at_entry == 0 and kv is not None and ready == current:
            # At least one unless the router is watched and idle: engine signals cannot bring a fleet back from zero.
            floor = 0 if entry_idle(policy, observation) else 1
            need = max(floor, math.ceil(round(ready * kv / cfg.target_kv_usage, 9)))
            if need < current:
                details["kv_cache_usage"] = kv
                return Advice(replicas_needed=need, reasons=(Reason.LOW_UTILIZATION,), details=details)
        return Advice(replicas_needed=current, reasons=(Reason.WITHIN_SLO,), details=details)

    def _queue_needs(self, observation: PolicyObservation, ready: int, ceiling: int) -> list[tuple[int, str]]:
        """The queue rule over every waiting request: the engines' queue and the entry router's."""
        queue, at_entry = observation.queue_depth or 0.0, router_waiting(observation)
        waiting = queue + at_entry
        causes = [r for r, n in ((Reason.QUEUE_DEPTH, queue), (Reason.ROUTER_QUEUE, at_entry)) if n > 0]
        if waiting <= 0:
            return []
        if ready == 0:
            return [(1, cause) for cause in causes]
        if waiting / ready <= self.config.queue_per_replica_high:
            return []
        running = observation.running_requests or 0.0
        per_replica = max(running / ready, 1.0)
        wanted = min(ceiling, math.ceil((running + waiting) / per_replica))
        return [(wanted, cause) for cause in causes]

    def _one_sli_step_per_window(
        self, policy: str, window_s: float, needs: list[tuple[int, str]], current: int, now_s: float
    ) -> list[tuple[int, str]]:
        """Windowed SLIs still show the minutes before the last step: take one step per SLI window.

        Without this, a 5-minute burn rate that stays high for 5 minutes after an
        overload ended would keep adding replicas every tick as the new ones turn ready.
        """
        previous = self._sli_steps.get(policy)
        if previous is not None and (now_s < previous[0] or now_s - previous[0] >= window_s):
            previous = None  # re-armed (or the clock was restarted, as in a new replay)
        if previous is not None:
            return [(min(need, previous[1]), reason) for need, reason in needs]
        step = max(need for need, _ in needs)
        if step > current:
            self._sli_steps[policy] = (now_s, step)
        return needs

    def _trusted_sli(self, sli: SliSnapshot | None, now_s: float) -> SliSnapshot | None:
        if sli is None or now_s - sli.observed_at_s > self.config.sli_max_age_s:
            return None
        least = self.config.min_requests_for_sli
        if sli.requests_in_window is not None and sli.requests_in_window < least:
            return None
        if sli.ttft_events_in_window is not None and sli.ttft_events_in_window < least:  # ITL still judged
            return replace(sli, ttft_good_ratio=None, ttft_p99_s=None, ttft_good_ratio_by_window={})
        return sli


@dataclass(frozen=True, slots=True)
class _SliPressure:
    worst_burn: float | None = None
    """The worst short-window burn rate over TTFT and ITL (the scale-down health check reads it)."""
    worst_latency_ratio: float | None = None
    """The worst p99 / threshold."""
    up_burn: float | None = None
    """The same over the SLIs whose misses are beyond chance: what scale-ups answer."""
    up_latency_ratio: float | None = None
    within_chance: bool = False
    """A burn above 1 or a p99 over its threshold was left out: chance at the objective explains it."""


def _sli_pressure(policy: Policy, sli: SliSnapshot | None, itl_clump: float) -> _SliPressure:
    """Burn rates and p99 ratios of the SLI window; a scale-up answers only misses beyond chance
    (:func:`controller.slo.misses_beyond_chance`: ITL gaps in clumps of ``itl_clump``, the running
    requests per replica, as one stalled step delays each one's next token)."""
    if sli is None:
        return _SliPressure()
    objectives = policy.objectives
    itl_events, clump = sli.itl_events_in_window, itl_clump
    ttft_events = sli.requests_in_window if sli.ttft_events_in_window is None else sli.ttft_events_in_window
    if itl_events is None:
        itl_events, clump = sli.requests_in_window, 1.0
    burns: list[float] = []
    ratios: list[float] = []
    up_burns: list[float] = []
    up_ratios: list[float] = []
    within_chance = False
    for good, p99_s, objective, events, per in (
        (sli.ttft_good_ratio, sli.ttft_p99_s, objectives.ttft, ttft_events, 1.0),
        (sli.itl_good_ratio, sli.itl_p99_s, objectives.itl, itl_events, clump),
    ):
        burn = None if good is None else burn_rate(min(max(good, 0.0), 1.0), objective.target)
        ratio = None if p99_s is None else p99_s / objective.threshold_s
        burns += [] if burn is None else [burn]
        ratios += [] if ratio is None else [ratio]
        if good is not None and events is not None and not misses_beyond_chance(good, events, objective.target,
                                                                                 clump=per):
            within_chance = within_chance or (burn or 0.0) > 1.0 or (ratio or 0.0) > 1.0
            continue
        up_burns += [] if burn is None else [burn]
        up_ratios += [] if ratio is None else [ratio]
    return _SliPressure(
        worst_burn=max(burns, default=None), worst_latency_ratio=max(ratios, default=None),
        up_burn=max(up_burns, default=None), up_latency_ratio=max(up_ratios, default=None),
        within_chance=within_chance,
    )
