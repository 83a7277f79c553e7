"""Work that outlives the call that starts it: a replica's stop, which drains for up to its stop timeout.

Awaited, a local replica's drain held the controller's tick loop, every policy's ticks, for that long.  Each stop
runs on a thread of this pool's own (on the event loop's default pool, a few drains held every other ``to_thread``
call, the store's reads at each tick's start, behind them), tracked by its thread's future rather than an event
loop's, since a stop may outlive the loop that started it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

_T = TypeVar("_T")


class BackgroundWork(Generic[_T]):
    """``work(item)`` for each item started, at most ``max_at_once`` at a time, each on a thread of its own."""

    def __init__(self, work: Callable[[_T], None], *, max_at_once: int, name: str) -> None:
        self._work = work
        self._max_at_once = max_at_once
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._running: dict[Future[None], _T] = {}
        self._lock = threading.Lock()  # a thread takes its own item off when it ends

    def start(self, item: _T) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max_at_once, thread_name_prefix=self._name)
            future = self._pool.submit(self._work, item)
            self._running[future] = item
        future.add_done_callback(self._ended)

    def _ended(self, future: Future[None]) -> None:
        with self._lock:
            self._running.pop(future, None)

    def running(self) -> list[_T]:
        """The items whose work has not ended."""
        with self._lock:
            return list(self._running.values())

    async def wait(self) -> None:
        """Return once every item's work has ended.  Cancelled, the work goes on (``asyncio.wait`` cancels none)."""
        while futures := self._futures():
            await asyncio.wait([asyncio.wrap_future(future) for future in futures])

    def _futures(self) -> list[Future[None]]:
        with self._lock:
            return list(self._running)

    def shutdown(self) -> None:
        """Let the idle threads go (work still running ends on its own; a later :meth:`start` makes a new pool)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
