"""Persistence of policies, their versions and the decision log (SQLAlchemy)."""

from __future__ import annotations

from controller.store.series import DecisionPoint
from controller.store.store import (
    DecisionRecord,
    ModelHeldError,
    PolicyVersion,
    StaleVersionError,
    Store,
    StoredPolicy,
    make_engine,
)

__all__ = [
    "DecisionPoint",
    "DecisionRecord",
    "ModelHeldError",
    "PolicyVersion",
    "StaleVersionError",
    "Store",
    "StoredPolicy",
    "make_engine",
]
