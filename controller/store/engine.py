"""Opening the controller's database: the engine for a URL, and the schema, which several controllers starting
on one new database may create at the same moment."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError
from sqlalchemy.pool import ConnectionPoolEntry, StaticPool

from controller.store.tables import Base

SCHEMA_ATTEMPTS = 5


def _sqlite_pragmas(dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def redacted(url: str) -> str:
    """``url`` with its password hidden, for messages (as written when it does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (SQLAlchemyError, ValueError):
        return url


def in_memory(url: str) -> bool:
    """Whether a SQLite ``url`` names no file (as SQLAlchemy's SQLite dialect decides it)."""
    parsed = make_url(url)
    return parsed.database in (None, "", ":memory:") or parsed.query.get("mode") == "memory"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get WAL and a busy timeout."""
    if url.startswith("sqlite"):
        # An in-memory database lives in its connection: the default pool gives each thread its own (and its
        # own empty database), so every thread shares the one connection instead (SQLAlchemy's recipe); the
        # store then lets one session at a time use it (see Store._serial).
        pool: dict[str, Any] = {"poolclass": StaticPool} if in_memory(url) else {}
        engine = create_engine(url, connect_args={"check_same_thread": False}, **pool)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


def create_schema(engine: Engine) -> None:
    """The tables, those missing created.  Controllers opening a new database at the same moment each find a
    table missing and create it, and all but the first are refused (SQLite: "already exists"; PostgreSQL: a
    unique violation in its catalog): such a refusal is tried again, and the next pass finds the tables.  A refusal
    after which none of the tables exists is no such race (a database down, a path refused): it is raised at once,
    not after five driver timeouts."""
    for attempt in range(1, SCHEMA_ATTEMPTS + 1):
        try:
            Base.metadata.create_all(engine)
            return
        except (OperationalError, ProgrammingError, IntegrityError) as exc:
            if attempt == SCHEMA_ATTEMPTS or not (_some_tables_exist(engine) or _locked(exc)):
                raise
            time.sleep(0.05 * attempt)


def _locked(exc: SQLAlchemyError) -> bool:
    """SQLite's "database is locked": another controller holds the new database (switching it to WAL, building the
    schema), and SQLite refuses at once, without its busy timeout, where waiting could deadlock; before any table
    exists that refusal is the race too, not a database that is down."""
    return "database is locked" in str(exc)


def _some_tables_exist(engine: Engine) -> bool:
    """Whether another controller has created any of the schema's tables (False too when the database does not
    answer the question)."""
    try:
        present = set(inspect(engine).get_table_names())
    except SQLAlchemyError:
        return False
    return bool(present & set(Base.metadata.tables))
