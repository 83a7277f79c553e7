"""Read-only views: ``/v1/status``, ``/v1/decisions``, ``/health`` and ``/metrics``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Protocol

from fastapi import APIRouter, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from contracts.errors import MoesloError
from controller.api.schemas import (
    ControllerStatus,
    DecisionOut,
    DecisionPage,
    Health,
    PolicyStatus,
    UnreadablePolicyOut,
    problem_responses,
)
from controller.config import ControllerSettings
from controller.policy import Policy
from controller.runtime import PolicyRuntime
from controller.store import Store, StoredPolicy, UnreadablePolicy

router = APIRouter(tags=["status"])

LAST_DECISIONS = 5
OVERDUE_TICKS = 3
"""No tick has succeeded for this many tick intervals: the loop is failing or stuck, and the status is old."""


class RuntimeView(Protocol):
    """The part of the controller service the read API needs."""

    @property
    def is_leader(self) -> bool: ...

    @property
    def last_tick_at(self) -> datetime | None: ...

    def runtime(self, name: str) -> PolicyRuntime | None: ...

    def check_target(self, policy: Policy) -> list[str]: ...


def runtime_view(request: Request) -> RuntimeView | None:
    view: RuntimeView | None = getattr(request.app.state, "service", None)
    return view


def read_now(view: RuntimeView | None) -> datetime:
    """Now, on the wall clock the service stamps its ticks and observations with (its ``wall_clock``, when it
    has one)."""
    clock: Callable[[], datetime] | None = getattr(view, "wall_clock", None)
    return clock() if clock is not None else datetime.now(UTC)


def is_stale(observed_at: datetime | None, now: datetime, stale_after_s: float) -> bool:
    """Whether an observation made at ``observed_at`` is too old to show as current at ``now``."""
    return observed_at is None or (now - observed_at).total_seconds() > stale_after_s


def started_at(view: RuntimeView | None) -> datetime | None:
    """When the service's tick loop started (None: no service, or one not started)."""
    at: datetime | None = getattr(view, "started_at", None)
    return at


def tick_overdue(
    last_tick_at: datetime | None, now: datetime, tick_interval_s: float, since_start: datetime | None = None
) -> bool:
    """Whether the last successful tick is more than :data:`OVERDUE_TICKS` tick intervals old at ``now``; before
    the first, whether the service started (``since_start``) that long ago: a first tick that hangs is overdue too."""
    since = last_tick_at if last_tick_at is not None else since_start
    return since is not None and (now - since).total_seconds() > OVERDUE_TICKS * tick_interval_s


def build_policy_status(
    store: Store,
    stored: StoredPolicy,
    view: RuntimeView | None,
    *,
    stale_after_s: float,
    now: datetime | None = None,
    last: int = LAST_DECISIONS,
) -> PolicyStatus:
    """What ``/v1/status/{name}`` serves (the status page renders the same object); ``last`` decisions.

    ``stale`` is judged at ``now`` (default: :func:`read_now`), not only at the last tick: when ticks stop
    succeeding, what the last one saw grows old while the tick's own verdict still says fresh.
    """
    name = stored.policy.name
    runtime = (view.runtime(name) if view is not None else None) or PolicyRuntime()
    decisions = store.list_decisions(policy=name, limit=last) if last > 0 else []
    at = read_now(view) if now is None else now
    return PolicyStatus(
        name=name,
        mode=str(stored.policy.mode),
        policy_version=stored.version,
        current_replicas=runtime.current_replicas,
        desired_replicas=runtime.desired_replicas,
        stale=runtime.stale or is_stale(runtime.observed_at, at, stale_after_s),
        observed_at=runtime.observed_at,
        sli=dict(runtime.sli),
        error_budget_remaining=dict(runtime.error_budget_remaining),
        burn_rates={slo: dict(rates) for slo, rates in runtime.burn_rates.items()},
        errors=list(runtime.errors),
        seen=dict(runtime.seen),
        forecast=None if runtime.forecast is None else dict(runtime.forecast),
        decision=None if runtime.decision is None else dict(runtime.decision),
        last_decisions=[DecisionOut.of(record) for record in decisions],
    )


def build_controller_status(
    request: Request,
    policies: list[StoredPolicy],
    *,
    unreadable: Sequence[UnreadablePolicy] = (),
    now: datetime | None = None,
    last: int = LAST_DECISIONS,
) -> ControllerStatus:
    """What ``/v1/status`` serves for ``policies`` (and the stored ones it cannot read, ``unreadable``) at ``now``
    (the status page renders the same object)."""
    settings: ControllerSettings = request.app.state.settings
    store: Store = request.app.state.store
    view = runtime_view(request)
    at = read_now(view) if now is None else now
    leader = view.is_leader if view is not None else False
    last_tick_at = view.last_tick_at if view is not None else None
    return ControllerStatus(
        leader=leader,
        embedded=settings.embedded,
        mode="leader" if leader else "standby",
        last_tick_at=last_tick_at,
        tick_interval_s=settings.tick_interval_s,
        tick_overdue=tick_overdue(last_tick_at, at, settings.tick_interval_s, started_at(view)),
        policies=[build_policy_status(store, stored, view, stale_after_s=settings.stale_after_s, now=at, last=last)
                  for stored in policies],
        unreadable=[UnreadablePolicyOut.of(u) for u in unreadable],
    )


@router.get("/v1/status", response_model=ControllerStatus, responses=problem_responses(422, 503))
def status(request: Request) -> ControllerStatus:
    """Per policy: SLIs, error budget left, burn rates, current and desired replicas, last decisions."""
    store: Store = request.app.state.store
    listing = store.read_policies()
    return build_controller_status(request, listing.readable, unreadable=listing.unreadable)


@router.get("/v1/status/{name}", response_model=PolicyStatus, responses=problem_responses(404, 422, 503))
def policy_status(request: Request, name: str) -> PolicyStatus:
    store: Store = request.app.state.store
    settings: ControllerSettings = request.app.state.settings
    return build_policy_status(store, store.get_policy(name), runtime_view(request),
                               stale_after_s=settings.stale_after_s)  # fmt: skip


@router.get("/v1/decisions", response_model=DecisionPage, responses=problem_responses(422, 503))
def decisions(
    request: Request,
    policy: Annotated[str | None, Query(max_length=63, description="Only this policy's decisions")] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size")] = 50,
    cursor: Annotated[int | None, Query(ge=1, le=2**63 - 1, description="next_cursor of the previous page")] = None,
) -> DecisionPage:
    """The decision log, newest first, each decision with its inputs and reason."""
    store: Store = request.app.state.store
    settings: ControllerSettings = request.app.state.settings
    limit = min(limit, settings.decisions_page_max)
    records = store.list_decisions(policy=policy, before_id=cursor, limit=limit + 1)  # one more: is there a next?
    next_cursor = records[limit - 1].id if len(records) > limit else None
    return DecisionPage(items=[DecisionOut.of(r) for r in records[:limit]], next_cursor=next_cursor)


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
def health(request: Request, response: Response) -> Health:
    """200 while the store answers (``degraded`` while it holds policies this version cannot read, named);
    503 otherwise."""
    store: Store = request.app.state.store
    view = runtime_view(request)
    try:
        store.list_decisions(limit=1)
        unreadable = [u.name for u in store.unreadable_policies()]
        store_state = f"unreadable policies: {', '.join(unreadable)}" if unreadable else "ok"
    except MoesloError as exc:
        store_state = f"error: {exc}"
        response.status_code = 503
    leader = view.is_leader if view is not None else False
    return Health(status="ok" if store_state == "ok" else "degraded", leader=leader, store=store_state)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}},
)
def metrics(request: Request) -> Response:
    registry: CollectorRegistry = request.app.state.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
