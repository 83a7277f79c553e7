"""Work that must not be cut in half by a cancellation (a shutdown): run to its end first, or for a grace."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
_T = TypeVar("_T")

LOOP_SWITCH_INTERVAL_S = 0.001
"""How long a thread may hold the GIL while another waits for it.  Python's 5 ms let the service's worker thread
(the tick, the refits) hold its event loop ~32 ms a tick at 100 policies with forecasts (``moeslo bench
controller-service --predictive``, the median); at 1 ms, ~8 ms, the tick's own time about the same."""


def favour_the_event_loop() -> float:
    """Let an event loop's thread in sooner while worker threads compute (process-wide); the interval it replaces."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(LOOP_SWITCH_INTERVAL_S)
    return previous


async def run_to_end(work: Coroutine[Any, Any, _T], *, grace_s: float | None = None) -> _T:
    """Await ``work``; when the awaiting task is cancelled meanwhile, ``work`` still runs, to its end or for
    ``grace_s`` more seconds at most (None: no limit), and the cancellation is raised after it (so it is delayed,
    never swallowed).  ``work`` must bound its own time.

    When the grace runs out, ``work`` is cancelled in turn and awaited: it may catch that cancellation to record
    what it cut short (briefly), and must raise it again."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    cancelled = False
    while not task.done():
        try:  # a cancellation ends this wait, not the task
            await asyncio.wait({task}, timeout=None if deadline is None else max(0.0, deadline - loop.time()))
        except asyncio.CancelledError:
            if not cancelled and grace_s is not None:
                deadline = loop.time() + grace_s
            cancelled = True
            continue
        if deadline is not None and not task.done():
            log.warning("work still running %.3g s after a cancellation is cut short", grace_s)
            task.cancel()
            deadline = None  # then it ends as soon as it has recorded what it cut short
    if cancelled:
        if not task.cancelled() and task.exception() is not None:
            log.error("work finished before a cancellation failed", exc_info=task.exception())
        raise asyncio.CancelledError
    return task.result()
