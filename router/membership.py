"""The replica set, read from the controller: replicas it adds or removes take or stop taking requests.

Every ``membership_interval_s`` the router reads
``{controller}/v1/policies/{policy}/endpoints`` (the replicas the controller
scrapes for that policy: those its actuator started and those the policy
names).  When no policy is configured, the controller's only policy is
used; with several, the router refuses to guess and says so.  An
unreachable controller or an unreadable answer keeps the last set: routing
goes on to the replicas already known.
"""

from __future__ import annotations

import logging

import aiohttp

from contracts.errors import DataError
from contracts.urls import base_url_problem, redacted_url
from router.forward import UPSTREAM_FAILURES, Router
from router.monitor import Repeating

_log = logging.getLogger(__name__)


def endpoints_from(document: object) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The usable replica URLs of a ``/v1/policies/{name}/endpoints`` answer, and why the others are not.

    The controller accepts URLs with a path (it scrapes ``{path}/metrics``
    behind a gateway); the router forwards ``/v1/...`` to base URLs only, so
    it leaves such a URL out and says why rather than refusing the whole
    list.  DataError when the answer is not a list of strings, or when every
    listed URL is unusable (the current set is then kept).
    """
    if not isinstance(document, dict) or not isinstance(document.get("endpoints"), list):
        raise DataError("the controller's answer has no endpoints list")
    urls = document["endpoints"]
    if not all(isinstance(u, str) for u in urls):
        raise DataError("the controller's endpoints are not all URLs")
    problems = {u: p for u in urls if (p := base_url_problem("endpoint", u)) is not None}
    usable = tuple(dict.fromkeys(u.rstrip("/") for u in urls if u not in problems))
    if urls and not usable:
        raise DataError("the controller lists only replicas the router cannot use: " + "; ".join(problems.values()))
    return usable, tuple(problems.values())


def only_policy(document: object) -> str:
    """The name of the controller's only policy (``GET /v1/policies``); DataError when there is not exactly one."""
    items = document.get("items") if isinstance(document, dict) else None
    names = [i.get("name") for i in items if isinstance(i, dict)] if isinstance(items, list) else []
    if len(names) != 1 or not isinstance(names[0], str):
        raise DataError(f"the controller has {len(names)} policies; name one (--controller-policy)")
    return names[0]


class Membership(Repeating):
    """Keeps ``router``'s replica set equal to the controller's list for one policy."""

    def __init__(self, router: Router) -> None:
        assert router.config.controller_url is not None
        self.router = router
        self.base = router.config.controller_url.rstrip("/")
        self.policy = router.config.controller_policy
        self._timeout = aiohttp.ClientTimeout(total=router.config.scrape_timeout_s * 2)
        self.last_error: str | None = None

    async def _get_json(self, path: str) -> object:
        async with self.session.get(self.base + path, timeout=self._timeout) as answer:
            if answer.status != 200:
                raise DataError(f"the controller answered {path} with HTTP {answer.status}")
            return await answer.json(content_type=None)

    async def refresh(self) -> None:
        """Read the list once and apply it; on failure keep the current set and remember why."""
        try:
            if self.policy is None:
                self.policy = only_policy(await self._get_json("/v1/policies"))
            urls, unusable = endpoints_from(await self._get_json(f"/v1/policies/{self.policy}/endpoints"))
        except (DataError, ValueError, *UPSTREAM_FAILURES) as exc:
            message = str(exc) or type(exc).__name__
            if message != self.last_error:
                _log.warning("replica set not read from %s: %s", redacted_url(self.base), message)
            self.last_error = message
            return
        left_out = "; ".join(unusable) or None
        if left_out is not None and left_out != self.last_error:
            _log.warning("replicas from %s left out: %s", redacted_url(self.base), left_out)
        self.last_error = left_out
        added, removed = self.router.set_replicas(urls)
        for name in added:
            _log.info("replica %s added by the controller", name)
        for name in removed:
            _log.info("replica %s removed by the controller", name)

    async def once(self) -> None:
        await self.refresh()

    @property
    def interval_s(self) -> float:
        return self.router.config.membership_interval_s


__all__ = ["Membership", "endpoints_from", "only_policy"]
