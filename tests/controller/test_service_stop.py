"""``stop()`` ends the tick loop however the cancellation lands: on Python 3.11, ``asyncio.wait_for`` returns the
result of an await that ends as it is cancelled and drops the cancellation (fixed in 3.12)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controller.policy import Policy
from tests.controller.test_service import Clock, ScriptedSource, _policy, _service


def test_a_stop_that_lands_as_a_bounded_read_ends_still_ends_the_tick_loop(tmp_path: Path) -> None:
    """SIGTERM (the lifespan's ``stop()``) arriving as the metrics read returns: the tick loop ran on, and
    ``stop()`` never returned, so the process waited for SIGKILL and lost its last decision-log flush."""
    clock = Clock()
    stopping: list[asyncio.Task[None]] = []

    class StopAsTheReadEnds(ScriptedSource):
        async def observe(self, policies: Sequence[Policy], now_s: float) -> Any:
            result = await super().observe(policies, now_s)
            if not stopping:
                stopping.append(asyncio.create_task(service.stop()))
            return result

    service, store, _ = _service(tmp_path, clock, source=StopAsTheReadEnds(clock))
    service.tick_interval_s = 0.05
    store.create_policy(_policy())

    async def main() -> tuple[bool, int]:
        await service.start()
        while not stopping:
            await asyncio.sleep(0.01)
        done, _ = await asyncio.wait(set(stopping), timeout=3.0)
        ticks = service.ticks
        if not done and service._task is not None:
            service._task.cancel()  # what the test needs to end; the service must not
            await asyncio.wait(set(stopping), timeout=3.0)
        return bool(done), ticks

    stopped, ticks = asyncio.run(main())
    assert stopped
    assert ticks <= 1  # the tick under way ends; no other one starts
