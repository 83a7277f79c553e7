"""Response bodies of the REST API (what the OpenAPI schema promises)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from controller.api.errors import Problem
from controller.policy import Policy
from controller.store import DecisionRecord, PolicyListing, PolicyVersion, StoredPolicy, UnreadablePolicy


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PolicyResource(_Out):
    """A stored policy: its spec plus the version its ETag names."""

    name: str
    version: int
    etag: str
    created_at: datetime
    updated_at: datetime
    policy: Policy

    @classmethod
    def of(cls, stored: StoredPolicy) -> PolicyResource:
        return cls(
            name=stored.policy.name,
            version=stored.version,
            etag=stored.etag,
            created_at=stored.created_at,
            updated_at=stored.updated_at,
            policy=stored.policy,
        )


class UnreadablePolicyOut(_Out):
    """A stored policy this controller cannot read (it does not run it): replace it with PUT, or delete it."""

    name: str
    version: int
    problem: str

    @classmethod
    def of(cls, unreadable: UnreadablePolicy) -> UnreadablePolicyOut:
        return cls(name=unreadable.name, version=unreadable.version, problem=unreadable.problem)


class PolicyList(_Out):
    items: list[PolicyResource]
    unreadable: list[UnreadablePolicyOut] = []
    """Stored policies left out of ``items``: written before a rule was tightened, or by a newer version."""

    @classmethod
    def of(cls, listing: PolicyListing) -> PolicyList:
        return cls(items=[PolicyResource.of(stored) for stored in listing.readable],
                   unreadable=[UnreadablePolicyOut.of(unreadable) for unreadable in listing.unreadable])  # fmt: skip


class PolicyVersionOut(_Out):
    version: int
    operation: str
    at: datetime
    policy: dict[str, Any] | None

    @classmethod
    def of(cls, version: PolicyVersion) -> PolicyVersionOut:
        return cls(version=version.version, operation=version.operation, at=version.at, policy=version.spec)


class PolicyHistory(_Out):
    name: str
    versions: list[PolicyVersionOut]
    """Newest first, deletions included."""
    next_cursor: int | None = None
    """Pass as ``cursor`` to get the next (older) page; null on the last page."""


class DecisionOut(_Out):
    """One decision with its inputs and reason, as logged."""

    id: int
    policy: str
    policy_version: int
    at: datetime
    action: str
    reason: str
    current_replicas: int | None
    desired_replicas: int | None
    mode: str
    outcome: str
    detail: str
    inputs: dict[str, Any]

    @classmethod
    def of(cls, record: DecisionRecord) -> DecisionOut:
        assert record.id is not None, "only stored decisions are served"
        return cls(
            id=record.id,
            policy=record.policy,
            policy_version=record.policy_version,
            at=record.at,
            action=record.action,
            reason=record.reason,
            current_replicas=record.current_replicas,
            desired_replicas=record.desired_replicas,
            mode=record.mode,
            outcome=record.outcome,
            detail=record.detail,
            inputs=record.inputs,
        )


class DecisionPage(_Out):
    items: list[DecisionOut]
    next_cursor: int | None
    """Pass as ``cursor`` to get the next (older) page; null on the last page."""


class PolicyStatus(_Out):
    """What the controller knows about one policy right now."""

    name: str
    mode: str
    policy_version: int
    current_replicas: int | None
    desired_replicas: int | None
    stale: bool
    """True when the last observation is missing, or older than ``stale_after_s`` now (when this status was
    read; ticks that stopped succeeding leave the last one's data growing old), or the source failed: the core
    holds, and what this status shows is not current."""
    observed_at: datetime | None
    sli: dict[str, float | None]
    error_budget_remaining: dict[str, float | None]
    burn_rates: dict[str, dict[str, float]]
    errors: list[str]
    seen: dict[str, float | int | str | None] = {}
    """What the core saw this tick: load, queue, running batch, KV usage, ready replicas, replica budget."""
    forecast: dict[str, float | str | bool | None] | None = None
    """The forecast one lead time ahead (point, interval, sized), its rolling WAPE and interval
    coverage, and ``in_use``: whether it sized the fleet (false while warming up, unreliable or off)."""
    decision: dict[str, str | list[str]] | None = None
    """The last decision this replica made: action, reasons, detail."""
    last_decisions: list[DecisionOut]


class ControllerStatus(_Out):
    leader: bool
    embedded: bool
    mode: str
    """``leader`` acts; ``standby`` only evaluates and serves reads."""
    last_tick_at: datetime | None
    """When the last tick succeeded (null before the first)."""
    tick_interval_s: float
    tick_overdue: bool = False
    """True when the last tick succeeded more than three tick intervals ago (or, before the first, the service
    started that long ago): the loop is failing or stuck, and everything below is as old as ``last_tick_at``."""
    policies: list[PolicyStatus]
    unreadable: list[UnreadablePolicyOut] = []
    """Stored policies this controller cannot read, so does not run (not in ``policies``): replace each with PUT
    (``If-Match`` its version) or delete it."""


class Health(_Out):
    status: str
    leader: bool
    store: str


class OpenSloImport(_Out):
    items: list[PolicyResource]


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the error statuses a route can return."""
    return {status: {"model": Problem} for status in statuses}
