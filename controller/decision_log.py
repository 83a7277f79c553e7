"""What the controller service writes to the decision log: a decision's record, a rebalancer step's, and the
outcome of an action that a shutdown cut short."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from controller.runtime import json_safe
from controller.store import DecisionRecord, StoredPolicy
from controller.types import Decision

if TYPE_CHECKING:
    from controller.actuators.placement import RebalanceEvent

INTERRUPTED = "interrupted"
"""The outcome of an action still running when the shutdown grace ran out: it was cut short, and whether it took
effect is unknown (the next controller reads the replicas and placements afresh)."""


def interrupted_detail(grace_s: float) -> str:
    return f"the shutdown's {grace_s:g} s grace ran out while it was carried out: whether it took effect is unknown"


def decision_record(entry: StoredPolicy, decision: Decision, outcome: str, detail: str, at: datetime) -> DecisionRecord:
    """A scaling decision's record: ``detail`` is the actuator's word on it (or why it was not carried out)."""
    return DecisionRecord(
        policy=entry.policy.name,
        policy_version=entry.version,
        at=at,
        tick_s=decision.decided_at_s,
        action=decision.action,
        reason=logged_reason(decision),
        current_replicas=decision.current_replicas,
        desired_replicas=decision.desired_replicas,
        mode=str(entry.policy.mode),
        outcome=outcome,
        detail="; ".join(d for d in (decision.detail, detail) if d),
        inputs={**json_safe(decision.inputs), "reasons": list(decision.reasons)},
    )


def logged_reason(decision: Decision) -> str:
    """The reason a decision is logged and counted by: the second where there are more (the first is the action)."""
    return decision.reasons[1] if len(decision.reasons) > 1 else decision.reasons[0]


def rebalance_record(entry: StoredPolicy, event: RebalanceEvent, at: datetime, tick_s: float) -> DecisionRecord:
    """A rebalancer step's record (a rebalance, or the verification of one)."""
    decision = event.decision
    reason = decision.reason if decision is not None else (
        event.verify.reason if event.verify is not None else event.kind
    )
    return DecisionRecord(
        policy=entry.policy.name, policy_version=entry.version, at=at, tick_s=tick_s,
        action="rebalance" if event.kind == "rebalance" else "verify_rebalance", reason=reason,
        current_replicas=None, desired_replicas=None, mode=str(entry.policy.mode),
        outcome=event.outcome, detail=event.detail(), inputs=event.to_json(),
    )
