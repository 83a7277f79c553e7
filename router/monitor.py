"""The router's view of its replicas, refreshed: each live replica's ``/metrics``, each ejected one's ``/health``.

Every ``scrape_interval_s`` all replicas are checked concurrently (each
bounded by ``scrape_timeout_s``):

* a live replica's ``/metrics`` gives its queue, batch and KV usage (and so
  which of the router's whole-answer requests are past their prefill); a
  refused or broken connection ejects it; a timeout (a busy replica), a 404
  (exporters off) or a body that does not parse (or holds NaN) keeps the last load (the
  router's own counts still apply), but ``eject_after_silent`` timeouts in a
  row eject it (a frozen process accepts connections and never answers);
* a live replica's ``/health`` answering 5xx ejects it: an engine whose core died keeps its API
  process, which still serves ``/metrics`` (its last load, the lightest of all) and fails every request;
* an ejected replica's ``/health`` must answer 200 ``readmit_after`` times
  in a row before it takes requests again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp

from contracts.errors import DataError
from router.forward import UPSTREAM_FAILURES, Router
from router.scrape import parse_load

_log = logging.getLogger(__name__)


class Repeating:
    """A task on the server's event loop that runs :meth:`once` every :attr:`interval_s` until stopped.

    Its HTTP client is its own, uncapped: with ``max_connections`` set, the
    forwarding pool can be full of long streams, and a check waiting there
    for a connection would time out and eject a healthy replica as frozen.
    """

    _task: asyncio.Task[None] | None = None
    _session: aiohttp.ClientSession | None = None

    async def once(self) -> None:
        raise NotImplementedError

    @property
    def interval_s(self) -> float:
        raise NotImplementedError

    async def _run(self) -> None:
        last_error: str | None = None
        while True:
            try:
                await self.once()
            except Exception as exc:  # a bug in one round must not end the rounds (nothing awaits this task)
                if repr(exc) != last_error:  # once per distinct error, not every interval
                    _log.exception("%s: one round failed; the next runs as usual", type(self).__name__)
                last_error = repr(exc)
            else:
                last_error = None
            await asyncio.sleep(self.interval_s)

    @property
    def session(self) -> aiohttp.ClientSession:
        """The checks' client (made on first use, inside the server's event loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
                                                  cookie_jar=aiohttp.DummyCookieJar())  # fmt: skip
        return self._session

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None


class Monitor(Repeating):
    def __init__(self, router: Router) -> None:
        self.router = router
        self._timeout = aiohttp.ClientTimeout(total=router.config.scrape_timeout_s)

    async def _get(self, url: str) -> tuple[int, bytes]:
        async with self.session.get(url, timeout=self._timeout) as answer:
            return answer.status, await answer.read()

    async def tick(self) -> None:
        """Check every replica once."""
        await asyncio.gather(*(self._check(name) for name in self.router.pool.names))

    async def _check(self, name: str) -> None:
        pool = self.router.pool
        if not pool.is_healthy(name):
            try:
                ok = (await self._get(name + "/health"))[0] == 200
            except UPSTREAM_FAILURES:
                ok = False
            if pool.health_result(name, ok):
                self.router.metrics.healthy[name].set(1)
            return
        begun = pool.begun  # the requests this scrape is newer than
        try:
            status, body = await self._get(name + "/metrics")
        except TimeoutError:
            # A busy replica renders /metrics late and its requests still flow; one silent for
            # eject_after_silent scrapes in a row is frozen (a dead one refuses at once).
            if pool.scrape_timed_out(name):
                _log.warning("replica %s answered none of its last %d scrapes: ejected, and the requests waiting on "
                             "it ended", name, pool.eject_after_silent)
                self.router.eject(name, frozen=True)
            return
        except UPSTREAM_FAILURES:
            self.router.eject(name)
            return
        pool.scrape_answered(name)
        if await self._reports_unhealthy(name):
            _log.warning("replica %s answers /health with an error: ejected until it passes again", name)
            self.router.eject(name)
            return
        if status != 200:
            return
        with contextlib.suppress(DataError, UnicodeDecodeError):
            pool.update_load(name, parse_load(body.decode()), begun_before=begun)

    async def _reports_unhealthy(self, name: str) -> bool:
        """``/health`` answered with a server error (a timeout or a refusal says nothing the scrape did not)."""
        try:
            return (await self._get(name + "/health"))[0] >= 500
        except (TimeoutError, *UPSTREAM_FAILURES):
            return False

    async def once(self) -> None:
        await self.tick()

    @property
    def interval_s(self) -> float:
        return self.router.config.scrape_interval_s


__all__ = ["Monitor", "Repeating"]
