"""Opening the database: the schema built by several controllers at once on a new database."""

from __future__ import annotations

import multiprocessing
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from sqlalchemy import event

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
