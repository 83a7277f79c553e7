"""The controller service: the tick loop that connects sources, the core, actuators and the store.

One tick::

    store.list_policies()                       (what to govern)
    source.observe(policies, now_s)             (SLIs, queue, load; Prometheus or scrape)
    actuator.replicas(policy)                   (replicas asked for / ready)
    core.tick(TickInput)                        (pure: decisions with reasons; in a worker thread)
    actuator.scale(policy, n)                   (enforce mode, leader only, decisions with apply)
    store.append_decisions(...)                 (the decision log; leader only)
    metrics; core.refit()                       (moeslo_* series; forecast refits, in a worker thread too)

Faults stay inside the tick: a source that fails (or has not answered within ``read_timeout_s``) yields
observations with errors (the core holds; scale-downs are blocked; stale data holds all changes), an actuator
that fails after its own retries is logged as a ``failed`` decision and counted in ``moeslo_errors_total``, and
the next tick decides afresh from the replica count it reads back -- scale calls are absolute, so nothing is
applied twice.  Only the leader actuates and logs; standbys evaluate, so their ``/v1/status`` stays current.
Leadership is read afresh before each decision is carried out, by the actuator before each write it retries, and
before each policy's and engine's rebalancing: a lease lost mid-tick stops what is left of it (``standby``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from contracts.errors import MoesloError, UnavailableError
from controller.actuators import Actuator, DryRunActuator
from controller.config import ControllerSettings
from controller.core import DecisionCore
from controller.decision_log import (
    INTERRUPTED,
    DecisionLogWriter,
    decision_record,
    interrupted_detail,
    logged_reason,
    rebalance_record,
)
from controller.errors import ActuationError, LeadershipLostError
from controller.leader import AlwaysLeader, LeaderElector
from controller.policy import LocalTarget, Mode, Policy
from controller.runtime import Creations, PolicyRuntime, fault_text, report_budgets, report_forecast, sli_view
from controller.sources import SliSource, configured_source
from controller.sources.base import LateAnswerError, within
from controller.store import DecisionRecord, Store, StoredPolicy
from controller.tasks import run_to_end
from controller.telemetry import ControllerMetrics
from controller.types import Decision, Effects, PolicyObservation, TickInput

if TYPE_CHECKING:
    from controller.actuators.placement import Rebalancer
    from controller.load_history import LoadHistoryKeeper

log = logging.getLogger(__name__)

PRUNE_EVERY_TICKS = 100


class ControllerService:
    """Runs ticks on an interval and exposes what it learnt to the API (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        source: SliSource,
        actuator: Actuator,
        core: DecisionCore,
        metrics: ControllerMetrics,
        elector: LeaderElector | None = None,
        tick_interval_s: float = 15.0,
        stale_after_s: float = 60.0,
        static_endpoints: Mapping[str, Sequence[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        rebalancer: Rebalancer | None = None,
        decisions_keep: int = 500_000,
        history: LoadHistoryKeeper | None = None,
        shutdown_grace_s: float = 15.0,
        read_timeout_s: float = 60.0,
        scale_timeout_s: float | None = None,
    ) -> None:
        self.read_timeout_s = read_timeout_s
        """A backstop on each of the tick's reads (the source's, a policy's replica count, a warm start): past it,
        that read is this tick's error, so nothing a read fails to bound holds the loop for every policy."""
        self.scale_timeout_s = scale_timeout_s
        """A backstop on each scale (None: the actuator's own bounds): the Kubernetes client bounds each socket read,
        not an answer, so an API server that trickles one would hold that decision (and the tick) for ever."""
        self.shutdown_grace_s = shutdown_grace_s
        """A shutdown lets the actions of a tick finish for this long at most (see ``_act``)."""
        self.decisions_keep = decisions_keep
        self.decision_log = DecisionLogWriter(store, metrics)
        self.history = history
        """Load history for the forecasters: recorded, persisted, warm-started (None: kept in memory only)."""
        self.rebalancer = rebalancer
        """Expert rebalancing of engines that expose the placement API (None: off)."""
        self.store, self.source, self.actuator, self.core, self.metrics = store, source, actuator, core, metrics
        self.elector: LeaderElector = elector or AlwaysLeader()
        self.tick_interval_s, self.stale_after_s = tick_interval_s, stale_after_s
        self.static_endpoints = {k: tuple(v) for k, v in (static_endpoints or {}).items()}
        self.clock, self.wall_clock = clock, wall_clock
        self._runtime: dict[str, PolicyRuntime] = {}
        self._creations = Creations()
        self._managed: set[str] = set()
        """The policies whose targets the actuator managed at the last listing."""
        self._last_tick_at: datetime | None = None
        self._started_at: datetime | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False  # set by stop(): no tick starts after it, whatever became of its cancellation
        self.ticks = 0

    # ---- what the API reads ----------------------------------------------
    @property
    def is_leader(self) -> bool:
        return self.elector.is_leader

    def _still_leading(self) -> bool:
        """Asked by the actuators right before each change (from their worker threads too)."""
        return self.elector.is_leader

    @property
    def last_tick_at(self) -> datetime | None:
        return self._last_tick_at

    @property
    def started_at(self) -> datetime | None:
        """When :meth:`start` ran: ``tick_overdue`` counts from it until a tick succeeds (a first tick can hang)."""
        return self._started_at

    def runtime(self, name: str) -> PolicyRuntime | None:
        return self._runtime.get(name)

    def check_target(self, policy: Policy) -> list[str]:
        return self.actuator.check(policy)

    def endpoints_for(self, policy: Policy) -> list[str]:
        """Engine base URLs to scrape for a policy: configured, named by the target, started by us."""
        found = list(self.static_endpoints.get(policy.model_name, ()))
        if isinstance(policy.target, LocalTarget):
            found.extend(policy.target.endpoints)
        found.extend(self.actuator.endpoints(policy))
        return list(dict.fromkeys(found))

    # ---- one tick --------------------------------------------------------
    async def tick(self) -> Effects | None:
        """Evaluate every policy once; returns the core's effects (None when the store was unreadable)."""
        started_s = self.clock()
        self.metrics.set_leader(self.is_leader)
        try:
            listing = await asyncio.to_thread(self.store.read_policies)
        except MoesloError as exc:
            log.warning("tick skipped: %s", exc)
            self.metrics.error("store")
            return None
        stored = listing.readable
        by_name = {s.policy.name: s for s in stored}
        listed = {name: entry.created_at for name, entry in by_name.items()}
        for gone in self._creations.gone(listed, {u.name for u in listing.unreadable}, known=self._runtime):
            await self._forget(gone)
        await self._release_unmanaged(stored)
        policies = [s.policy for s in stored]
        if self.history is not None:
            try:  # the policies it did not reach start without their history (LoadHistoryKeeper._cut_off)
                await within(self.history.warm_start(self.core, stored), self.read_timeout_s, "warm start")
            except LateAnswerError as exc:
                log.warning("%s", exc)
        now_s = self.clock()
        observations = await self._observe(policies, now_s)
        counted = await asyncio.gather(*(self._with_replicas(p, observations.get(p.name), now_s) for p in policies))
        observations = {obs.policy: obs for obs in counted}
        if self.history is not None:
            self.history.record(observations)
        tick_input = TickInput(now_s=now_s, policies={p.name: p for p in policies}, observations=observations)
        effects = await asyncio.to_thread(self.core.tick, tick_input)  # off the loop, as the refits below
        leader = self.is_leader
        await run_to_end(self._act(tick_input, effects, by_name, leader), grace_s=self.shutdown_grace_s)
        if self.history is not None:
            await self.history.after_tick(leader=leader, policies=[*by_name, *(u.name for u in listing.unreadable)])
        self._last_tick_at = self.wall_clock()
        self.ticks += 1
        if leader and self.ticks % PRUNE_EVERY_TICKS == 0:
            await self.decision_log.prune(self.decisions_keep)
        decided_s = self.clock()
        self.metrics.observe_evaluation(decided_s - started_s)
        # The refits (~100 ms with long histories) once the decisions are logged, in a worker thread as the tick:
        # on the loop they held API reads and scrapes.  Only a tick touches the core, so it needs no lock.
        await asyncio.to_thread(self.core.refit)
        self.metrics.observe_refits(self.clock() - decided_s)
        return effects

    async def _forget(self, name: str) -> None:
        """A policy deleted, or created again under its name: the core's and advisors' state, the runtime, the
        metrics, the load and rebalancer histories go, and what the actuator started stops (it holds CPUs)."""
        self._runtime.pop(name, None)
        self.core.forget(name)
        self.metrics.forget_policy(name)
        for history in (self.history, self.rebalancer):
            if history is not None:
                history.forget(name)
        self._managed.discard(name)
        await self._release(name, "deleted")

    async def _release_unmanaged(self, stored: Sequence[StoredPolicy]) -> None:
        """A policy whose target was switched to one the actuator does not manage (a read-only ``model``, a
        Deployment under the local actuator): what the actuator started for it stops (it would hold CPUs)."""
        managed = {entry.policy.name for entry in stored if self.actuator.manages(entry.policy)}
        for entry in stored:
            if entry.policy.name in self._managed - managed:
                await self._release(entry.policy.name, f"now targets a {entry.policy.target.kind!r}")
        self._managed = managed

    async def _release(self, name: str, why: str) -> None:
        try:
            await self.actuator.release(name)
        except ActuationError as exc:
            log.warning("policy %r %s, but releasing what it ran failed: %s", name, why, exc)

    async def _act(self, tick: TickInput, effects: Effects, by_name: Mapping[str, StoredPolicy], leader: bool) -> None:
        """Carry out the decisions, rebalance and log every outcome.  A shutdown (SIGTERM) meanwhile lets this run on
        for ``shutdown_grace_s``: an action cut off in its await may be applied all the same (the scale request sent),
        and must reach the log.  What the grace cuts short is logged ``interrupted``, with what finished."""
        records: list[DecisionRecord] = []
        try:
            await self._carry_out_all(tick, effects, by_name, leader, records)
            if leader and self.rebalancer is not None:
                await self._rebalance(list(by_name.values()), tick.now_s, records)
        finally:  # records a failed write kept are written even by a replica that has lost the lease since
            if (leader and records) or self.decision_log.pending:
                await run_to_end(self.decision_log.append(records if leader else ()))

    async def _carry_out_all(
        self, tick: TickInput, effects: Effects, by_name: Mapping[str, StoredPolicy], leader: bool,
        records: list[DecisionRecord],
    ) -> None:
        """Carry out the decisions (at once: one workload whose API server stalls must not hold the others') and
        add their records; cancelled, it cuts the actions still running short and records them as such."""
        decisions = effects.decisions
        carrying = [asyncio.ensure_future(self._carry_out(by_name[d.policy].policy, d, leader)) for d in decisions]
        cut_short = False
        try:
            if carrying:
                await asyncio.wait(carrying)
        except asyncio.CancelledError:  # the shutdown grace ran out
            cut_short = True
            for task in carrying:
                task.cancel()
            await asyncio.wait(carrying)
        interrupted = (INTERRUPTED, interrupted_detail(self.shutdown_grace_s))
        outcomes = [interrupted if task.cancelled() else task.result() for task in carrying]
        # Records, status and gauges (~10 ms for 100 policies) in a worker thread, as the tick: on the loop they held
        # API reads and scrapes.  Run to its end even when cancelled: a decision carried out keeps its record.
        await run_to_end(asyncio.to_thread(self._settle, tick, outcomes, effects, by_name, records))
        if cut_short:
            raise asyncio.CancelledError

    def _settle(self, tick: TickInput, outcomes: Sequence[tuple[str, str]], effects: Effects,
                by_name: Mapping[str, StoredPolicy], records: list[DecisionRecord]) -> None:  # fmt: skip
        """Each decision's record (added to ``records``), runtime and gauges, from what carrying it out gave."""
        for decision, (outcome, detail) in zip(effects.decisions, outcomes, strict=True):
            entry, obs = by_name[decision.policy], tick.observations.get(decision.policy)
            if outcome in ("failed", "standby", INTERRUPTED):
                self.core.not_carried_out(decision.policy)
            records.append(self._record(entry, decision, outcome, detail))
            self._update_runtime(entry.policy, obs, decision, tick.now_s, (outcome, detail))

    async def _observe(self, policies: Sequence[Policy], now_s: float) -> dict[str, PolicyObservation]:
        component = "prometheus" if type(self.source).__name__.startswith("Prometheus") else "scrape"
        try:
            observations = await within(self.source.observe(policies, now_s), self.read_timeout_s,
                                        f"{component} source")  # fmt: skip
        except UnavailableError as exc:
            self.metrics.error(component)
            return {p.name: PolicyObservation(policy=p.name, observed_at_s=now_s, errors=(str(exc),)) for p in policies}
        if any(obs.errors for obs in observations.values()):
            self.metrics.error(component)
        return observations

    async def _with_replicas(self, policy: Policy, obs: PolicyObservation | None, now_s: float) -> PolicyObservation:
        base = obs or PolicyObservation(policy=policy.name, observed_at_s=now_s, errors=("no observation",))
        budget = self.actuator.replica_budget  # read after the count: a broken replica it found holds its CPUs
        if not self.actuator.manages(policy):  # a read-only target: the engines the source saw are the fleet
            return replace(base, current_replicas=base.ready_replicas, replica_budget=budget(policy))
        if isinstance(self.actuator, DryRunActuator):  # it reads no fleet: its count starts from the one observed
            self.actuator.seed(policy.name, base.ready_replicas)
        try:
            count = await within(self.actuator.replicas(policy), self.read_timeout_s,
                                 f"{self.actuator.name} replica count")  # fmt: skip
        except Exception as exc:  # an unexpected one too (a bug, an answer of the wrong shape): this policy's fault
            if not isinstance(exc, ActuationError | LateAnswerError):
                log.exception("reading %s's replica count failed", policy.name)
            self.metrics.error("actuator")
            return replace(base, current_replicas=None, replica_budget=budget(policy),
                           errors=(*base.errors, fault_text(exc)))  # fmt: skip
        ready = count.ready if count.ready is not None else base.ready_replicas
        return replace(base, current_replicas=count.desired, ready_replicas=ready, replica_budget=budget(policy))

    async def _carry_out(self, policy: Policy, decision: Decision, leader: bool) -> tuple[str, str]:
        """(outcome, extra detail) of one decision."""
        if decision.action == "hold":
            return "held", ""
        if not decision.apply or policy.mode != Mode.ENFORCE:
            return "advisory", ""
        if not leader:
            return "standby", "not the leader: another replica acts"
        if not self.is_leader:  # read afresh: an earlier decision's actuation may have outlived the lease
            return "standby", "the lease was lost during this tick: another replica acts"
        assert decision.desired_replicas is not None
        given_up = threading.Event()  # past the backstop, the actuator's thread (still running) writes no more

        def still_leading() -> bool:
            return not given_up.is_set() and self._still_leading()

        scale = self.actuator.scale(policy, decision.desired_replicas, still_leading=still_leading,
                                    expected=decision.current_replicas)  # fmt: skip
        try:
            result = await within(scale, self.scale_timeout_s, f"{self.actuator.name} scale")
        except LeadershipLostError as exc:  # its retries outlived the lease: the new leader acts
            return "standby", str(exc)
        except LateAnswerError as exc:
            given_up.set()
            self.metrics.error("actuator")
            log.warning("scaling %s to %s failed: %s", policy.name, decision.desired_replicas, exc)
            return "failed", f"{exc}: the write may have landed (the next tick reads the count afresh)"
        except ActuationError as exc:
            self.metrics.error("actuator")
            log.warning("scaling %s to %s failed: %s", policy.name, decision.desired_replicas, exc)
            return "failed", str(exc)
        except Exception as exc:  # not the tick's: the other policies' scales were applied and must be logged
            self.metrics.error("actuator")
            log.exception("scaling %s to %s failed", policy.name, decision.desired_replicas)
            return "failed", fault_text(exc)
        attempts = f"{result.attempts} attempt(s)"
        return "applied", f"{self.actuator.name}: {result.previous} -> {result.replicas} in {attempts}"

    async def _rebalance(self, stored: Sequence[StoredPolicy], now_s: float, records: list[DecisionRecord]) -> None:
        """Expert rebalancing per policy; each applied, advisory, failed, verified or interrupted step is logged."""
        assert self.rebalancer is not None
        for entry in stored:
            if not self.is_leader:  # the lease was lost during this tick: the new leader rebalances
                return
            try:
                events = await self.rebalancer.tick(entry.policy, self.endpoints_for(entry.policy), now_s,
                                                    still_leading=self._still_leading)  # fmt: skip
            except MoesloError as exc:
                log.warning("rebalancing %s failed: %s", entry.policy.name, exc)
                self.metrics.error("actuator")
                continue
            except asyncio.CancelledError:  # the shutdown grace ran out: its steps so far, and an apply cut short
                events, cut_short = self.rebalancer.take_unreported(), True
            else:
                cut_short = False
            for event in events:
                self.metrics.record_rebalance(entry.policy.name, event.outcome)
                records.append(rebalance_record(entry, event, self.wall_clock(), now_s))
            if cut_short:
                raise asyncio.CancelledError

    def _record(self, entry: StoredPolicy, decision: Decision, outcome: str, detail: str) -> DecisionRecord:
        self.metrics.record_decision(entry.policy.name, action=decision.action, reason=logged_reason(decision),
                                     desired=decision.desired_replicas, current=decision.current_replicas)  # fmt: skip
        return decision_record(entry, decision, outcome, detail, self.wall_clock())

    def _update_runtime(
        self, policy: Policy, obs: PolicyObservation | None, decision: Decision, now_s: float,
        carried_out: tuple[str, str],
    ) -> None:
        """``carried_out``: the decision's (outcome, the actuator's word), shown with it (a failed scale is news)."""
        # A new one, swapped in whole at the end: this runs in a worker thread while the API reads the last one.
        runtime = PolicyRuntime()
        runtime.current_replicas = decision.current_replicas
        runtime.desired_replicas = decision.desired_replicas
        runtime.errors = list(obs.errors) if obs is not None else ["no observation"]
        self._update_forecast(policy, obs, decision, runtime)
        runtime.decision = {"action": decision.action, "reasons": list(decision.reasons), "detail": decision.detail,
                            "outcome": carried_out[0], "actuation": carried_out[1]}
        sli = obs.sli if obs is not None else None
        age_s = None if obs is None else now_s - obs.observed_at_s
        # Stale: nothing observed, too old, or the source failed and only held (older) values are left.
        runtime.stale = (
            obs is None
            or (age_s is not None and age_s > self.stale_after_s)
            or (bool(obs.errors) and (sli is None or (age_s is not None and age_s > 0)))
        )
        if obs is not None:
            runtime.observed_at = self.wall_clock() - timedelta(seconds=age_s or 0.0)
        runtime.sli = sli_view(obs)
        self.metrics.set_slis(policy.name, {k: v for k, v in runtime.sli.items() if k != "requests_in_window"})
        report_budgets(runtime, self.metrics, policy, sli)
        self._runtime[policy.name] = runtime

    def _update_forecast(self, policy: Policy, obs: PolicyObservation | None, decision: Decision,
                         runtime: PolicyRuntime) -> None:  # fmt: skip
        """What the core saw and forecast, for /v1/status and the forecast gauges."""
        report_forecast(runtime, self.metrics, policy.name, obs, decision, tick_interval_s=self.tick_interval_s)
        if self.history is not None and policy.name in self.history.warmed:
            origin, ticks = self.history.warmed[policy.name]
            runtime.seen["history_warm_start"] = f"{ticks} ticks from the {origin}" if ticks else "none"

    # ---- lifecycle ---------------------------------------------------------
    def restore_state(self) -> None:
        """Carry the scale-down cooldown over a restart: the last applied change per policy."""
        now_s, now_wall = self.clock(), self.wall_clock()
        for stored in self.store.list_policies():
            for record in self.store.list_decisions(policy=stored.policy.name, limit=50):
                if record.outcome == "applied":
                    age_s = max(0.0, (now_wall - record.at).total_seconds())
                    self.core.record_change(stored.policy.name, now_s - age_s)
                    break

    async def run(self) -> None:
        """Tick every ``tick_interval_s`` until cancelled or stopped; an unexpected error never ends the loop."""
        while not self._stopping:
            started_s = self.clock()
            try:
                await self.tick()
            except Exception:
                log.exception("controller tick failed")
            elapsed_s = self.clock() - started_s
            await asyncio.sleep(max(0.0, self.tick_interval_s - elapsed_s))

    async def start(self) -> None:
        self._started_at = self.wall_clock()
        await self.elector.start()
        try:
            await asyncio.to_thread(self.restore_state)
        except MoesloError as exc:
            log.warning("could not restore the core's state: %s", exc)
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self.run(), name="controller-ticks")

    async def stop(self) -> None:
        task, self._task, self._stopping = self._task, None, True
        if task is not None:
            # Cancelled again until it ends: on Python 3.11 ``asyncio.wait_for`` (``within``) returns an await that
            # ends as it is cancelled and drops the cancellation, and the loop ticked on with stop() waiting for ever.
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=0.1)
        await self.decision_log.append()  # once more, what failed writes left
        await self.elector.stop()
        await self.actuator.aclose()
        await self.source.aclose()
        if self.rebalancer is not None:
            await self.rebalancer.aclose()


def build_service(settings: ControllerSettings, store: Store, registry: CollectorRegistry) -> ControllerService:
    """The service the configuration describes: source, actuator, elector, core and metrics."""
    # Imported here: the kubernetes client and the rebalancer's numerics take seconds to import.
    from controller.actuators import api_client, build_actuator
    from controller.actuators.vllm_control import build_rebalancer
    from controller.builder import CoreOptions, build_decision_core
    from controller.capacity import DEFAULT_PROFILE, ReplicaProfile
    from controller.forecast.history import TWO_WEEKS_S
    from controller.leader import LeaseElector
    from controller.load_history import LoadHistoryKeeper

    actuator = build_actuator(settings)
    metrics = ControllerMetrics(registry)
    service_ref: list[ControllerService] = []

    def endpoints_for(policy: Policy) -> list[str]:
        return service_ref[0].endpoints_for(policy)

    source, client = configured_source(settings, endpoints_for)
    elector: LeaderElector
    if settings.leader_election.enabled:
        elector = LeaseElector(api_client(settings.kubernetes), settings.leader_election)
    else:
        if not settings.embedded:
            log.warning("leader election is off with a shared database: run one controller replica only")
        elector = AlwaysLeader()
    profile = DEFAULT_PROFILE if settings.profile is None else ReplicaProfile.load(settings.profile)
    core = build_decision_core(
        CoreOptions(tick_interval_s=settings.tick_interval_s, stale_after_s=settings.stale_after_s, profile=profile,
                    rate_window_s=settings.rate_window_s, history_keep_s=max(settings.forecast_history_s, TWO_WEEKS_S))
    )
    history = LoadHistoryKeeper(
        store, bin_s=settings.tick_interval_s, keep_s=settings.forecast_history_s, prometheus=client,
        selector=settings.prometheus_selector, rate_window_s=settings.rate_window_s,
    )
    service = ControllerService(
        store=store, source=source, actuator=actuator, core=core, metrics=metrics, elector=elector,
        tick_interval_s=settings.tick_interval_s, stale_after_s=settings.stale_after_s,
        static_endpoints=settings.scrape_endpoints, decisions_keep=settings.decisions_keep,
        rebalancer=build_rebalancer(settings), history=history, shutdown_grace_s=settings.shutdown_grace_s,
        read_timeout_s=settings.read_backstop_s, scale_timeout_s=settings.scale_backstop_s,
    )  # fmt: skip
    service_ref.append(service)
    return service

