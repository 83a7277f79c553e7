"""Expert rebalancing: pure placement planning and the trigger that decides when to apply a plan.

``plan_rebalance`` turns per-(layer, expert) load into a :class:`~contracts.placement.Placement`
that evens out per-rank load, replicating hot experts into spare slots and moving
few experts when it starts from the current placement.  ``decide_rebalance``
says whether to apply such a plan now, with its reasons as data; ``verify_rebalance``
compares the imbalance measured afterwards with the prediction.  No I/O here;
:mod:`~controller.rebalance.allocator` holds the process-wide allocator setting that the
commands which plan apply.
"""

from __future__ import annotations

from controller.rebalance.planner import RebalanceConfig, RebalancePlan, plan_rebalance
from controller.rebalance.trigger import (
    CvObservation,
    RebalanceDecision,
    TriggerSettings,
    VerifyResult,
    decide_rebalance,
    verify_rebalance,
)

__all__ = [
    "CvObservation",
    "RebalanceConfig",
    "RebalanceDecision",
    "RebalancePlan",
    "TriggerSettings",
    "VerifyResult",
    "decide_rebalance",
    "plan_rebalance",
    "verify_rebalance",
]
