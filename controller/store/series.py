"""Time series read out of the decision log: a day of ticks as plain numbers, fast.

Each decision's ``inputs`` hold what the core saw and forecast that tick
(``request_rate_rps``, ``ttft_good_ratio``, ``sizing.forecast_request_rate_rps``,
...).  Charts need a handful of those keys over thousands of rows, so the keys
are read inside the database instead of parsing every row's whole JSON in
Python: on SQLite one ``json_extract`` with every path (one parse per row, the
answer a short JSON array), elsewhere SQLAlchemy's JSON index per key (``->>``
on PostgreSQL).  ``at`` comes back as the database's text when it stores text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, String, func, select, type_coerce

from controller.store.tables import DecisionRow

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

    def select(self, policy: str, *, since: datetime, exclude_actions: Sequence[str], limit: int) -> Select[Any]:
        """The newest ``limit`` decisions of ``policy`` at or after ``since``, newest first."""
        if self.sqlite:
            paths = [f'$."{key.replace(chr(34), "")}"' for key in self._keys]
            paths += paths[:1] * (2 - len(paths))  # two paths or more: json_extract answers an array
            values: list[Any] = [type_coerce(func.json_extract(DecisionRow.inputs, *paths), String)]
        else:
            values = [DecisionRow.inputs[key].as_float() for key in self._keys]
        query = (
            select(DecisionRow.id, type_coerce(DecisionRow.at, String), DecisionRow.action,
                   DecisionRow.current_replicas, DecisionRow.desired_replicas, DecisionRow.outcome, *values)
            .where(DecisionRow.policy == policy, DecisionRow.at >= since)
            .order_by(DecisionRow.id.desc())
            .limit(limit)
        )
        if exclude_actions:
            query = query.where(DecisionRow.action.not_in(list(exclude_actions)))
        return query

    def points(self, rows: Sequence[Sequence[Any]]) -> list[DecisionPoint]:
        """The rows as points, oldest first."""
        index = {key: i for i, key in enumerate(self._keys)}
        picks = [[index[key] for key in keys] for keys in self.fields.values()]
        out = []
        for row in reversed(rows):  # plain loops: a day of ticks is thousands of rows
            raw = json.loads(row[6]) if self.sqlite else row[6:]
            values: list[float | None] = []
            for pick in picks:
                found = None
                for i in pick:
                    value = raw[i]
                    if type(value) in _NUMBERS:
                        found = float(value)
                        break
                values.append(found)
            out.append(DecisionPoint(id=row[0], at_s=_seconds(row[1]), action=row[2], current_replicas=row[3],
                                     desired_replicas=row[4], outcome=row[5], values=tuple(values)))
        return out
