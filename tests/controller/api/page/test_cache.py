"""The page's series cache reads only new decisions between reloads, and gives what a full read gives."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from controller.api.page.cache import MAX_ENTRIES, SeriesCache
from controller.policy import Policy
from controller.store import DecisionRecord, Store

FIELDS = {"rate": ("request_rate_rps",)}


def _record(at: datetime, rate: float, action: str = "hold") -> DecisionRecord:
    return DecisionRecord(policy="p", policy_version=1, at=at, tick_s=0.0, action=action, reason="r",
                          current_replicas=1, desired_replicas=1, mode="enforce", outcome="held",
                          inputs={"request_rate_rps": rate})


def test_reloads_read_only_new_decisions_and_match_a_full_read(tmp_path: Path, monkeypatch: Any) -> None:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    cache = SeriesCache()
    start = datetime.now(UTC) - timedelta(hours=2)
    store.append_decisions([_record(start + timedelta(minutes=k), float(k)) for k in range(60)])

    def read(since: datetime, range_key: str = "1h") -> list[Any]:
        return cache.points(store, "p", range_key, since=since, fields=FIELDS, exclude_actions=("rebalance",))

    first = read(start + timedelta(minutes=30))
    assert [p.values[0] for p in first] == [float(k) for k in range(30, 60)] and cache.full_reads == 1
    store.append_decisions([_record(start + timedelta(minutes=60), 60.0), _record(start, -1.0, "rebalance")])
    later = start + timedelta(minutes=40)
    again = read(later)
    full = store.decision_points("p", since=later, fields=FIELDS, exclude_actions=("rebalance",))
    assert again == full and [p.values[0] for p in again] == [float(k) for k in range(40, 61)]
    assert cache.full_reads == 1  # only the decisions after the last one seen were read
    read(start, "6h")  # another range is another entry
    assert cache.full_reads == 2
    monkeypatch.setattr("controller.api.page.cache.time.monotonic", lambda: 1e12)
    assert read(later) == full and cache.full_reads == 3  # read in full again after a while
    for k in range(MAX_ENTRIES + 2):
        read(later, f"r{k}")
    assert len(cache._entries) == MAX_ENTRIES
    store.close()


def test_an_earlier_start_reads_in_full(tmp_path: Path) -> None:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    cache = SeriesCache()
    now = datetime.now(UTC)
    store.append_decisions([_record(now - timedelta(minutes=k), float(k)) for k in range(10)])
    recent = cache.points(store, "p", "1h", since=now - timedelta(minutes=3), fields=FIELDS, exclude_actions=())
    wider = cache.points(store, "p", "1h", since=now - timedelta(minutes=8), fields=FIELDS, exclude_actions=())
    assert len(recent) == 4 and len(wider) == 9 and cache.full_reads == 2
    cache.clear()
    assert cache.points(store, "p", "1h", since=now - timedelta(minutes=3), fields=FIELDS,
                        exclude_actions=()) == recent
    store.close()


def test_a_policy_deleted_and_created_again_is_drawn_from_its_new_log(make_page: Any) -> None:
    """The store starts a re-created policy with an empty log; the cache went on drawing the old one's 20 ticks
    of 9 replicas for up to 10 minutes (a delete by another replica, or in the store, clears nothing here)."""
    page = make_page()
    policy = Policy.model_validate({"name": "p", "target": {"kind": "model", "model": "m"}})
    stored = page.store.create_policy(policy)
    now = datetime.now(UTC)
    page.store.append_decisions([replace(_record(now - timedelta(minutes=30 - k), 50.0), current_replicas=9,
                                         policy_version=stored.version) for k in range(20)])
    assert 'data-series="current" data-n="20"' in page.client.get("/ui/policies/p").text
    page.store.delete_policy("p")
    page.store.create_policy(policy)
    html = page.client.get("/ui/policies/p").text
    assert 'data-series="current"' not in html and "No scaling" in html
