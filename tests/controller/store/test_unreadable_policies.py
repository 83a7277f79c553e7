"""A stored policy that no longer validates (written before a rule was tightened, or by a newer version before
a rollback): the store names it, leaves it out of the listing, and still deletes or replaces it."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from contracts.errors import DataError
from controller.actuators import DryRunActuator
from controller.core import CoreConfig, DecisionCore
from controller.policy import Policy
from controller.service import ControllerService
from controller.store import ModelHeldError, Store
from controller.telemetry import ControllerMetrics
from controller.types import PolicyObservation


def _policy(name: str, model: str | None = None, max_replicas: int = 8) -> Policy:
    return Policy.model_validate({"name": name, "target": {"kind": "model", "model": model or name},
                                  "scaling": {"max_replicas": max_replicas}})  # fmt: skip


def spoil(db: Path, name: str) -> None:
    """Give ``name``'s stored spec a field this version does not know (as a newer controller wrote it)."""
    connection = sqlite3.connect(db)
    with connection:
        connection.execute("UPDATE policies SET spec = json_set(spec, '$.surprise', 1) WHERE name = ?", (name,))
    connection.close()


def _spoilt_store(tmp_path: Path) -> Store:
    url = f"sqlite+pysqlite:///{tmp_path / 'c.db'}"
    first = Store(url)
    first.create_policy(_policy("good"))
    first.create_policy(_policy("old"))
    first.close()
    spoil(tmp_path / "c.db", "old")
    return Store(url)


def test_the_listing_leaves_it_out_and_names_it(tmp_path: Path) -> None:
    store = _spoilt_store(tmp_path)
    assert [stored.policy.name for stored in store.list_policies()] == ["good"]
    [unreadable] = store.unreadable_policies()
    assert (unreadable.name, unreadable.version) == ("old", 1)
    assert "surprise: Extra inputs are not permitted" in unreadable.problem
    with pytest.raises(DataError, match=r"policy 'old' as stored \(version 1\) no longer validates: surprise"):
        store.get_policy("old")


def test_writes_go_on_and_its_model_stays_held(tmp_path: Path) -> None:
    store = _spoilt_store(tmp_path)
    store.create_policy(_policy("third"))
    store.replace_policy(_policy("good", max_replicas=3), expected_version=1)
    with pytest.raises(ModelHeldError, match="watched by policy 'old'"):
        store.create_policy(_policy("other", "old"))
    assert [stored.policy.name for stored in store.list_policies()] == ["good", "third"]


def test_it_can_be_replaced_or_deleted(tmp_path: Path) -> None:
    store = _spoilt_store(tmp_path)
    fixed, created = store.replace_policy(_policy("old", max_replicas=4), expected_version=1)
    assert (fixed.version, created, store.unreadable_policies()) == (2, False, [])
    spoil(tmp_path / "c.db", "good")
    store.delete_policy("good", expected_version=1)
    assert ([s.policy.name for s in store.list_policies()], store.unreadable_policies()) == (["old"], [])
    assert [v.operation for v in store.policy_history("good")] == ["create", "delete"]
    store.create_policy(_policy("new", "good"))  # its model is free again


class _Steady:
    async def observe(self, policies: Sequence[Policy], now_s: float) -> dict[str, PolicyObservation]:
        return {p.name: PolicyObservation(policy=p.name, observed_at_s=now_s) for p in policies}

    async def aclose(self) -> None:
        return None


def test_the_tick_loop_keeps_deciding_for_the_others(tmp_path: Path) -> None:
    store = _spoilt_store(tmp_path)
    service = ControllerService(store=store, source=_Steady(), actuator=DryRunActuator(),  # type: ignore[arg-type]
                                core=DecisionCore(config=CoreConfig(tick_interval_s=15)),
                                metrics=ControllerMetrics(CollectorRegistry()), clock=lambda: 1000.0)  # fmt: skip
    assert asyncio.run(service.tick()) is not None
    assert {record.policy for record in store.list_decisions()} == {"good"}


class _Releases(DryRunActuator):
    def __init__(self) -> None:
        super().__init__()
        self.released: list[str] = []

    async def release(self, policy_name: str) -> None:
        self.released.append(policy_name)


def test_a_policy_that_turns_unreadable_while_running_is_not_released_as_deleted(tmp_path: Path) -> None:
    url = f"sqlite+pysqlite:///{tmp_path / 'c.db'}"
    store = Store(url)
    for name in ("good", "old", "gone"):
        store.create_policy(_policy(name))
    actuator = _Releases()
    service = ControllerService(store=store, source=_Steady(), actuator=actuator,  # type: ignore[arg-type]
                                core=DecisionCore(config=CoreConfig(tick_interval_s=15)),
                                metrics=ControllerMetrics(CollectorRegistry()), clock=lambda: 1000.0)  # fmt: skip
    asyncio.run(service.tick())
    connection = sqlite3.connect(tmp_path / "c.db")
    with connection:  # a newer controller rewrote it, with a field this version does not know
        connection.execute("UPDATE policies SET spec = json_set(spec, '$.surprise', 1), version = 2 "
                            "WHERE name = 'old'")  # fmt: skip
    connection.close()
    assert [u.name for u in store.unreadable_policies()] == ["old"]
    store.delete_policy("gone", expected_version=1)
    asyncio.run(service.tick())
    assert actuator.released == ["gone"]  # what "old" runs stays up


def test_the_leader_keeps_its_load_history(tmp_path: Path) -> None:
    """The leader's prune kept the readable policies' load history only: one this version cannot read (a newer
    controller's, back after a roll-forward) lost its forecaster's history."""
    from controller.load_history import LOAD_HISTORY_CHUNK_S, LoadHistoryKeeper

    store = _spoilt_store(tmp_path)
    start = time.time() // LOAD_HISTORY_CHUNK_S * LOAD_HISTORY_CHUNK_S
    store.save_load_history([(name, start, [[start + 1, 5.0, 100.0, 50.0]]) for name in ("good", "old")])
    service = ControllerService(store=store, source=_Steady(), actuator=DryRunActuator(),  # type: ignore[arg-type]
                                core=DecisionCore(config=CoreConfig(tick_interval_s=15)),
                                metrics=ControllerMetrics(CollectorRegistry()), clock=lambda: 1000.0)  # fmt: skip
    service.history = LoadHistoryKeeper(store, bin_s=15.0, keep_s=86400.0, flush_every_ticks=1)
    for _ in range(25):  # the 25th flush prunes
        asyncio.run(service.tick())
    assert len(store.load_history("old", since_s=0)) == 1
