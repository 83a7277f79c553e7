"""Decision-log series: input keys read in the database, first recorded key wins, time and action filters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from controller.store import DecisionRecord, Store
from controller.store.series import PointQuery


def _record(at: datetime, action: str = "hold", **inputs: Any) -> DecisionRecord:
    return DecisionRecord(policy="p", policy_version=1, at=at, tick_s=0.0, action=action, reason="r",
                          current_replicas=2, desired_replicas=3, mode="enforce", outcome="held", inputs=inputs)


def test_points_read_the_asked_keys_oldest_first(tmp_path: Path) -> None:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    now = datetime.now(UTC).replace(microsecond=0)
    store.append_decisions([
        _record(now - timedelta(hours=2), request_rate_rps=1.0),
        _record(now - timedelta(minutes=2), request_rate_rps=2, **{"sizing.forecast_request_rate_rps": 2.5}),
        _record(now - timedelta(minutes=1), "rebalance", request_rate_rps=9.0),
        _record(now, request_rate_rps=None, **{"predictive.forecast_request_rate_rps": 3.5, "flag": True}),
    ])
    fields = {"rate": ("request_rate_rps",), "forecast": ("sizing.forecast_request_rate_rps",
                                                          "predictive.forecast_request_rate_rps"),
              "flag": ("flag",)}
    points = store.decision_points("p", since=now - timedelta(hours=1), fields=fields, exclude_actions=("rebalance",))
    assert [p.values for p in points] == [(2.0, 2.5, None), (None, 3.5, None)]
    assert points[-1].at_s == pytest.approx(now.timestamp())
    assert (points[0].current_replicas, points[0].desired_replicas, points[0].action) == (2, 3, "hold")
    one = store.decision_points("p", since=now - timedelta(days=1), fields={"rate": ("request_rate_rps",)})
    assert [p.values for p in one] == [(1.0,), (2.0,), (9.0,), (None,)]
    # The portable query (SQLAlchemy's JSON index per key, as on PostgreSQL) reads the same numbers
    # (on SQLite, a true comes back from JSON_EXTRACT as 1, so the flag is left out here).
    fields.pop("flag")
    points = store.decision_points("p", since=now - timedelta(hours=1), fields=fields, exclude_actions=("rebalance",))
    generic = PointQuery(fields, sqlite=False)
    with store.engine.connect() as conn:
        rows = conn.execute(generic.select("p", since=now - timedelta(hours=1), exclude_actions=("rebalance",),
                                           limit=100)).all()
    assert [(p.values, p.at_s) for p in generic.points(rows)] == [(p.values, p.at_s) for p in points]
    recent = store.list_decisions(policy="p", since=now - timedelta(minutes=3), exclude_actions=("hold",))
    assert [r.action for r in recent] == ["rebalance"]
    store.close()
