"""Leader election: exactly one controller replica acts; the others stand by and serve reads.

With several replicas (production on Kubernetes) the replicas compete for a
``coordination.k8s.io/v1`` Lease, as client-go's leader election does:

- the holder renews the lease every ``renew_period_s``; it stays leader only
  while its last successful renewal is younger than
  ``lease_duration_s - renew_period_s``, so it steps down *before* anyone
  else may take over;
- a renewal counts from when its round began (before its requests were sent),
  not from when its answer came;
- a candidate takes the lease over when the lease record has not changed for
  the record's ``leaseDurationSeconds`` (the holder's setting, rounded up to
  whole seconds; its own ``lease_duration_s`` when the record has none) *on the candidate's own
  monotonic clock* (no trust in clock agreement between machines), bumping
  ``leaseTransitions``;
- every write carries the lease's ``resourceVersion``: two candidates racing
  for the same lapse get one success and one 409;
- a leader that shuts down releases the lease (empty holder), so a standby
  takes over at its next round instead of waiting out the lease. A round still
  in flight is waited for first (cancelling the loop's task does not stop the
  thread a round runs in), and the release then has ``renew_period_s`` of its
  own for its read and its write;
- rounds start every ``renew_period_s`` counted from the previous round's
  start (the next one at once when a round took longer), and each request
  may take half of that, so a round of a read and a write fits in the
  period: on a slow API server the renewals do not drift apart until the
  leadership lapses between them;
- ``acquireTime`` and ``renewTime`` are ``metav1.MicroTime``: the API server
  parses them with exactly six fractional digits (RFC 3339 micro), which the
  kubernetes client's ``isoformat()`` leaves out when the microseconds are 0,
  so they are written as :class:`MicroTime`.

In the embedded mode (one process on SQLite) :class:`AlwaysLeader` is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from controller.config import LeaderElectionConfig

if TYPE_CHECKING:
    from kubernetes import client as k8s

log = logging.getLogger(__name__)


class LeaderElector(Protocol):
    @property
    def is_leader(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class AlwaysLeader:
    """The embedded mode's elector: the only process always acts."""

    is_leader = True
    identity = "embedded"

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def utc_now() -> datetime:
    return datetime.now(UTC)


class MicroTime(datetime):
    """A Lease time as the API server reads it: ``metav1.MicroTime``, RFC 3339 with exactly six fractional
    digits, in UTC (``2026-03-01T12:00:00.000000Z``). The kubernetes client writes datetimes with
    ``isoformat()``, which drops the fraction when the microseconds are 0: a 400, one write in a million."""

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return self.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    @classmethod
    def of(cls, value: object, default: datetime) -> MicroTime:
        """``value`` as read back (a datetime, or a string where the client leaves one), else ``default``;
        one without a zone is taken as UTC."""
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                value = default
        moment = value if isinstance(value, datetime) else default
        utc = (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).astimezone(UTC)
        return cls(utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second, utc.microsecond, tzinfo=UTC)


class LeaseElector:
    """Leader election over a Lease; see the module docstring."""

    def __init__(
        self,
        client: k8s.ApiClient,
        config: LeaderElectionConfig,
        *,
        identity: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = utc_now,
    ) -> None:
        # The kubernetes client is imported here, not at module level: it takes a second to import.
        import urllib3
        from kubernetes import client as k8s_client
        from kubernetes.client.exceptions import ApiException

        self._k8s = k8s_client
        self._api_error = ApiException
        self._transport_errors: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError, OSError)
        self._all_errors: tuple[type[Exception], ...] = (ApiException, *self._transport_errors)
        self.config = config
        # A round (a read and a write) must fit in the renew period: a silent API server must not hold it past
        # the next renewal, nor the release at shutdown past its own deadline.
        self._timeout_s = config.renew_period_s / 2
        self.identity = identity or config.identity or default_identity()
        self.api = k8s_client.CoordinationV1Api(client)
        self.clock = clock
        self.wall_clock = wall_clock
        # A round and the release never overlap: the release reads the lease after the last renewal's write.
        self._round_lock = threading.Lock()
        self._observed: tuple[str | None, str | None, str | None] | None = None
        self._observed_at_s = 0.0
        self._renewed_at_s: float | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        if self._renewed_at_s is None:
            return False
        deadline_s = self.config.lease_duration_s - self.config.renew_period_s
        return self.clock() - self._renewed_at_s < deadline_s

    def try_acquire_or_renew(self) -> bool:
        """One election round; returns whether this replica leads afterwards."""
        with self._round_lock:
            try:
                self._round()
            except self._api_error as exc:
                if exc.status != 409:
                    log.warning("leader election: lease %s: HTTP %s %s", self.config.lease_name, exc.status,
                                exc.reason)
            except self._transport_errors as exc:
                log.warning("leader election: lease %s: %s", self.config.lease_name, exc)
        return self.is_leader

    def _round(self) -> None:
        cfg = self.config
        now = self.wall_clock()
        # A renewal counts from before it was sent, as client-go's: its answer may come late (a slow API server),
        # and the standbys count from when they read the record, which is after the write.
        sent_s = self.clock()
        try:
            lease = self.api.read_namespaced_lease(cfg.lease_name, cfg.namespace, _request_timeout=self._timeout_s)
        except self._api_error as exc:
            if exc.status != 404:
                raise
            self.api.create_namespaced_lease(
                cfg.namespace,
                self._k8s.V1Lease(
                    metadata=self._k8s.V1ObjectMeta(name=cfg.lease_name, namespace=cfg.namespace),
                    spec=self._spec(now, acquire_time=now, transitions=0),
                ),
                _request_timeout=self._timeout_s,
            )
            self._renewed_at_s = sent_s
            return
        spec = lease.spec or self._k8s.V1LeaseSpec()
        meta = lease.metadata or self._k8s.V1ObjectMeta()
        record = (spec.holder_identity, str(spec.renew_time), meta.resource_version)
        if record != self._observed:
            self._observed, self._observed_at_s = record, self.clock()
        holder = spec.holder_identity
        if holder == self.identity:
            lease.spec = self._spec(now, acquire_time=spec.acquire_time or now, transitions=spec.lease_transitions or 0)
            self.api.replace_namespaced_lease(cfg.lease_name, cfg.namespace, lease, _request_timeout=self._timeout_s)
            self._renewed_at_s = sent_s
            return
        self._renewed_at_s = None
        # The holder's duration, not ours: during a rolling update that changes it, the two settings differ.
        lapsed = self.clock() - self._observed_at_s >= (spec.lease_duration_seconds or cfg.lease_duration_s)
        if holder and not lapsed:
            return
        lease.spec = self._spec(now, acquire_time=now, transitions=(spec.lease_transitions or 0) + 1)
        self.api.replace_namespaced_lease(cfg.lease_name, cfg.namespace, lease, _request_timeout=self._timeout_s)
        self._renewed_at_s = sent_s
        log.info("leader election: %s took lease %s over from %r", self.identity, cfg.lease_name, holder)

    def _spec(
        self, now: datetime, *, acquire_time: object, transitions: int, holding: bool = True
    ) -> k8s.V1LeaseSpec:
        """This replica's record (``holding``), or the released one: no holder, a lease of 1 s, as client-go's."""
        return self._k8s.V1LeaseSpec(
            holder_identity=self.identity if holding else None,
            # Rounded up: a standby waits the record's whole seconds, never less than this holder leads for.
            lease_duration_seconds=math.ceil(self.config.lease_duration_s) if holding else 1,
            acquire_time=MicroTime.of(acquire_time, now),
            renew_time=MicroTime.of(now, now),
            lease_transitions=transitions,
        )

    def release(self) -> None:
        """Give the lease up (empty holder) if this replica holds it.

        A round in flight is waited for first (``renew_period_s`` at the most, as long as a round may take): a
        renewal written between the release's read and its write would turn the release into a 409 and leave
        the standbys waiting out the lease. The release then has a read and a write's time of its own, not
        what the wait left of it. Should a 409 come all the same (the round outlasted the wait), the lease is
        read again and released if still held.
        """
        waited = self._round_lock.acquire(timeout=self.config.renew_period_s)
        try:
            if self._renewed_at_s is None:
                return
            self._renewed_at_s = None
            self._release_by(time.monotonic() + 2 * self._timeout_s)
        except self._all_errors as exc:
            log.warning("leader election: releasing lease %s failed: %s", self.config.lease_name, exc)
        finally:
            if waited:
                self._round_lock.release()

    def _release_by(self, deadline_s: float) -> None:
        cfg = self.config
        for attempt in (1, 2):
            lease = self.api.read_namespaced_lease(cfg.lease_name, cfg.namespace,
                                                   _request_timeout=_left(deadline_s, self._timeout_s))
            spec = lease.spec
            if spec is None or spec.holder_identity != self.identity:
                return
            lease.spec = self._spec(self.wall_clock(), acquire_time=spec.acquire_time,
                                    transitions=spec.lease_transitions or 0, holding=False)
            try:
                self.api.replace_namespaced_lease(cfg.lease_name, cfg.namespace, lease,
                                                  _request_timeout=_left(deadline_s, self._timeout_s))
                return
            except self._api_error as exc:
                if exc.status != 409 or attempt == 2:
                    raise

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started_s = loop.time()
            try:
                await asyncio.to_thread(self.try_acquire_or_renew)
            except Exception:
                # An unexpected answer must not end the loop: this replica then simply stops leading.
                log.exception("leader election round failed")
            # From the round's start: a slow round's time is not added to the period before the next renewal.
            await asyncio.sleep(max(0.0, self.config.renew_period_s - (loop.time() - started_s)))

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="leader-election")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await asyncio.to_thread(self.release)


def _left(deadline_s: float, cap_s: float) -> float:
    """The time a request may still take before ``deadline_s`` (monotonic), ``cap_s`` at the most; a
    ``TimeoutError`` once it is past."""
    left_s = deadline_s - time.monotonic()
    if left_s <= 0:
        raise TimeoutError("no time left before the deadline")
    return min(left_s, cap_s)
