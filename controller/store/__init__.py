"""Persistence of policies, their versions and the decision log (SQLAlchemy)."""

from __future__ import annotations

from controller.store.store import (
    DecisionRecord,
    PolicyVersion,
    StaleVersionError,
    Store,
    StoredPolicy,
    make_engine,
)

__all__ = ["DecisionRecord", "PolicyVersion", "StaleVersionError", "Store", "StoredPolicy", "make_engine"]
