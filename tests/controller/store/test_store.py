"""The store: policies with monotonic versions, history, decisions, and survival across a restart."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from contracts.errors import ConflictError, NotFoundError
from controller.actuators import DryRunActuator
from controller.core import CoreConfig, DecisionCore
from controller.policy import Policy
from controller.service import ControllerService
from controller.store import DecisionRecord, StaleVersionError, Store
from controller.telemetry import ControllerMetrics


def _policy(name: str = "p", max_replicas: int = 8) -> Policy:
    return Policy.model_validate(
        {"name": name, "target": {"kind": "model", "model": name}, "scaling": {"max_replicas": max_replicas}}
    )


def _decision(policy: str, i: int) -> DecisionRecord:
    return DecisionRecord(
        policy=policy, policy_version=1, at=datetime.now(UTC), tick_s=float(i), action="hold", reason="steady",
        current_replicas=2, desired_replicas=2, mode="enforce", outcome="held", inputs={"i": i, "queue_depth": None},
    )


def test_sqlite_file_uses_wal(tmp_path: Path) -> None:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    store.create_policy(_policy())
    store.close()
    mode = sqlite3.connect(tmp_path / "c.db").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_versions_grow_across_update_delete_and_recreate(tmp_path: Path) -> None:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    assert store.create_policy(_policy()).version == 1
    with pytest.raises(ConflictError, match="already exists"):
        store.create_policy(_policy())
    stored, created = store.replace_policy(_policy(max_replicas=4), expected_version=1)
    assert (stored.version, created, stored.etag) == (2, False, '"2"')
    with pytest.raises(StaleVersionError, match="is at version 2, not version 1"):
        store.replace_policy(_policy(max_replicas=5), expected_version=1)
    store.delete_policy("p", expected_version=2)
    with pytest.raises(NotFoundError):
        store.get_policy("p")
    again, created = store.replace_policy(_policy(), create=True)
    assert created and again.version == 4  # never reuses an ETag of the deleted versions
    history = store.policy_history("p")
    assert [(v.version, v.operation) for v in history] == [(1, "create"), (2, "update"), (3, "delete"), (4, "create")]
    assert history[1].spec is not None and history[1].spec["scaling"]["max_replicas"] == 4
    assert history[2].spec is None


def test_the_history_is_read_a_page_at_a_time(tmp_path: Path) -> None:
    """Every version was read at once, each with its whole spec: a policy changed a few thousand times made the
    history and every render of its page read them all."""
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    store.create_policy(_policy())
    for replicas in range(2, 8):
        store.replace_policy(_policy(max_replicas=replicas))
    assert [v.version for v in store.policy_history("p", limit=3)] == [1, 2, 3]
    assert [v.version for v in store.policy_history("p", after_version=3, limit=3)] == [4, 5, 6]
    assert [v.version for v in store.policy_history("p", after_version=6, limit=3)] == [7]
    assert store.policy_history("p", after_version=7) == []  # past the end: none, not a 404
    assert [v.version for v in store.policy_history("p", limit=2, newest_first=True)] == [7, 6]
    assert [v.version for v in store.policy_history("p", before_version=6, limit=2, newest_first=True)] == [5, 4]
    with pytest.raises(NotFoundError):
        store.policy_history("ghost", after_version=3)


def test_writing_a_policy_unchanged_keeps_its_version(tmp_path: Path) -> None:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    store.create_policy(_policy())
    stored, created = store.replace_policy(_policy(), expected_version=1)
    assert (stored.version, created) == (1, False)
    assert store.write_policies([(_policy(), 1)])[0].version == 1
    assert store.replace_policy(_policy(max_replicas=4))[0].version == 2
    assert [v.version for v in store.policy_history("p")] == [1, 2]


def test_several_policies_are_written_all_or_none_as_planned(tmp_path: Path) -> None:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    store.create_policy(_policy("a"))
    written = store.write_policies([(_policy("a", 4), 1), (_policy("b"), None)])
    assert [(w.policy.name, w.version) for w in written] == [("a", 2), ("b", 1)]
    # Planned as new, but another writer created it meanwhile: nothing is written, "a" included.
    store.create_policy(_policy("c"))
    with pytest.raises(ConflictError, match="'c' was created by another writer meanwhile"):
        store.write_policies([(_policy("a", 5), 2), (_policy("c", 3), None)])
    with pytest.raises(StaleVersionError):
        store.write_policies([(_policy("d"), None), (_policy("a", 5), 1)])
    assert store.get_policy("a").version == 2 and store.get_policy("c").policy.scaling.max_replicas == 8
    with pytest.raises(NotFoundError):
        store.get_policy("d")


def test_decisions_page_newest_first(tmp_path: Path) -> None:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    ids = store.append_decisions([_decision("a" if i % 2 else "b", i) for i in range(7)])
    assert ids == sorted(ids)
    page = store.list_decisions(limit=3)
    assert [r.id for r in page] == ids[::-1][:3]
    older = store.list_decisions(limit=3, before_id=page[-1].id)
    assert [r.id for r in older] == ids[::-1][3:6]
    only_a = store.list_decisions(policy="a", limit=10)
    assert {r.policy for r in only_a} == {"a"} and len(only_a) == 3
    assert only_a[0].inputs == {"i": 5, "queue_depth": None}
    assert store.prune_decisions(keep_last=2) == 5
    assert len(store.list_decisions(limit=10)) == 2


def test_everything_survives_a_restart(tmp_path: Path) -> None:
    url = f"sqlite+pysqlite:///{tmp_path / 'c.db'}"
    first = Store(url)
    first.create_policy(_policy("a"))
    first.replace_policy(_policy("a", max_replicas=3), expected_version=1)
    first.append_decisions([_decision("a", 1)])
    first.close()
    second = Store(url)
    stored = second.get_policy("a")
    assert (stored.version, stored.policy.scaling.max_replicas) == (2, 3)
    assert stored.created_at.tzinfo is not None
    assert [v.version for v in second.policy_history("a")] == [1, 2]
    [decision] = second.list_decisions()
    assert (decision.policy, decision.reason, decision.inputs["i"]) == ("a", "steady", 1)


def test_unconditional_writes_racing_for_the_next_version_all_land(tmp_path: Path) -> None:
    """SQLite ignores FOR UPDATE: concurrent writers took the same next version and the losers got a 409
    with the database's text. The loser's transaction is tried again; every write lands once."""
    import threading

    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    store.create_policy(_policy())
    failures: list[Exception] = []

    def writer(i: int) -> None:
        for j in range(15):
            try:
                store.replace_policy(Policy.model_validate({**_policy().model_dump(), "description": f"w{i}-{j}"}))
            except ConflictError as exc:
                failures.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert store.get_policy("p").version == 1 + 6 * 15
    assert [v.version for v in store.policy_history("p")] == list(range(1, 92))


def _applied(policy: str, version: int, tick_s: float) -> DecisionRecord:
    return DecisionRecord(
        policy=policy, policy_version=version, at=datetime.now(UTC), tick_s=tick_s, action="scale_up",
        reason="queue_depth", current_replicas=1, desired_replicas=3, mode="enforce", outcome="applied",
        inputs={"request_rate_rps": tick_s},
    )


def test_a_policy_created_again_reads_only_the_decisions_since(tmp_path: Path) -> None:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    since = datetime(2000, 1, 1, tzinfo=UTC)
    store.create_policy(_policy("p"))
    store.replace_policy(_policy("p", max_replicas=4))
    store.append_decisions([_applied("p", 1, 1.0), _applied("p", 2, 2.0), _applied("ghost", 1, 3.0)])
    assert [r.tick_s for r in store.list_decisions(policy="p")] == [2.0, 1.0]  # every version of one creation
    store.delete_policy("p")
    assert [r.tick_s for r in store.list_decisions(policy="p")] == [2.0, 1.0]  # deleted: its last log stays
    assert store.replace_policy(_policy("p"), create=True)[0].version == 4
    assert store.list_decisions(policy="p") == []
    assert store.decision_points("p", since=since, fields={"rate": ("request_rate_rps",)}) == []
    store.append_decisions([_applied("p", 2, 4.0), _applied("p", 4, 5.0)])  # a late write of the old one, a new
    assert [r.tick_s for r in store.list_decisions(policy="p")] == [5.0]
    points = store.decision_points("p", since=since, fields={"rate": ("request_rate_rps",)})
    assert [p.values for p in points] == [(5.0,)]
    assert [r.tick_s for r in store.list_decisions(policy="ghost")] == [3.0]  # a name never stored: all of it
    assert len(store.list_decisions()) == 5  # the whole log keeps everything


def test_a_restart_carries_no_cooldown_over_from_a_policy_deleted_since(tmp_path: Path) -> None:
    # The core forgets a deleted policy at its next tick, so a policy created again starts without the old
    # scale-down cooldown; a restarted controller must not bring it back from the old log.
    url = f"sqlite+pysqlite:///{tmp_path / 'c.db'}"
    first = Store(url)
    first.create_policy(_policy("p"))
    first.create_policy(_policy("kept"))
    first.append_decisions([_applied("p", 1, 1.0), _applied("kept", 1, 1.0)])
    first.delete_policy("p")
    first.create_policy(_policy("p"))
    first.close()
    store = Store(url)
    core = DecisionCore(config=CoreConfig(tick_interval_s=15))
    service = ControllerService(store=store, source=None, actuator=DryRunActuator(), core=core,  # type: ignore[arg-type]
                                metrics=ControllerMetrics(CollectorRegistry()), clock=lambda: 1000.0)  # fmt: skip
    service.restore_state()
    assert core.state["kept"].last_change_s is not None  # the cooldown of a policy still there carries over
    assert "p" not in core.state or core.state["p"].last_change_s is None
    store.close()


HOUR_S = 1_700_006_400.0  # a whole hour: one load history chunk


def _load(times: list[float], rate: float) -> list[list[float]]:
    return [[HOUR_S + t, rate, 1.0, 1.0] for t in times]


def test_a_restarted_leader_keeps_the_hours_load_history_written_before_it(tmp_path: Path) -> None:
    """A leader restarted (or newly elected) in the middle of an hour opens that hour's chunk with its own samples
    only: writing it replaced the chunk stored, and the forecaster lost the hour's load before the restart."""
    import asyncio

    from controller.load_history import LoadHistoryKeeper
    from controller.types import PolicyObservation

    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    observed = {"p": PolicyObservation(policy="p", observed_at_s=0.0, request_rate_rps=7.0, prompt_tokens_per_s=1.0,
                                       output_tokens_per_s=1.0)}  # fmt: skip

    async def run(start_s: float, ticks: int) -> None:
        clock = [start_s]
        keeper = LoadHistoryKeeper(store, bin_s=15.0, keep_s=3 * 86400.0, wall_clock=lambda: clock[0],
                                   flush_every_ticks=1)  # fmt: skip
        for _ in range(ticks):
            keeper.record(observed)
            await keeper.after_tick(leader=True, policies=["p"])
            clock[0] += 15.0

    asyncio.run(run(HOUR_S, 160))  # the hour's first 40 minutes
    asyncio.run(run(HOUR_S + 45 * 60, 20))  # restarted 5 minutes later
    times = [s[0] - HOUR_S for s in store.load_history("p", since_s=0)]
    assert times == [k * 15.0 for k in range(160)] + [45 * 60 + k * 15.0 for k in range(20)]


def test_a_deposed_leaders_late_write_keeps_the_new_leaders_load_history(tmp_path: Path) -> None:
    """Each write replaces the stored samples over the time its own samples span, and keeps the rest: the new
    leader's, written first, survive the old one's late write of its older samples, and where both recorded the
    same minutes the last write's samples hold them, once."""
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    new_leader = _load([2700.0, 2715.0, 2730.0, 2745.0], 2.0)
    store.save_load_history([("p", HOUR_S, new_leader)])
    store.save_load_history([("p", HOUR_S, _load([0.0, 15.0, 30.0], 1.0))])
    assert [s[1] for s in store.load_history("p", since_s=0)] == [1.0] * 3 + [2.0] * 4
    store.save_load_history([("p", HOUR_S, _load([0.0, 15.0, 30.0, 2705.0, 2720.0], 1.0))])  # overlapping
    assert [s[0] - HOUR_S for s in store.load_history("p", since_s=0)] == [0.0, 15.0, 30.0, 2705.0, 2720.0,
                                                                          2730.0, 2745.0]  # fmt: skip
    store.save_load_history([("p", HOUR_S, new_leader)])
    assert [s[0] - HOUR_S for s in store.load_history("p", since_s=0)] == [0.0, 15.0, 30.0, 2700.0, 2715.0,
                                                                          2730.0, 2745.0]  # fmt: skip
