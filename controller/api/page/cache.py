"""A policy page's decision-log series, kept between the page's reloads.

The page reloads itself every tick, and the decision log only grows (rows never change), so
each reload reads just the decisions logged since the last one (``id > last``) and drops
those that left the range; a day of 15-second ticks is parsed once, not every 15 seconds.
An entry is read again in full after :data:`FULL_READ_EVERY_S` (so rows pruned from the log
leave it too), and at most :data:`MAX_ENTRIES` (policy, range) pairs are kept.  Entries are keyed by
the policy's creation too: one deleted and created again starts with an empty log
(``controller.store.tables.decisions_of``), whoever wrote the change (another replica, the store itself).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from controller.store import DecisionPoint, Store

__all__ = ["FULL_READ_EVERY_S", "MAX_ENTRIES", "SeriesCache"]

MAX_ENTRIES = 8
FULL_READ_EVERY_S = 600.0


@dataclass(frozen=True, slots=True)
class _Entry:
    since_s: float
    last_id: int | None
    points: list[DecisionPoint]
    read_at_s: float
    """Monotonic time of the last full read."""


class SeriesCache:
    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[str, str, datetime | None], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.full_reads = 0
        """How many reads were full (the rest read only new decisions)."""

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def forget(self, policy: str, range_key: str) -> None:
        """Drop the policy's entries for one range (its next read is full); the others stay."""
        with self._lock:
            for key in [k for k in self._entries if k[:2] == (policy, range_key)]:
                del self._entries[key]

    def points(
        self,
        store: Store,
        policy: str,
        range_key: str,
        *,
        since: datetime,
        fields: Mapping[str, Sequence[str]],
        exclude_actions: Sequence[str],
        created_at: datetime | None = None,
    ) -> list[DecisionPoint]:
        """The policy's decision points since ``since``, oldest first, as :meth:`Store.decision_points` gives;
        ``created_at``: when the policy was last created (:attr:`~controller.store.StoredPolicy.created_at`)."""
        key = (policy, range_key, created_at)
        since_s, now_s = since.timestamp(), time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
        usable = entry is not None and entry.since_s <= since_s and now_s - entry.read_at_s < FULL_READ_EVERY_S
        after = entry.last_id if usable and entry is not None else None
        new = store.decision_points(policy, since=since, fields=fields, exclude_actions=exclude_actions,
                                    after_id=after)
        if usable and entry is not None:
            kept = entry.points[bisect.bisect_left(entry.points, since_s, key=lambda p: p.at_s):]
            points, read_at_s = kept + new, entry.read_at_s
        else:
            points, read_at_s = new, now_s
            self.full_reads += 1
        last_id = points[-1].id if points else None
        with self._lock:
            self._entries[key] = _Entry(since_s, last_id, points, read_at_s)
            self._entries.move_to_end(key)
            while len(self._entries) > MAX_ENTRIES:
                self._entries.popitem(last=False)
        return list(points)
