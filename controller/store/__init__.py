"""Persistence of policies, their versions and the decision log (SQLAlchemy)."""

from __future__ import annotations

from controller.store.series import DecisionPoint
from controller.store.store import (
    DecisionRecord,
    PolicyVersion,
    StaleVersionError,
    Store,
    StoredPolicy,
    make_engine,
)

__all__ = [
    "DecisionPoint",
    "DecisionRecord",
    "PolicyVersion",
    "StaleVersionError",
    "Store",
    "StoredPolicy",
    "make_engine",
]
