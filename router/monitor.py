"""The router's view of its replicas, refreshed: each live replica's ``/metrics``, each ejected one's ``/health``.

Every ``scrape_interval_s`` all replicas are checked concurrently (each
bounded by ``scrape_timeout_s``):

* a live replica's ``/metrics`` gives its queue, batch and KV usage; a
  refused or broken connection ejects it; a timeout (a busy replica), a 404
  (exporters off) or a body that does not parse keeps the last load (the
  router's own counts still apply);
* an ejected replica's ``/health`` must answer 200 ``readmit_after`` times
  in a row before it takes requests again.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from contracts.errors import DataError
from router.forward import Router
from router.scrape import parse_load


class Monitor:
    def __init__(self, router: Router, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.router = router
        config = router.config
        self.client = httpx.AsyncClient(transport=transport, timeout=config.scrape_timeout_s,
                                        limits=httpx.Limits(max_connections=2 * len(config.replicas)))  # fmt: skip
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> None:
        """Check every replica once."""
        await asyncio.gather(*(self._check(name) for name in self.router.pool.names))

    async def _check(self, name: str) -> None:
        pool = self.router.pool
        if not pool.is_healthy(name):
            try:
                ok = (await self.client.get(name + "/health")).status_code == 200
            except httpx.HTTPError:
                ok = False
            if pool.health_result(name, ok):
                self.router.metrics.healthy[name].set(1)
            return
        try:
            answer = await self.client.get(name + "/metrics")
        except httpx.TimeoutException:
            return  # a busy replica renders /metrics late; its requests still flow (a dead one refuses)
        except httpx.HTTPError:
            self.router.eject(name)
            return
        if answer.status_code != 200:
            return
        with contextlib.suppress(DataError, UnicodeDecodeError):
            pool.update_load(name, parse_load(answer.text))

    async def _run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.router.config.scrape_interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.client.aclose()


__all__ = ["Monitor"]
