"""Work that must not be cut in half by a cancellation (a shutdown), run to its end first."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
_T = TypeVar("_T")


async def run_to_end(work: Coroutine[Any, Any, _T]) -> _T:
    """Await ``work``; when the awaiting task is cancelled meanwhile, ``work`` still runs to its end, and the
    cancellation is raised after it (so it is delayed, never swallowed).  ``work`` must bound its own time."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})  # a cancellation ends this wait, not the task
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled() and task.exception() is not None:
            log.error("work finished before a cancellation failed", exc_info=task.exception())
        raise asyncio.CancelledError
    return task.result()
