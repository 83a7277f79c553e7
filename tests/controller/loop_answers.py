"""A check that work runs off the event loop: it waits for the loop to answer, which it could not do on the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any


def run_answering(work: Coroutine[Any, Any, object], begun: threading.Event, answered: threading.Event) -> str:
    """Run ``work``, setting ``answered`` from the loop once ``begun`` is set (what an API read does meanwhile:
    run on the loop); the loop's thread."""

    async def while_answering() -> str:
        running = asyncio.ensure_future(work)
        while not running.done():
            await asyncio.sleep(0.001)
            if begun.is_set():
                answered.set()
        await running
        return threading.current_thread().name

    return asyncio.run(while_answering())
