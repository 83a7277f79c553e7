"""What the controller service writes to the decision log: a decision's record, a rebalancer step's, and the
outcome of an action that a shutdown cut short; and the writer that keeps what a failed write left."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from contracts.errors import MoesloError
from controller.runtime import json_safe
from controller.store import DecisionRecord, DecisionRefusedError, Store, StoredPolicy
from controller.types import Decision

if TYPE_CHECKING:
    from controller.actuators.placement import RebalanceEvent
    from controller.telemetry import ControllerMetrics

log = logging.getLogger(__name__)

PENDING_MAX = 10_000
"""Unwritten records kept for the next write (a tick of 100 policies logs 100): beyond, the oldest are dropped."""

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


class DecisionLogWriter:
    """Writes the tick's records to the store.  A write that fails (a database locked, a failover) keeps its records,
    and the next write sends them first: a change applied must not lose its record (nor the cooldown a restart
    carries over from it) to one failed write.  At most ``pending_max`` are kept; beyond, the oldest are dropped
    (``dropped`` counts them, and the warning says so).  A batch the store refuses for a record in it (one it can
    never hold) is written one record at a time: the others are written, and the refused one is dropped with a
    warning and counted (``refused``, and the store's errors), where kept it would fail every later write."""

    def __init__(self, store: Store, metrics: ControllerMetrics, *, pending_max: int = PENDING_MAX) -> None:
        self.store = store
        self.metrics = metrics
        self.pending_max = pending_max
        self.pending: list[DecisionRecord] = []
        self.dropped = 0
        self.refused = 0

    async def append(self, records: Sequence[DecisionRecord] = ()) -> bool:
        """Write the records kept from failed writes, then ``records``; whether none is left for the next write."""
        batch = [*self.pending, *records]
        if not batch:
            return True
        try:
            await asyncio.to_thread(self.store.append_decisions, batch)
        except DecisionRefusedError:
            return await self._one_by_one(batch)
        except MoesloError as exc:
            self._failed(batch, exc)
            return False
        self.pending = []
        return True

    async def _one_by_one(self, batch: list[DecisionRecord]) -> bool:
        """Each record of a refused batch on its own, in order: an outage meanwhile keeps the rest."""
        for at, record in enumerate(batch):
            try:
                await asyncio.to_thread(self.store.append_decisions, [record])
            except DecisionRefusedError as exc:
                self.refused += 1
                self.metrics.error("store")
                log.warning("decision log: %s's %s record of %s dropped (%d refused since the start): %s",
                            record.policy, record.action, record.at.isoformat(), self.refused, exc)  # fmt: skip
            except MoesloError as exc:
                self._failed(batch[at:], exc)
                return False
        self.pending = []
        return True

    def _failed(self, batch: list[DecisionRecord], exc: MoesloError) -> None:
        self.metrics.error("store")
        self._keep(batch)
        log.warning("decision log write failed (%d record(s) kept for the next write): %s", len(self.pending), exc)

    def _keep(self, batch: list[DecisionRecord]) -> None:
        over = len(batch) - self.pending_max
        if over > 0:
            self.dropped += over
            log.warning("decision log: %d unwritten record(s) dropped, the oldest (%d since the start)", over,
                        self.dropped)  # fmt: skip
        self.pending = batch[max(0, over):]

    async def prune(self, keep: int) -> None:
        """Keep the newest ``keep`` decisions."""
        try:
            removed = await asyncio.to_thread(self.store.prune_decisions, keep_last=keep)
        except MoesloError as exc:
            log.warning("pruning the decision log failed: %s", exc)
            self.metrics.error("store")
            return
        if removed:
            log.info("pruned %d old decisions (keeping %d)", removed, keep)
