"""Time series read out of the decision log: a day of ticks as plain numbers, fast.

Each decision's ``inputs`` hold what the core saw and forecast that tick
(``request_rate_rps``, ``ttft_good_ratio``, ``sizing.forecast_request_rate_rps``,
...).  Charts need a handful of those keys over thousands of rows, so the keys
are read inside the database instead of parsing every row's whole JSON in
Python.  On SQLite, one ``json_extract`` per row reads every key (one parse of
the row's JSON) and the whole answer comes back as one JSON text (one
``json.loads``).  Elsewhere, SQLAlchemy's JSON index
reads each key (``->>`` on PostgreSQL).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, String, func, select, type_coerce

from controller.store.tables import DecisionRow, decisions_of

__all__ = ["DecisionPoint", "PointQuery"]

_EPOCH_NAIVE = datetime(1970, 1, 1)


@dataclass(frozen=True, slots=True)
class DecisionPoint:
    """The numbers of one logged decision."""

    id: int
    at_s: float
    """Unix seconds (the decision's wall-clock time, UTC)."""
    action: str
    outcome: str
    current_replicas: int | None
    desired_replicas: int | None
    values: tuple[float | None, ...]
    """The requested input fields, in the order they were asked for (None: not recorded that tick)."""


def _seconds(at: Any) -> float:
    if isinstance(at, str):  # SQLite: naive UTC text
        return (datetime.fromisoformat(at) - _EPOCH_NAIVE).total_seconds()
    return float((at if at.tzinfo is not None else at.replace(tzinfo=UTC)).timestamp())


_NUMBERS = (int, float)
"""Exact types (``bool`` is an ``int`` subclass but no number here; a string key's value is skipped)."""


@dataclass(frozen=True, slots=True)
class PointQuery:
    """The query for :meth:`Store.decision_points` and the reading of its rows.

    ``fields`` maps a name to the input keys to try in order (the first one recorded wins), e.g.
    ``{"forecast": ("sizing.forecast_request_rate_rps", "predictive.forecast_request_rate_rps")}``.
    """

    fields: Mapping[str, Sequence[str]]
    sqlite: bool

    @property
    def _keys(self) -> list[str]:
        return list(dict.fromkeys(key for keys in self.fields.values() for key in keys))

    def select(
        self, policy: str, *, since: datetime, exclude_actions: Sequence[str], limit: int, after_id: int | None = None
    ) -> Select[Any]:
        """The newest ``limit`` decisions of ``policy`` (since it was last created) at or after ``since`` (with ids
        above ``after_id``)."""
        rows = (
            select(DecisionRow.id, DecisionRow.at, DecisionRow.action, DecisionRow.current_replicas,
                   DecisionRow.desired_replicas, DecisionRow.outcome, DecisionRow.inputs)
            .where(decisions_of(policy), DecisionRow.at >= since)
            .order_by(DecisionRow.id.desc())
            .limit(limit)
        )
        if exclude_actions:
            rows = rows.where(DecisionRow.action.not_in(list(exclude_actions)))
        if after_id is not None:
            rows = rows.where(DecisionRow.id > after_id)
        if not self.sqlite:
            inner = rows.subquery()
            values = [inner.c.inputs[key] for key in self._keys]  # JSON values: numbers kept, others dropped
            return select(inner.c.id, inner.c.at, inner.c.action, inner.c.current_replicas, inner.c.desired_replicas,
                          inner.c.outcome, *values)
        # SQLite: the whole answer as one JSON text (one json.loads in Python), every key read with
        # one json_extract per row.
        inner = rows.subquery()
        paths = [f'$."{key.replace(chr(34), "")}"' for key in self._keys]
        paths += paths[:1] * (2 - len(paths))  # two paths or more: json_extract answers an array
        row = func.json_array(inner.c.id, type_coerce(inner.c.at, String), inner.c.action, inner.c.current_replicas,
                              inner.c.desired_replicas, inner.c.outcome, func.json_extract(inner.c.inputs, *paths))
        return select(type_coerce(func.json_group_array(row), String))

    def points(self, rows: Sequence[Sequence[Any]]) -> list[DecisionPoint]:
        """The rows (or, on SQLite, the one JSON row) as points, oldest first."""
        index = {key: i for i, key in enumerate(self._keys)}
        picks = [[index[key] for key in keys] for keys in self.fields.values()]
        if self.sqlite:
            table = json.loads(rows[0][0]) if rows and rows[0][0] else []
            table.sort(key=lambda r: r[0])
            return [_point(r[0], _seconds(r[1]), r[2:6], r[6], picks) for r in table]
        ordered = sorted(rows, key=lambda r: r[0])
        return [_point(r[0], _seconds(r[1]), r[2:6], r[6:], picks) for r in ordered]


def _point(id_: int, at_s: float, head: Sequence[Any], raw: Sequence[Any], picks: list[list[int]]) -> DecisionPoint:
    values: list[float | None] = []
    for pick in picks:  # plain loops: a day of ticks is thousands of rows
        found = None
        for i in pick:
            value = raw[i]
            if type(value) in _NUMBERS:
                found = float(value)
                break
        values.append(found)
    return DecisionPoint(id=id_, at_s=at_s, action=head[0], current_replicas=head[1], desired_replicas=head[2],
                         outcome=head[3], values=tuple(values))
