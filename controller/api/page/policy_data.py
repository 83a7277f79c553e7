"""Everything one policy page shows, gathered at one instant: store, runtime view, Prometheus, Alertmanager.

No new source of truth: the status object is the one ``/v1/status/{name}`` serves, the series
come from the decision log (each tick's ``inputs``) and, when ``prometheus_url`` is set, from
Prometheus range queries; alerts from Alertmanager when ``alertmanager_url`` is set.  The
outside calls run concurrently with the store's reads, each with a short timeout, and a
failure becomes a message on the page, never an error page.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

import httpx
from starlette.requests import Request

from contracts.errors import UnavailableError
from contracts.urls import redacted_url
from controller.api.page.alerts import FiringAlert, firing_alerts
from controller.api.page.cache import SeriesCache
from controller.api.page.prom import ChartWindows, PromSeries, RequestRates, alert_request_rates, chart_series
from controller.api.schemas import PolicyStatus
from controller.api.status import build_policy_status, read_now, runtime_view, started_at
from controller.config import ControllerSettings
from controller.policy import Policy
from controller.slo import format_duration
from controller.sources.prometheus import PrometheusClient
from controller.store import DecisionPoint, DecisionRecord, PolicyVersion, Store, StoredPolicy

__all__ = [
    "DEFAULT_RANGE",
    "LOG_FIELDS",
    "RANGES",
    "Outside",
    "PolicyData",
    "gather_policy",
    "outside_client",
    "read_alerts",
    "read_request_rates",
]

RANGES = {"1h": 3600, "6h": 6 * 3600, "1d": 86400, "3d": 3 * 86400}
DEFAULT_RANGE = "6h"
OUTSIDE_TIMEOUT_S = 3.0
"""Prometheus and Alertmanager get this long per page: a slow one makes a message, not a slow page."""
FINER_MARGIN_S = 0.2
"""How long before the page's deadline a chart's second, finer query gives up, so its first answer stands."""
EVENTS_MAX = 400
HISTORY_SHOWN = 10
"""The policy's last versions the page lists (the store reads only those: each version is a whole spec)."""
REBALANCE_ACTIONS = ("rebalance", "verify_rebalance")

LOG_FIELDS: dict[str, tuple[str, ...]] = {
    "load": ("request_rate_rps",),
    "ttft_good": ("ttft_good_ratio",),
    "itl_good": ("itl_good_ratio",),
    "forecast": ("sizing.forecast_request_rate_rps", "predictive.forecast_request_rate_rps"),
    "forecast_upper": ("sizing.forecast_request_rate_upper_rps", "predictive.forecast_request_rate_upper_rps"),
    "forecast_lower": ("sizing.predictive.forecast_lower_rps", "predictive.forecast_lower_rps"),
    "horizon_s": ("sizing.forecast_horizon_s", "predictive.forecast_horizon_s"),
    "imbalance_cv_max": ("imbalance_cv_max",),
}
"""Decision-log inputs the charts read (name -> keys tried in order: the service's core, then a plain one)."""


@dataclass(frozen=True, slots=True)
class Outside:
    """What an outside service answered: data, or why not (None and None: not configured).  ``url`` is the
    shown form, without a user:password (:func:`contracts.urls.redacted_url`)."""

    url: str | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class PolicyData:
    stored: StoredPolicy
    status: PolicyStatus
    history: list[PolicyVersion]
    log: list[DecisionPoint]
    """Scaling decisions in range, oldest first (rebalances are in ``events``)."""
    events: list[DecisionRecord]
    """Decisions other than hold in range, newest first."""
    now: datetime
    range_key: str
    prom: PromSeries | None
    prometheus: Outside
    alerts: list[FiringAlert]
    alertmanager: Outside
    tick_interval_s: float
    sli_window_s: float = 300.0
    """The controller's SLI window: what "good now" and the good ratios (logged or from Prometheus) are over."""
    rate_window_s: float = 60.0
    """The controller's rate window: what the request rates (logged or from Prometheus) are averaged over."""
    last_tick_at: datetime | None = None
    """When the controller's last tick succeeded (None before the first, or without a tick loop)."""
    started_at: datetime | None = None
    """When the controller's tick loop started (the overdue counts from it before the first tick)."""
    request_rates: dict[str, float] | None = None
    """TTFT requests per second over each burn-rate pair's short window, from Prometheus (the alerts'
    low-traffic guard; None without it)."""
    leader: bool = True
    """Whether this controller acts (as ``/v1/status``'s mode: no tick loop, or a standby, is not the leader)."""

    @property
    def sli_window(self) -> str:
        return format_duration(round(self.sli_window_s))

    @property
    def rate_window(self) -> str:
        return format_duration(round(self.rate_window_s))

    @property
    def span_s(self) -> float:
        return float(RANGES[self.range_key])

    @property
    def t0_s(self) -> float:
        """Where the charts start: the range's start, or a little before the first data when it came later
        (a new policy's half hour is not squeezed into the right edge of six hours)."""
        now_s = self.now.timestamp()
        start_s = now_s - self.span_s
        firsts = [self.log[0].at_s] if self.log else []
        firsts += [self.events[-1].at.timestamp()] if self.events else []
        if self.prom is not None:
            firsts += [points[0][0] for points in (self.prom.ttft_good, self.prom.load) if points]
        if not firsts:
            return start_s
        first_s = min(firsts)
        return max(start_s, first_s - max(60.0, 0.03 * (now_s - first_s)))

    def log_series(self, name: str) -> list[tuple[float, float | None]]:
        index = list(LOG_FIELDS).index(name)
        return [(p.at_s, p.values[index]) for p in self.log]


@functools.cache
def _tls() -> ssl.SSLContext:
    # Built once: a fresh client would load the CA bundle again, ~100 ms of every page.
    return httpx.create_ssl_context()


T = TypeVar("T")
_NO_ANSWER = f"no whole answer within {OUTSIDE_TIMEOUT_S:g} s"
"""A server that trickles its answer: the client's timeout is per read, this deadline is the page's."""


def outside_client(request: Request) -> httpx.AsyncClient:
    """A client for Prometheus and Alertmanager (tests put a mock transport in ``app.state.page_transport``)."""
    transport: httpx.AsyncBaseTransport | None = getattr(request.app.state, "page_transport", None)
    return httpx.AsyncClient(transport=transport, timeout=OUTSIDE_TIMEOUT_S, verify=_tls())


async def _ask(url: str, call: Awaitable[T]) -> tuple[T | None, Outside]:
    """``call``'s answer within the page's deadline, or None and why not (``url`` kept without a password)."""
    shown = redacted_url(url)
    try:
        async with asyncio.timeout(OUTSIDE_TIMEOUT_S):
            return await call, Outside(shown)
    except UnavailableError as exc:
        return None, Outside(shown, str(exc))
    except TimeoutError:
        return None, Outside(shown, _NO_ANSWER)


async def read_alerts(client: httpx.AsyncClient, url: str | None) -> tuple[list[FiringAlert], Outside]:
    if url is None:
        return [], Outside(None)
    alerts, outside = await _ask(url, firing_alerts(client, url))
    return alerts or [], outside


async def read_request_rates(
    client: httpx.AsyncClient, settings: ControllerSettings, policies: list[Policy]
) -> tuple[RequestRates | None, Outside]:
    """The alerts' low-traffic guard per policy and short window (None without Prometheus, or when it failed:
    the verdicts then fall back to the controller's own request rate)."""
    url = settings.prometheus_url
    if url is None or not policies:
        return None, Outside(url and redacted_url(url))
    prometheus = PrometheusClient(url, client=client)
    return await _ask(url, alert_request_rates(prometheus, policies, selector=settings.prometheus_selector))


async def _read_prometheus(
    client: httpx.AsyncClient, settings: ControllerSettings, stored: StoredPolicy, now: datetime, span_s: float
) -> tuple[PromSeries | None, Outside]:
    url = settings.prometheus_url
    if url is None:
        return None, Outside(None)
    end_s = now.timestamp()
    prometheus = PrometheusClient(url, client=client)
    windows = ChartWindows(rate_window_s=settings.rate_window_s, sli_window_s=settings.sli_window_s,
                           tick_interval_s=settings.tick_interval_s)
    finer_by = asyncio.get_running_loop().time() + OUTSIDE_TIMEOUT_S - FINER_MARGIN_S
    return await _ask(url, chart_series(prometheus, stored.policy, selector=settings.prometheus_selector,
                                        start_s=end_s - span_s, end_s=end_s, windows=windows, finer_by=finer_by))


def _read_store(
    store: Store, request: Request, stored: StoredPolicy, now: datetime, span_s: float, range_key: str
) -> tuple[PolicyStatus, list[PolicyVersion], list[DecisionPoint], list[DecisionRecord]]:
    name = stored.policy.name
    settings: ControllerSettings = request.app.state.settings
    status = build_policy_status(store, stored, runtime_view(request), stale_after_s=settings.stale_after_s, now=now)
    since = now - timedelta(seconds=span_s)
    history = store.policy_history(name, limit=HISTORY_SHOWN, newest_first=True)[::-1]
    cache: SeriesCache = request.app.state.page_series
    log = cache.points(store, name, range_key, since=since, fields=LOG_FIELDS, exclude_actions=REBALANCE_ACTIONS,
                       created_at=stored.created_at)
    events = store.list_decisions(policy=name, since=since, exclude_actions=("hold",), limit=EVENTS_MAX)
    return status, history, log, events


async def gather_policy(request: Request, name: str, range_key: str) -> PolicyData:
    """The page's data; :class:`NotFoundError` when there is no such policy."""
    store: Store = request.app.state.store
    settings: ControllerSettings = request.app.state.settings
    view = runtime_view(request)
    now = read_now(view)
    span_s = float(RANGES[range_key])
    stored = await asyncio.to_thread(store.get_policy, name)
    async with outside_client(request) as client:
        (status, history, log, events), (prom, prometheus), (alerts, alertmanager), (rates, _) = await asyncio.gather(
            asyncio.to_thread(_read_store, store, request, stored, now, span_s, range_key),
            _read_prometheus(client, settings, stored, now, span_s),
            read_alerts(client, settings.alertmanager_url),
            read_request_rates(client, settings, [stored.policy]),
        )
    return PolicyData(
        stored=stored, status=status, history=history, log=log, events=events, now=now, range_key=range_key,
        prom=prom, prometheus=prometheus, alerts=[a for a in alerts if a.policy == name],
        alertmanager=alertmanager, tick_interval_s=settings.tick_interval_s, sli_window_s=settings.sli_window_s,
        rate_window_s=settings.rate_window_s, last_tick_at=None if view is None else view.last_tick_at,
        started_at=started_at(view),
        request_rates=None if rates is None else rates.get(name), leader=view is not None and view.is_leader,
    )
