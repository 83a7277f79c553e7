"""Persistence of policies, their versions and the decision log (SQLAlchemy)."""

from __future__ import annotations

from controller.store.engine import make_engine
from controller.store.records import (
    DecisionRecord,
    DecisionRefusedError,
    ModelHeldError,
    PolicyExistsError,
    PolicyVersion,
    StaleVersionError,
    StoredPolicy,
    UnreadablePolicy,
    UnreadablePolicyError,
)
from controller.store.series import DecisionPoint
from controller.store.store import PolicyListing, Store

__all__ = [
    "DecisionPoint",
    "DecisionRecord",
    "DecisionRefusedError",
    "ModelHeldError",
    "PolicyExistsError",
    "PolicyListing",
    "PolicyVersion",
    "StaleVersionError",
    "Store",
    "StoredPolicy",
    "UnreadablePolicy",
    "UnreadablePolicyError",
    "make_engine",
]
