"""Opening the database: the schema built by several controllers at once on a new database."""

from __future__ import annotations

import logging
import multiprocessing
import sqlite3
import threading
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from contracts.errors import UnavailableError
from controller.config import ControllerSettings
from controller.policy import Policy
from controller.store import Store
from controller.store.tables import Base


def _open(url: str, barrier: Barrier, results: Queue[str]) -> None:
    barrier.wait()
    try:
        Store(url).close()
        results.put("ok")
    except Exception as exc:  # the child reports whatever stopped it
        results.put(f"{type(exc).__name__}: {exc}")


def test_three_controllers_opening_one_new_database_all_start(tmp_path: Path) -> None:
    """Each checked then created the tables: all but the first to create them failed (table already exists)."""
    context = multiprocessing.get_context("fork")
    for attempt in range(3):
        url = f"sqlite+pysqlite:///{tmp_path / f'c{attempt}.db'}"
        barrier, results = context.Barrier(3), context.Queue()
        processes = [context.Process(target=_open, args=(url, barrier, results)) for _ in range(3)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=30)
        assert [results.get(timeout=5) for _ in processes] == ["ok"] * 3


def test_tables_another_controller_created_after_the_check_are_taken_as_they_are(tmp_path: Path) -> None:
    """The race made certain: another controller creates the tables between this one's check and its creates."""
    url = f"sqlite+pysqlite:///{tmp_path / 'c.db'}"
    raced: list[Store] = []
    started: list[bool] = []

    def other_controller_first(*_args: Any, **_kwargs: Any) -> None:
        if not started:  # once: the other controller's own create_all fires this too
            started.append(True)
            raced.append(Store(url))

    event.listen(Base.metadata, "before_create", other_controller_first)
    try:
        store = Store(url)
    finally:
        event.remove(Base.metadata, "before_create", other_controller_first)
    policy = Policy.model_validate({"name": "p", "target": {"kind": "model", "model": "m"}})
    raced[0].create_policy(policy)
    assert [stored.policy.name for stored in store.list_policies()] == ["p"]


def test_a_new_database_another_controller_holds_locked_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite refuses at once ("database is locked") while another controller switches a new database to WAL or
    builds the schema; no table existed yet, so the refusal was raised as an outage (seen once in a full run)."""
    real = Base.metadata.create_all
    refused: list[bool] = []

    def locked_once(*args: Any, **kwargs: Any) -> None:
        if not refused:
            refused.append(True)
            raise OperationalError("PRAGMA journal_mode=WAL", {}, sqlite3.OperationalError("database is locked"))
        real(*args, **kwargs)

    monkeypatch.setattr(Base.metadata, "create_all", locked_once)
    Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}").close()
    assert refused == [True]


@pytest.mark.parametrize("db", [":memory:", "sqlite://", "sqlite+pysqlite:///:memory:"])
def test_an_in_memory_database_is_one_database_for_every_thread(db: str) -> None:
    """Each thread had its own empty database: the API's workers and the tick answered 503 (no such table)."""
    store = Store(ControllerSettings(db=db).db_url)
    store.create_policy(Policy.model_validate({"name": "p", "target": {"kind": "model", "model": "m"}}))
    seen: list[object] = []

    def read() -> None:
        try:
            seen.append([stored.policy.name for stored in store.list_policies()])
        except UnavailableError as exc:
            seen.append(str(exc))

    worker = threading.Thread(target=read)
    worker.start()
    worker.join(timeout=10)
    assert seen == [["p"]]


def test_an_outage_answers_without_the_statement_and_logs_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The 503's detail carried the SQL text and its parameters."""
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    with sqlite3.connect(tmp_path / "c.db") as connection:
        connection.execute("DROP TABLE policies")
    with caplog.at_level(logging.WARNING), pytest.raises(UnavailableError) as raised:
        store.get_policy("p")
    assert str(raised.value) == "policy store (sqlite): no such table: policies"
    assert "SELECT policies.name" in caplog.text


def test_an_in_memory_database_holds_under_concurrent_reads_and_writes() -> None:
    """Two threads' sessions shared the one connection at once: each rolled back the other's transaction ("cannot
    commit - no transaction is active"), and a broken connection was replaced by a new, empty database."""
    from datetime import UTC, datetime

    from controller.store import DecisionRecord

    store = Store(ControllerSettings(db=":memory:").db_url)
    errors: list[str] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                store.list_policies()
            except UnavailableError as exc:
                errors.append(f"read: {exc}")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for k in range(400):
            record = DecisionRecord(policy="p", policy_version=1, at=datetime.now(UTC), tick_s=float(k),
                                    action="hold", reason="within_slo", current_replicas=1, desired_replicas=1,
                                    mode="enforce", outcome="held", inputs={"k": k})  # fmt: skip
            try:
                store.append_decisions([record])
            except UnavailableError as exc:
                errors.append(f"write: {exc}")
    finally:
        done.set()
        reader.join(timeout=10)
    assert errors == []
    assert len(store.list_decisions(limit=1000)) == 400


def test_a_schema_refusal_with_no_tables_made_is_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A database that is down is no race lost: it was tried five times, each waiting out the driver's timeout."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import OperationalError

    from controller.store import engine as store_engine

    calls: list[int] = []

    def refused(*_args: object, **_kwargs: object) -> None:
        calls.append(1)
        raise OperationalError("CREATE TABLE", {}, Exception("connection timed out"))

    monkeypatch.setattr(Base.metadata, "create_all", refused)
    with pytest.raises(OperationalError):
        store_engine.create_schema(create_engine("sqlite://"))
    assert calls == [1]
