"""The requests held at admission (``--admission queue``), first come, first served.

A held request waits in line on an event of its own.  Only the first in line
looks at the replicas (:meth:`HeldRequests.wake` wakes it whenever a replica
may take more than before: a request finished or began its answer, a scrape,
a readmission); the rest wait their turn, so a later arrival never overtakes
an earlier one.  Whoever leaves the line first (admitted, timed out, or its
client gone: the task cancelled) wakes the next, so no wake-up is lost with it.
Everything runs on the event loop's thread: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class HeldRequests:
    def __init__(self) -> None:
        self._line: deque[asyncio.Event] = deque()

    def __len__(self) -> int:
        return len(self._line)

    def join(self, *, first: bool = False) -> asyncio.Event:
        """A place at the end of the line (``first``: at its head, for a request whose turn came and whose replica
        then refused the connection)."""
        place = asyncio.Event()
        if first:
            self._line.appendleft(place)
        else:
            self._line.append(place)
        return place

    def is_first(self, place: asyncio.Event) -> bool:
        return bool(self._line) and self._line[0] is place

    def ahead_of(self, place: asyncio.Event) -> int:
        return self._line.index(place)

    def leave(self, place: asyncio.Event) -> None:
        """Out of the line; the next in line, if this one was first, looks at the replicas."""
        was_first = self.is_first(place)
        with contextlib.suppress(ValueError):
            self._line.remove(place)
        if was_first:
            self.wake()

    def wake(self) -> None:
        """A replica may take more than before: the first in line looks again."""
        if self._line:
            self._line[0].set()

    @staticmethod
    async def wait(place: asyncio.Event, timeout_s: float) -> None:
        """Until this place is woken, or ``timeout_s`` (a client's leaving cancels it: :meth:`leave` then).

        ``asyncio.timeout``, not ``wait_for``: Python 3.11's ``wait_for`` swallows a cancellation that comes as
        the event is set, and a request whose client had left stayed in line.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await place.wait()
        place.clear()


__all__ = ["HeldRequests"]
