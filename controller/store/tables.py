"""SQLAlchemy tables: policies, their version history and models, the decision log, and the load history."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ColumnElement, DateTime, Float, Index, Integer, Select, String, Text, and_, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class PolicyRow(Base):
    """The live version of one policy.

    Its UPDATE and DELETE are conditional on the version the writer read (``WHERE version = ?``; the store sets
    the new one): SQLite ignores ``FOR UPDATE`` and reads outside the write's transaction, so a writer in
    another process may have changed or deleted the row since.  Then no row matches, and SQLAlchemy's
    ``StaleDataError`` makes the store read again.
    """

    __tablename__ = "policies"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __mapper_args__ = {"version_id_col": version, "version_id_generator": False}  # noqa: RUF012 (read at mapping)


class PolicyVersionRow(Base):
    """Every version a policy ever had, deletions included (``spec`` is None)."""

    __tablename__ = "policy_versions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    operation: Mapped[str] = mapped_column(String(16), nullable=False)
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)

    __table_args__ = (Index("ix_policy_versions_name_version", "name", "version", unique=True),)


class ModelRow(Base):
    """The policy that watches a model (``Policy.model_name``): one a model, as the primary key says.

    The store refuses a second policy for a model by reading the policies; this row is what makes two
    writers racing for one model (in other processes too) one winner: the other's insert fails.
    """

    __tablename__ = "policy_models"

    model: Mapped[str] = mapped_column(String(253), primary_key=True)
    policy: Mapped[str] = mapped_column(String(63), nullable=False)


class DecisionRow(Base):
    """One decision of the core, with its inputs, reason and what became of it."""

    __tablename__ = "decisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    policy: Mapped[str] = mapped_column(String(63), nullable=False)
    policy_version: Mapped[int] = mapped_column(Integer, nullable=False)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    tick_s: Mapped[float] = mapped_column(Float, nullable=False)
    action: Mapped[str] = mapped_column(String(32), nullable=False)
    reason: Mapped[str] = mapped_column(String(64), nullable=False)
    current_replicas: Mapped[int | None] = mapped_column(Integer, nullable=True)
    desired_replicas: Mapped[int | None] = mapped_column(Integer, nullable=True)
    mode: Mapped[str] = mapped_column(String(16), nullable=False)
    outcome: Mapped[str] = mapped_column(String(16), nullable=False)
    """``applied``, ``advisory``, ``held``, ``standby`` (not the leader), ``failed``."""
    detail: Mapped[str] = mapped_column(Text, nullable=False, default="")
    inputs: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)

    __table_args__ = (Index("ix_decisions_policy_id", "policy", "id"),)


class LoadHistoryRow(Base):
    """One chunk of a policy's observed load, one sample per tick: what its forecaster learns from.

    ``samples`` is a list of ``[wall_time_s, request_rate_rps, prompt_tokens_per_s, output_tokens_per_s]``;
    a chunk covers ``LOAD_HISTORY_CHUNK_S`` from ``chunk_start_s`` (Unix seconds), so a day of
    15-second ticks is 24 rows per policy, rewritten while the current chunk fills: each write over the time
    its samples span (:func:`spliced`).
    """

    __tablename__ = "load_history"

    policy: Mapped[str] = mapped_column(String(63), primary_key=True)
    chunk_start_s: Mapped[float] = mapped_column(Float, primary_key=True)
    samples: Mapped[list[list[float]]] = mapped_column(JSON, nullable=False)


def spliced(stored: list[list[float]], samples: list[list[float]]) -> list[list[float]]:
    """A chunk's stored samples with ``samples`` (oldest first) in place of those over the time they span.

    A writer's chunk holds only what it recorded since it started: a leader restarted in the middle of the hour
    keeps the samples written before it, and a deposed one's late write the new leader's after its own."""
    if not samples:
        return stored
    first, last = min(s[0] for s in samples), max(s[0] for s in samples)  # a wall clock stepped back too
    before = [s for s in stored if s[0] < first]
    after = [s for s in stored if s[0] > last]
    return [*before, *samples, *after]


def decisions_of(policy: str) -> ColumnElement[bool]:
    """The decisions of ``policy`` since it was last created: a policy deleted and created again starts with an
    empty log.

    Versions grow across deletes, so the decisions made under an older creation (those logged late included,
    by a tick that read the policy before it was deleted) all carry versions below the latest ``create``.  A
    name never stored (no versions) keeps all its decisions; a deleted one, those of its last creation.
    """
    created = (
        select(func.max(PolicyVersionRow.version))
        .where(PolicyVersionRow.name == policy, PolicyVersionRow.operation == "create")
        .scalar_subquery()
    )
    return and_(DecisionRow.policy == policy, DecisionRow.policy_version >= func.coalesce(created, 0))


def versions_of(
    name: str, *, after_version: int | None, newest_first: bool, before_version: int | None = None
) -> Select[PolicyVersionRow]:
    """The name's versions after ``after_version`` and before ``before_version`` (None: no bound), by version,
    oldest or newest first."""
    query = select(PolicyVersionRow).where(PolicyVersionRow.name == name)
    if after_version is not None:
        query = query.where(PolicyVersionRow.version > after_version)
    if before_version is not None:
        query = query.where(PolicyVersionRow.version < before_version)
    return query.order_by(PolicyVersionRow.version.desc() if newest_first else PolicyVersionRow.version)
