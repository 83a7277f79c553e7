"""The placement actuator: live expert rebalancing (reads engines' routing windows, plans, decides, applies, verifies).

The decisions are pure (``controller.rebalance``: ``plan_rebalance``,
``decide_rebalance``, ``verify_rebalance``); this module does the I/O around
them through :class:`EngineControl` (the engine's ``GET /v1/expert-load`` and
``POST /v1/placement``), keeps the per-engine history the trigger needs, and
returns every step as a :class:`RebalanceEvent` for the decision log.

Each engine also keeps a bounded history of its expert-load windows
(:class:`~controller.rebalance.history.LoadHistory`): plans are made against all
of them (each cut, by the engine's cumulative counts, to what was routed after the
previous one; a new engine borrows a sibling's), and the trigger judges the gain a plan
made without the latest window shows on that window; verification expects that prediction.

Only the leader rebalances: ``still_leading`` is asked before each engine and
again right before an apply (the read and the plan take a while), and once it
says False the tick stops there, leaving the engines to the new leader.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import numpy as np
import numpy.typing as npt

from contracts.errors import MoesloError, PlacementError, UnavailableError
from contracts.imbalance import pooled_rank_dispersion, rank_load, sampling_noise_cv
from contracts.placement import Placement
from controller.actuators.base import StillLeading, always_leading
from controller.actuators.rebalance_events import RebalanceEvent
from controller.errors import CommitUnconfirmedError, EngineRefusalError, malformed_answer
from controller.policy import ImbalanceObjective, Mode, Policy
from controller.rebalance import (
    CvObservation,
    RebalanceDecision,
    RebalancePlan,
    TriggerSettings,
    decide_rebalance,
    verify_rebalance,
)
from controller.rebalance.history import LoadHistory, plan_from_history
from controller.rebalance.out_of_sample import HeldOutGain
from controller.sources.base import within

log = logging.getLogger(__name__)

APPLY_CUT_SHORT = "a shutdown cut the apply short: whether the engine took the placement is unknown"
FORGET_UNLISTED_WINDOWS = 10
"""An engine no longer listed is forgotten once it was last read this many history windows ago."""
VERIFY_PATIENCE = 10
"""A rebalance whose window stays too small to judge is given up on (``unverified``) after this many
verification delays."""


@dataclass(frozen=True, slots=True)
class ExpertLoadSnapshot:
    """An engine's routing window and current placement."""

    expert_tokens: npt.NDArray[np.int64]
    """(MoE layers, experts) routed tokens in the window."""
    imbalance_cv: tuple[float, ...]
    steps_in_window: int
    placement: Placement
    expert_tokens_total: npt.NDArray[np.int64] | None = None
    """(MoE layers, experts) routed tokens since the engine started (None: not reported)."""


def snapshot_problem(snap: ExpertLoadSnapshot) -> str | None:
    """What disagrees between a snapshot's parts (None: they agree); the rebalancer's arithmetic assumes they do."""
    tokens, placement = snap.expert_tokens, snap.placement
    if tokens.ndim != 2:
        return f"its routed tokens are not a layers x experts matrix (shape {tokens.shape})"
    layers, experts = tokens.shape
    if layers != placement.num_layers:
        return f"it counts {layers} layers of routed tokens but its placement has {placement.num_layers}"
    if len(snap.imbalance_cv) != layers:
        return f"it reports the CV of {len(snap.imbalance_cv)} layers but counts {layers}"
    named = placement.phy2log
    if named.size and (int(named.min()) < 0 or int(named.max()) >= experts):
        outside = int(named.max()) if int(named.max()) >= experts else int(named.min())
        return f"its placement names expert {outside} but it counts {experts} experts"
    total = snap.expert_tokens_total
    if total is not None and total.shape != tokens.shape:
        return f"its token totals are {total.shape}, its window {tokens.shape}"
    return None


def checked(source: str, snap: ExpertLoadSnapshot, hint: str = "") -> ExpertLoadSnapshot:
    """``snap`` if its parts agree, else ``source`` is unavailable, the mismatch named (``hint`` added)."""
    problem = snapshot_problem(snap)
    if problem is not None:
        raise UnavailableError(f"{source}: {problem}{hint}")
    return snap


def engine_placement(source: str, raw: Any) -> Placement:
    """An engine's placement document; one that does not parse is ``source``'s malformed answer."""
    try:
        return Placement.from_json(raw)
    except PlacementError as exc:
        raise UnavailableError(f"{source}: malformed answer (placement: {exc})") from exc


class EngineControl(Protocol):
    """The engine control API the rebalancer needs."""

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot: ...

    async def apply_placement(self, endpoint: str, placement: Placement) -> dict[str, Any]: ...


def error_text(response: httpx.Response) -> str:
    """``HTTP status: reason: message`` from the engines' ``{"error": ...}`` document, else the raw text."""
    try:
        body = response.json()["error"]
        reason = f"{body['reason']}: " if body.get("reason") else ""
        return f"HTTP {response.status_code}: {reason}{body['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:300]}"


def totals(body: dict[str, Any]) -> npt.NDArray[np.int64] | None:
    """The engine's cumulative ``expert_tokens_total`` (absent from older engines: None)."""
    raw = body.get("expert_tokens_total")
    return None if raw is None else np.asarray(raw, dtype=np.int64)


class JsonHttpControl:
    """An engine's JSON API over one shared client; failures become :class:`UnavailableError`."""

    def __init__(self, client: httpx.AsyncClient | None = None, timeout_s: float = 10.0) -> None:
        self._client = client or httpx.AsyncClient(timeout=timeout_s)

    async def _call(self, method: str, url: str, **kwargs: Any) -> Any:
        timeout_s = kwargs.get("timeout", self._client.timeout.read)  # the whole answer's, not only each read's
        try:
            response = await within(self._client.request(method, url, **kwargs), timeout_s, f"{method} {url}")
        except httpx.HTTPError as exc:
            raise UnavailableError(f"{method} {url}: {exc!r}") from exc
        if response.status_code >= 400:
            raise EngineRefusalError(f"{method} {url}: {error_text(response)}", status=response.status_code)
        try:
            return response.json()
        except ValueError as exc:  # a proxy's login page, another server on the port: this engine's fault alone
            raise UnavailableError(f"{method} {url}: not JSON ({exc})") from exc

    async def aclose(self) -> None:
        await self._client.aclose()


class HttpEngineControl(JsonHttpControl):
    """:class:`EngineControl` over the embedded engine's HTTP API."""

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        load = await self._call("GET", f"{endpoint}/v1/expert-load")
        placement = engine_placement(endpoint, await self._call("GET", f"{endpoint}/v1/placement"))
        with malformed_answer(endpoint):
            return checked(endpoint, ExpertLoadSnapshot(
                expert_tokens=np.asarray(load["expert_tokens"], dtype=np.int64),
                imbalance_cv=tuple(float(x) for x in load["imbalance_cv"]),
                steps_in_window=int(load["steps_in_window"]),
                placement=placement,
                expert_tokens_total=totals(load),
            ))

    async def apply_placement(self, endpoint: str, placement: Placement) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "POST", f"{endpoint}/v1/placement", json=placement.to_json(), timeout=300.0
        )
        return result


@dataclass(slots=True)
class _EngineState:
    history: deque[CvObservation] = field(default_factory=lambda: deque(maxlen=4096))
    loads: LoadHistory = field(default_factory=LoadHistory)
    last_rebalance_s: float | None = None
    pending: RebalancePlan | None = None
    pending_cv: npt.NDArray[np.float64] | None = None
    """The applied plan's out-of-sample CV per layer (None: its in-sample prediction)."""
    lent_windows: list[npt.NDArray[np.float64]] = field(default_factory=list)
    """Another engine's windows the pending plan was made from (:meth:`Rebalancer._planning_windows`)."""
    pending_summary: dict[str, Any] | None = None
    """The applied step's plan summary, held-out pair included: its verification shows what it was judged on."""
    applied_at_s: float = 0.0
    listed_at_s: float = -math.inf
    """When a tick last listed the engine (:meth:`Rebalancer._drop_unlisted` forgets it some windows after)."""
    unavailable: str | None = None
    """Why the latest read of the engine failed (None: it succeeded), logged when it changes."""
    shape: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
    """(counts' shape, placement's shape, ranks) of the engine's snapshots: another shape is another model."""


def _plan_summary(plan: RebalancePlan) -> dict[str, Any]:
    active = plan.active
    return {
        "imbalance_before_cv": float(plan.imbalance_before.cv[active].max()) if active.any() else 0.0,
        "imbalance_after_cv": float(plan.imbalance_after.cv[active].max()) if active.any() else 0.0,
        "moves": plan.total_moves,
    }


def _timed_plan(windows: list[npt.NDArray[np.float64]], placement: Placement) -> tuple[
        RebalancePlan, HeldOutGain | None, float]:  # fmt: skip
    """:func:`plan_from_history` and its time in ms (in the worker thread: compute, not the wait for it)."""
    started = time.perf_counter()
    plan, held_out = plan_from_history(windows, placement)
    return plan, held_out, 1000 * (time.perf_counter() - started)


class Rebalancer:
    """Per policy and engine: observe the CV, plan, decide with the pure trigger, apply, verify."""

    def __init__(
        self,
        control: EngineControl,
        settings: TriggerSettings | None = None,
        *,
        verify_after_s: float = 30.0,
        min_window_steps: int = 16,
        history_windows: int = 8,
        window_every_s: float = 30.0,
        min_windows: int = 1,
    ) -> None:
        self.control = control
        self.settings = settings or TriggerSettings()
        self.verify_after_s = verify_after_s
        """Routing steps must accumulate under the new placement before its CV means anything."""
        self.min_window_steps = min_window_steps
        self.history_windows = history_windows
        """Expert-load windows kept per engine and planned against (1: the latest window alone)."""
        self.window_every_s = window_every_s
        """A new history window starts this long after the last one (the newest is refreshed meanwhile)."""
        self.min_windows = max(1, min(min_windows, history_windows))
        """Windows seen before the first plan (2: every plan comes with a held-out prediction)."""
        self._state: dict[tuple[str, str], _EngineState] = {}
        self._unreported: list[RebalanceEvent] = []
        """The steps of a tick that a cancellation (a shutdown) cut short: those it finished, and an apply it cut."""
        self._listed: dict[str, tuple[str, ...]] = {}  # per policy, the engines its last tick listed
        self._planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moeslo-planner")
        """Plans run on this one thread: off the event loop, and one malloc arena keeps what the planning commands'
        allocator setting (:mod:`controller.rebalance.allocator`) lets it keep, not one per pool thread."""

    def state(self, policy: str, endpoint: str) -> _EngineState:
        key = (policy, endpoint)
        if key not in self._state:
            self._state[key] = _EngineState(loads=LoadHistory(self.history_windows, self.window_every_s))
        return self._state[key]

    def forget(self, policy: str) -> None:
        """A policy deleted (or created again under its name): its engines' histories and pending plans go."""
        self._listed.pop(policy, None)
        for key in [key for key in self._state if key[0] == policy]:
            del self._state[key]

    async def aclose(self) -> None:
        self._planner.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.control, "aclose", None)
        if close is not None:
            await close()

    async def tick(
        self, policy: Policy, endpoints: list[str], now_s: float, *, still_leading: StillLeading = always_leading
    ) -> list[RebalanceEvent]:
        """This policy's steps on its engines, while ``still_leading``; cancelled, the steps it finished, and an
        apply it cut short, wait in :meth:`take_unreported`."""
        if policy.mode is Mode.OFF:
            return []
        self._listed[policy.name] = tuple(endpoints)
        for endpoint in endpoints:
            self.state(policy.name, endpoint).listed_at_s = now_s
        self._drop_unlisted(policy.name, now_s)
        events: list[RebalanceEvent] = []
        try:
            for endpoint in endpoints:
                if not still_leading():
                    log.info("rebalancer: the lease was lost: %s's engines are left to the new leader", policy.name)
                    break
                event = await self._guarded_tick(policy, endpoint, now_s, still_leading)
                if event is not None:
                    events.append(event)
        except asyncio.CancelledError:
            self._unreported[:0] = events
            raise
        return events

    async def _guarded_tick(
        self, policy: Policy, endpoint: str, now_s: float, still_leading: StillLeading
    ) -> RebalanceEvent | None:
        """One engine's step; its error is logged and skipped, so the policy's other engines still rebalance and the
        steps taken on them this tick are reported (one raising used to lose them all)."""
        try:
            return await self._tick_engine(policy, endpoint, now_s, still_leading)
        except MoesloError as exc:
            log.warning("rebalancer: %s on %s: %s", policy.name, endpoint, exc)
        except Exception:  # a fault on one engine's data must not stop the others'
            log.exception("rebalancer: %s on %s failed; its other engines go on", policy.name, endpoint)
        return None

    def _drop_unlisted(self, policy: str, now_s: float) -> None:
        """Forget the engines the policy has not listed for ``FORGET_UNLISTED_WINDOWS`` windows (replicas scaled
        away: each new pod address would otherwise keep its windows for good).  Counted from when it was last
        listed, not last read: an idle engine briefly unlisted keeps its plan awaiting verification."""
        horizon = FORGET_UNLISTED_WINDOWS * self.window_every_s
        for key, state in list(self._state.items()):
            if key[0] == policy and now_s - state.listed_at_s > horizon:
                if state.pending is not None:
                    log.info("rebalancer: %s left %s's engines with its plan unverified", key[1], policy)
                del self._state[key]

    def take_unreported(self) -> list[RebalanceEvent]:
        """The steps of a tick a cancellation cut short, for the decision log (once)."""
        events, self._unreported = self._unreported, []
        return events

    def _verify(
        self, policy: Policy, endpoint: str, state: _EngineState, snap: ExpertLoadSnapshot,
        assignments: npt.NDArray[np.int64], now_s: float,
    ) -> RebalanceEvent | None:
        """Judge the pending plan on the window measured since it was applied (None: too few tokens yet)."""
        applied = state.pending
        assert applied is not None
        # The windows seen before and since the swap, as the new placement splits them: how far the
        # ranks' shares wander between windows beyond what independent draws explain.
        dispersion = pooled_rank_dispersion([state.lent_windows, state.loads.windows()], applied.placement.phy2log,
                                            applied.placement.num_ranks)  # each engine's windows tested apart
        result = verify_rebalance(
            plan=applied, measured_cv=snap.imbalance_cv, objective=policy.objectives.imbalance,
            assignments=assignments, predicted_cv=state.pending_cv, dispersion=dispersion,
            placement_in_use=snap.placement,
        )
        waited_s = now_s - state.applied_at_s
        if result.reason == "insufficient_traffic" and waited_s < VERIFY_PATIENCE * self.verify_after_s:
            return None  # too few routed tokens yet to tell: measure again next tick
        state.pending = None
        return RebalanceEvent(
            policy=policy.name,
            endpoint=endpoint,
            kind="verify",
            outcome="verified" if result.ok else "unverified",
            decision=None,
            plan=state.pending_summary or _plan_summary(applied),
            verify=result,
        )

    def _same_model(self, policy: str, endpoint: str, snap: ExpertLoadSnapshot) -> _EngineState:
        """The engine's state; afresh when its snapshots changed shape: the endpoint now serves another model
        (a restart), and its history and a plan awaiting verification belong to the one before (judged on
        this one, they broke every tick)."""
        state = self.state(policy, endpoint)
        shape = (snap.expert_tokens.shape, snap.placement.phy2log.shape, snap.placement.num_ranks)
        if state.shape is not None and state.shape != shape:
            log.warning("rebalancer: %s now serves another shape (%s, was %s): its history starts afresh",
                        endpoint, shape, state.shape)  # fmt: skip
            listed_at_s = self._state.pop((policy, endpoint)).listed_at_s
            state = self.state(policy, endpoint)
            state.listed_at_s = listed_at_s
        state.shape = shape
        return state

    async def _tick_engine(
        self, policy: Policy, endpoint: str, now_s: float, still_leading: StillLeading
    ) -> RebalanceEvent | None:
        state = self.state(policy.name, endpoint)
        objective = policy.objectives.imbalance
        try:
            snap = await self.control.expert_load(endpoint)
        except UnavailableError as exc:  # nothing to decide here; the scaling side reports stale data
            if state.unavailable != str(exc):  # once per reason: a mismatch in its snapshot stays until fixed
                log.warning("rebalancer: %s is not rebalanced: %s", endpoint, exc)
            state.unavailable = str(exc)
            return None
        state.unavailable = None
        state = self._same_model(policy.name, endpoint, snap)
        if snap.steps_in_window < self.min_window_steps:
            return None
        assignments = snap.expert_tokens.sum(axis=1)
        placement = snap.placement
        noise = sampling_noise_cv(
            assignments, placement.num_ranks, rank_load(placement.phy2log, snap.expert_tokens.astype(float),
                                                        placement.num_ranks)
        )
        state.history.append(CvObservation.of(now_s, snap.imbalance_cv, noise))
        state.loads.observe(now_s, snap.expert_tokens, snap.expert_tokens_total)
        if state.pending is not None and now_s - state.applied_at_s >= self.verify_after_s:
            return self._verify(policy, endpoint, state, snap, assignments, now_s)
        if state.pending is not None:
            return None
        windows, lender = self._planning_windows(policy.name, endpoint, state, now_s)
        decision, plan, held_out, plan_ms = await self._decide(objective, state, windows, snap.placement, now_s)
        if decision.action != "rebalance" or plan is None:
            return None
        if not still_leading():  # lost while it read and planned: the new leader decides afresh
            return None
        state.last_rebalance_s = now_s
        summary = _plan_summary(plan) | {"plan_ms": plan_ms, "windows": len(windows)}
        if lender is not None:
            summary["windows_from"] = lender
        if held_out is not None:
            summary["held_out"] = {"worst_cv_before": held_out.worst_before, "worst_cv_after": held_out.worst_after}
        step = functools.partial(
            RebalanceEvent, policy=policy.name, endpoint=endpoint, kind="rebalance", decision=decision, plan=summary
        )
        if policy.mode is Mode.ADVISORY:
            return step(outcome="advisory")
        event = await self._apply(endpoint, plan, held_out, state, now_s, step)
        state.lent_windows = windows[:-1] if lender is not None and event.outcome == "applied" else []
        return event

    def _planning_windows(
        self, policy: str, endpoint: str, state: _EngineState, now_s: float
    ) -> tuple[list[npt.NDArray[np.float64]], str | None]:
        """The windows to plan from, and the engine lending some where not all are this one's.  With under
        ``min_windows`` of its own (a replica just added, often for a peak) an engine plans on the history of the
        listed engine of its shape with the most, read within a window's time, and its own newest window: that
        one is held out, so the trigger judges the plan on this engine's own routing (where the entry splits
        traffic by prefix, the mixes differ), and verification measures it there too."""
        own = state.loads.windows()
        if len(own) >= self.min_windows or not own:
            return own, None
        listed = self._listed.get(policy, ())  # not an engine scaled away since: its windows grow old
        lenders = [(len(other.loads), other_endpoint) for (name, other_endpoint), other in self._state.items()
                   if name == policy and other_endpoint != endpoint and other_endpoint in listed
                   and other.shape == state.shape and other.unavailable is None
                   and now_s - other.loads.last_reading_s <= self.window_every_s
                   and len(other.loads) >= self.min_windows]  # fmt: skip
        if not lenders:
            return own, None
        lender = max(lenders)[1]
        lent = self._state[(policy, lender)].loads.windows()[-max(self.history_windows - 1, 1):]
        return [*lent, own[-1]], lender

    async def _decide(
        self, objective: ImbalanceObjective, state: _EngineState, windows: list[npt.NDArray[np.float64]],
        placement: Placement, now_s: float,
    ) -> tuple[RebalanceDecision, RebalancePlan | None, HeldOutGain | None, float]:
        """The trigger's decision, and the plan with its time in ms where there is one: the cheap checks (violation,
        sustain, cooldown) run first, the planner only once they pass (planning each violating tick wasted most)."""

        def decide(plan: RebalancePlan | None, held_out: HeldOutGain | None) -> RebalanceDecision:
            return decide_rebalance(
                objective=objective, history=list(state.history), now_s=now_s,
                last_rebalance_s=state.last_rebalance_s, plan=plan, settings=self.settings, held_out=held_out,
            )

        decision = decide(None, None)
        if decision.reason != "insufficient_improvement" or len(windows) < self.min_windows:
            return decision, None, None, 0.0
        # Off the event loop: two plans of a DeepSeek-V3-sized model over eight windows take a few tenths of a second.
        plan, held_out, plan_ms = await asyncio.get_running_loop().run_in_executor(
            self._planner, _timed_plan, windows, placement)
        return decide(plan, held_out), plan, held_out, plan_ms

    async def _apply(
        self, endpoint: str, plan: RebalancePlan, held_out: HeldOutGain | None, state: _EngineState, now_s: float,
        step: Callable[..., RebalanceEvent],
    ) -> RebalanceEvent:
        """Apply the plan; a cancellation (a shutdown) meanwhile leaves an ``interrupted`` step to report."""
        note = None
        try:
            swap = await self.control.apply_placement(endpoint, plan.placement)
        except CommitUnconfirmedError as exc:  # pending: verified once committed, superseded if it never is
            swap, note = dict(exc.swap), str(exc)
        except UnavailableError as exc:
            return step(outcome="failed", error=str(exc))
        except asyncio.CancelledError:
            self._unreported.append(step(outcome="interrupted", error=APPLY_CUT_SHORT))
            raise
        state.pending, state.applied_at_s = plan, now_s
        state.pending_cv = None if held_out is None else held_out.cv_after
        state.history.clear()  # the old placement's CVs say nothing about the new one
        event: RebalanceEvent = step(outcome="applied", swap=swap, error=note)
        state.pending_summary = event.plan
        return event


__all__ = [
    "EngineControl", "ExpertLoadSnapshot", "HttpEngineControl", "JsonHttpControl", "RebalanceEvent", "Rebalancer",
    "checked", "engine_placement", "error_text", "snapshot_problem", "totals",
]
