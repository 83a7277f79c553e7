"""The decision log's writer: a record the store refuses is dropped and counted, and the others are written; an
outage keeps every record for the next write."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry

from contracts.errors import UnavailableError
from controller.decision_log import DecisionLogWriter
from controller.store import DecisionRecord, DecisionRefusedError, Store
from controller.telemetry import ControllerMetrics

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _record(k: int) -> DecisionRecord:
    return DecisionRecord(policy="chat", policy_version=1, at=T0 + timedelta(seconds=15 * k), tick_s=15.0 * k,
                          action="hold", reason="within_slo", current_replicas=1, desired_replicas=1,
                          mode="enforce", outcome="held", inputs={"k": k})  # fmt: skip


UNENCODABLE = replace(_record(1), inputs={"k": 1, "when": object()})
"""Inputs the JSON column cannot hold: written again, it fails again."""
NULL_REASON = replace(_record(2), reason=None)  # type: ignore[arg-type]
"""A NOT NULL column left empty."""


def _writer(tmp_path: Path) -> tuple[DecisionLogWriter, Store, CollectorRegistry]:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    registry = CollectorRegistry()
    return DecisionLogWriter(store, ControllerMetrics(registry)), store, registry


def _logged(store: Store) -> list[int]:
    return [d.inputs["k"] for d in reversed(store.list_decisions())]


def test_the_store_tells_a_refused_record_from_an_outage(tmp_path: Path) -> None:
    _, store, _ = _writer(tmp_path)
    for bad in (UNENCODABLE, NULL_REASON):
        try:
            store.append_decisions([_record(0), bad])
        except DecisionRefusedError:
            pass
        else:
            raise AssertionError("a record the database cannot hold was written")
    assert store.list_decisions() == []  # one transaction: none of the batch


def test_a_refused_record_is_dropped_and_counted_and_the_others_are_written(tmp_path: Path) -> None:
    """A record the store refuses was kept and sent first by every later write, which then failed too: the whole
    log stopped for good."""
    writer, store, registry = _writer(tmp_path)
    assert asyncio.run(writer.append([_record(0), UNENCODABLE, _record(3), NULL_REASON, _record(4)]))
    assert _logged(store) == [0, 3, 4] and writer.pending == []
    assert writer.refused == 2
    assert registry.get_sample_value("moeslo_errors_total", {"component": "store"}) == 2
    assert asyncio.run(writer.append([_record(5)]))  # the next write is not held back by them
    assert _logged(store) == [0, 3, 4, 5]


def test_an_outage_keeps_every_record_for_the_next_write(tmp_path: Path) -> None:
    writer, store, _ = _writer(tmp_path)
    real = store.append_decisions
    down = True

    def append(records):  # type: ignore[no-untyped-def]
        if down:
            raise UnavailableError("policy store (sqlite): database is locked")
        return real(records)

    store.append_decisions = append  # type: ignore[method-assign]
    assert not asyncio.run(writer.append([_record(0), _record(1)]))
    assert len(writer.pending) == 2 and writer.refused == 0
    down = False
    assert asyncio.run(writer.append([_record(2)]))
    assert _logged(store) == [0, 1, 2]


def test_an_outage_while_a_refused_batch_is_written_one_by_one_keeps_the_rest(tmp_path: Path) -> None:
    writer, store, _ = _writer(tmp_path)
    real, calls = store.append_decisions, []

    def append(records):  # type: ignore[no-untyped-def]
        calls.append(len(records))
        if len(calls) == 3:  # the batch (refused), the first record alone, then the store goes away
            raise UnavailableError("policy store (sqlite): database is locked")
        return real(records)

    store.append_decisions = append  # type: ignore[method-assign]
    assert not asyncio.run(writer.append([_record(0), UNENCODABLE, _record(3)]))
    assert _logged(store) == [0] and writer.pending == [UNENCODABLE, _record(3)] and writer.refused == 0
    assert asyncio.run(writer.append())
    assert _logged(store) == [0, 3] and writer.refused == 1
