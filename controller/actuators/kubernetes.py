"""The Kubernetes actuator: the ``scale`` subresource of a Deployment or LeaderWorkerSet, or an HPA's floor.

- Deployment: ``apps/v1 .../deployments/{name}/scale``;
- LeaderWorkerSet: ``leaderworkerset.x-k8s.io/v1 .../leaderworkersets/{name}/scale``
  (custom-object scale);
- a policy whose target names an ``hpa``: that HorizontalPodAutoscaler owns
  the replica count, so the controller raises or lowers its ``minReplicas``
  (and lifts ``maxReplicas`` when the new floor would exceed it).  The count
  it reports is the higher of that floor and the workload's own count (the
  HPA may have scaled above its floor); a scale sets the floor to the
  decided count, skipped when the floor already is that count.

Each read also lists the workload's ready pods (the scale subresource's
``status.selector``; for a LeaderWorkerSet that selects the group leaders),
so :meth:`KubernetesActuator.endpoints` can name them to the entry router.

Every write follows a read and carries the object's ``resourceVersion``
(a scale subresource is replaced; an HPA gets a JSON merge patch of just the
fields the actuator sets, so the spec fields the installed client's model
does not know, from a newer API server, stay).  The caller passes the count
its decision was made from (``expected``, as :meth:`KubernetesActuator.replicas`
reports it): when the scale's first read finds another, another writer
changed it since the tick's read, and nothing is written.  A concurrent change
is a 409, after which the actuator re-reads; if the count is already right it
stops, and if another writer changed the count it stops without overwriting
it (the decision was made from the old count; the next tick decides from the
new one).  5xx, 429 and connection errors are retried with exponential
backoff (never sooner than an answer's ``Retry-After`` asks), all attempts of
one call within ``retry_deadline_s``: every request of the call (a read, the
HPA list, the write, in a row) takes its timeout from what is left of that one
deadline, which a scale-down's pod costs extend by what they took (at most
``MARK_BUDGET_S``), so the call ends within the service's bound on it and a
stalled API server cannot hold the tick loop for ``max_attempts`` request
timeouts.  Because the write sets an
absolute count and is skipped when the count already matches, a retry after
a write that was applied but answered with an error never applies it twice;
when the last attempt's answer was an error, one more read tells whether
the write landed.

Only the leader scales, and the retries of one call can outlast the lease:
``still_leading`` is asked right before each write, and once it says False
the call stops with :class:`~controller.errors.LeadershipLostError`, nothing
more written (the replica that holds the lease now reads the count afresh).

An HPA's ``maxReplicas`` lifted to fit a higher floor is remembered in an
annotation and given back when the floor comes down again.

The official ``kubernetes`` client is synchronous; calls run in a worker
thread so the tick loop's event loop never blocks on the API server.  A call
whose await is cut off (the tick's bound on a scale or a read, a shutdown)
tells its thread to stop: it sends no further request, so no write lands
after the tick logged the scale failed, and threads do not pile up behind an
API server that stalls (a request in flight runs to its own timeout).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from contracts.errors import ValidationError
from controller.actuators.base import ReplicaCount, ScaleResult, StillLeading, always_leading
from controller.actuators.kube_calls import (
    CallDeadline,
    api_error,
    describe,
    given_up,
    hpa_floor_patch,
    lost_lease,
    malformed,
    retry_after_s,
    workload_of,
)  # fmt: skip
from controller.actuators.kube_pods import MERGE_PATCH, LoadReader, mark_for_deletion, ready_pods
from controller.config import FINAL_READ_TIMEOUT_S, MARK_BUDGET_S, KubernetesConfig
from controller.errors import ActuationError, LeadershipLostError
from controller.policy import KubernetesTarget, Policy

LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_VERSION = "v1"
LWS_PLURAL = "leaderworkersets"
RETRIED_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
_T = TypeVar("_T")
log = logging.getLogger(__name__)


def api_client(config: KubernetesConfig) -> k8s.ApiClient:
    """An API client from explicit host, in-cluster service account, or kubeconfig (in that order)."""
    configuration = k8s.Configuration()
    if config.host is not None:
        configuration.host = config.host
        return _without_retries(configuration)
    source = "the in-cluster service account" if config.in_cluster else (
        f"kubeconfig {config.kubeconfig or '(KUBECONFIG or ~/.kube/config)'}")
    try:
        if config.in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=config.kubeconfig, context=config.context, client_configuration=configuration
            )
    except (ConfigException, OSError) as exc:  # the client says what; the user needs to know which setting
        raise ValidationError(f"kubernetes: cannot load {source}: {exc}") from exc
    return _without_retries(configuration)


def _without_retries(configuration: k8s.Configuration) -> k8s.ApiClient:
    # Our own retry loop decides what is retried; urllib3 must not retry writes behind our back.
    configuration.retries = False
    return k8s.ApiClient(configuration)


@dataclass(frozen=True, slots=True)
class _Read:
    desired: int
    ready: int | None
    obj: Any


class KubernetesActuator:
    """Scales Deployments, LeaderWorkerSets, or HPA floors; see the module docstring."""

    name = "kubernetes"

    def __init__(
        self,
        client: k8s.ApiClient,
        *,
        config: KubernetesConfig | None = None,
        sleep: Callable[[float], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        read_load: LoadReader | None = None,
    ) -> None:
        self.config = config or KubernetesConfig()
        self._read_load = read_load
        """Pods' requests in flight, written as their deletion costs before a scale-down (None: not written)."""
        self.client = client
        self.apps = k8s.AppsV1Api(client)
        self.custom = k8s.CustomObjectsApi(client)
        self.autoscaling = k8s.AutoscalingV2Api(client)
        self.core = k8s.CoreV1Api(client)
        self._endpoints: dict[str, tuple[str, ...]] = {}
        """Per policy, its ready pods' base URLs at the last read."""
        self._sleep = sleep
        """The backoff's wait (tests pass their own); None: a wait on the call's stop, which a cut-off ends."""
        self._clock = clock
        self.writes = 0
        """Writes sent (including ones that failed): tests check a retry never doubles them."""

    def check(self, policy: Policy) -> list[str]:
        target = policy.target
        if policy.mode == "enforce" and not isinstance(target, KubernetesTarget) and target.kind != "model":
            return [f"target.kind: {policy.target.kind!r} cannot be scaled by the kubernetes actuator"]
        if isinstance(target, KubernetesTarget) and target.hpa is not None and policy.scaling.min_replicas < 1:
            return [
                f"scaling.min_replicas: {policy.scaling.min_replicas} would set the HPA {target.hpa!r}'s minReplicas "
                "below 1, which Kubernetes refuses unless the HPAScaleToZero feature gate is on"
            ]
        return []

    def manages(self, policy: Policy) -> bool:
        return isinstance(policy.target, KubernetesTarget)

    def replica_budget(self, policy: Policy) -> int | None:
        return None  # a cluster's capacity is the cluster autoscaler's business

    async def release(self, policy_name: str) -> None:
        self._endpoints.pop(policy_name, None)  # the workload stays: the controller only stops managing it

    def endpoints(self, policy: Policy) -> Sequence[str]:
        return self._endpoints.get(policy.name, ())

    async def aclose(self) -> None:
        if (close := getattr(self._read_load, "close", None)) is not None:
            close()
        await asyncio.to_thread(self.client.close)

    async def replicas(self, policy: Policy) -> ReplicaCount:
        target = self._target(policy)
        try:
            read = await self._in_thread(lambda stop: self._with_retries(
                target, lambda deadline: self._read_count(target, deadline), "read", stop))
        except ActuationError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                self._endpoints.pop(policy.name, None)  # a deleted workload's pod IPs go to other pods
            raise
        ready = read.ready
        try:
            pods = await asyncio.to_thread(self._ready_pods, target, read)
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            # The count is what scaling needs; a failed pod list keeps the last addresses known.
            log.warning("%s: listing ready pods failed: %s", describe(target), exc)
        else:
            self._endpoints[policy.name] = pods or ()
            if pods is not None:
                # The scale subresource's status.replicas counts every pod created, a replica still loading
                # its model too: the Ready pods are the replicas that serve.
                ready = len(pods)
        return ReplicaCount(desired=read.desired, ready=ready)

    def _read_count(self, target: KubernetesTarget, deadline: CallDeadline) -> _Read:
        """The count :meth:`replicas` reports, with the workload's scale subresource as ``obj``.  For an HPA target
        that is the floor or the workload's own count, whichever is higher: the HPA may have scaled the workload
        above its floor, and those replicas serve (sized from the floor, a scale-up would ask for fewer than run)."""
        return self._as_reported(target, self._read(target, deadline.timeout()), deadline)

    def _as_reported(self, target: KubernetesTarget, read: _Read, deadline: CallDeadline) -> _Read:
        """``read`` (the target's own) as :meth:`replicas` reports it: for an HPA target, with its workload's read."""
        if target.hpa is None:
            return read
        workload = self._read(workload_of(target), deadline.timeout())
        return _Read(desired=max(read.desired, workload.desired), ready=read.ready, obj=workload.obj)

    def _undeclared_hpa(self, target: KubernetesTarget, timeout: float) -> str | None:
        """The name of an HPA that scales ``target``'s workload (None: none, or they cannot be listed).  Its
        controller would set the count back within seconds, and each tick would write it again."""
        kind = "Deployment" if target.kind == "deployment" else "LeaderWorkerSet"
        try:
            hpas = self.autoscaling.list_namespaced_horizontal_pod_autoscaler(target.namespace,
                                                                               _request_timeout=timeout)  # fmt: skip
        except ApiException as exc:
            if exc.status not in (403, 404):
                raise
            # A Role from before this check grants no list: scaling goes on, as it did.
            log.warning("%s: cannot list HPAs to check none scales it: %s", describe(target), api_error(exc))
            return None
        for hpa in hpas.items or ():
            ref = hpa.spec.scale_target_ref if hpa.spec is not None else None
            if ref is not None and ref.name == target.name and ref.kind == kind:
                return str(hpa.metadata.name if hpa.metadata is not None else "?")
        return None

    def _ready_pods(self, target: KubernetesTarget, read: _Read) -> tuple[str, ...] | None:
        """``http://<pod IP>:<port>`` (an IPv6 one in brackets) of the workload's pods that are Ready and not
        terminating (None: the workload names no selector)."""
        pods = ready_pods(self.core, target, read.obj, self.config.request_timeout_s)
        return None if pods is None else tuple(sorted(pods))

    async def scale(
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        if replicas < 0:
            raise ActuationError(f"cannot scale {policy.name!r} to {replicas} replicas")
        target = self._target(policy)
        return await self._in_thread(lambda stop: self._scale_sync(target, replicas, still_leading, stop, expected))

    @staticmethod
    async def _in_thread(work: Callable[[threading.Event], _T]) -> _T:
        """``work(stop)`` in a worker thread; ``stop`` is set when the await is cut off, and the thread then stops
        at its next attempt or backoff (it went on retrying, and writing, for nobody)."""
        stop = threading.Event()
        try:
            return await asyncio.to_thread(work, stop)
        except asyncio.CancelledError:
            stop.set()
            raise

    @staticmethod
    def _target(policy: Policy) -> KubernetesTarget:
        if not isinstance(policy.target, KubernetesTarget):
            raise ActuationError(f"policy {policy.name!r} has a {policy.target.kind!r} target, not a Kubernetes one")
        return policy.target

    def _scale_sync(
        self, target: KubernetesTarget, replicas: int, still_leading: StillLeading, stop: threading.Event,
        expected: int | None,
    ) -> ScaleResult:
        # first: the first read's own count (an HPA's floor), which a retry's read compares with; previous: the
        # count as replicas() reports it, the one the decision was made from.
        state: dict[str, Any] = {"first": None, "previous": None, "wrote": False, "attempts": 0, "costed": False}

        def attempt(deadline: CallDeadline) -> ScaleResult:
            state["attempts"] += 1
            read = self._read(target, deadline.timeout())
            if state["first"] is None:
                state["previous"] = self._count_before(target, read, replicas, expected, deadline)
                state["first"] = read.desired
            elif read.desired not in (state["first"], replicas):
                raise ActuationError(
                    f"{describe(target)}: another writer changed the count from {state['first']} to "
                    f"{read.desired} while it was scaled to {replicas}; not overwritten (the next tick decides "
                    f"from {read.desired})"
                )
            if read.desired != replicas:
                if target.hpa is None and (hpa := self._undeclared_hpa(target, deadline.timeout())) is not None:
                    raise ActuationError(
                        f"{describe(target)}: the HPA {hpa!r} scales it and would undo a scale to {replicas}; "
                        f"name it in the policy (target.hpa: {hpa}) and the controller sets its floor instead"
                    )
                if 0 < replicas < read.desired and not state["costed"]:  # a scale that will be written, if any is
                    state["costed"] = True
                    self._mark_for_deletion(target, read.obj, deadline, stop)
                if stop.is_set():  # cut off during the read or the costs: no write after the caller gave up
                    raise given_up(target, f"scale to {replicas}")
                if not still_leading():  # asked last thing before the write: the retries may have outlived the lease
                    raise lost_lease(target, replicas, wrote_before=state["wrote"])
                timeout = deadline.timeout()  # no time left: nothing sent, nor counted as written
                self.writes += 1
                state["wrote"] = True
                self._write(target, read.obj, replicas, timeout)
            return ScaleResult(
                previous=state["previous"], replicas=replicas, changed=state["wrote"], attempts=state["attempts"]
            )

        try:
            result: ScaleResult = self._with_retries(target, attempt, f"scale to {replicas}", stop)
        except LeadershipLostError:
            raise
        except ActuationError:
            if stop.is_set() or not state["wrote"] or not self._landed(target, replicas):
                raise
            # The last write's answer was an error, but the write was applied.
            result = ScaleResult(
                previous=state["previous"], replicas=replicas, changed=True, attempts=state["attempts"]
            )
        return result

    def _count_before(
        self, target: KubernetesTarget, read: _Read, replicas: int, expected: int | None, deadline: CallDeadline
    ) -> int:
        """The count before the scale, as :meth:`replicas` reports it.  Refused when it is not ``expected``, the count
        the decision was made from: another writer (``kubectl scale``, the HPA) changed it since the tick's read, and
        a scale decided from the old count would undo that change."""
        count = self._as_reported(target, read, deadline).desired
        if expected is not None and count != expected:
            raise ActuationError(
                f"{describe(target)}: another writer changed the count from {expected} to {count} since the tick "
                f"read it; the scale to {replicas} is not written (the next tick decides from {count})"
            )
        return count

    def _mark_for_deletion(
        self, target: KubernetesTarget, scale: Any, deadline: CallDeadline, stop: threading.Event
    ) -> None:
        """Before a Deployment's scale-down, its ready pods' loads as their deletion costs.  A pod whose cost could
        not be written and would now rank before a less busy one stops the scale-down (ActuationError); any other
        failure is logged.  The call's deadline is extended by what this took, within its own ``MARK_BUDGET_S``."""
        if self._read_load is None or target.kind != "deployment" or target.hpa is not None:
            return
        started_s = self._clock()
        try:
            costs = mark_for_deletion(self.core, target, scale, self._read_load, budget_s=MARK_BUDGET_S,
                                      timeout_s=self.config.request_timeout_s, stop=stop,
                                      clock=self._clock)  # fmt: skip
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            why = api_error(exc) if isinstance(exc, ApiException) else exc
            log.warning("%s: pod deletion costs not written (the scale-down goes on): %s", describe(target), why)
        else:
            if costs:
                log.info("%s: pod deletion costs before the scale-down: %s", describe(target), costs)
        finally:
            deadline.extend(self._clock() - started_s)

    def _landed(self, target: KubernetesTarget, replicas: int) -> bool:
        """Whether the count now is ``replicas`` (one short read; False when it cannot be read)."""
        try:
            return self._read(target, min(FINAL_READ_TIMEOUT_S, self.config.request_timeout_s)).desired == replicas
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError, ActuationError):
            return False

    def _with_retries(
        self, target: KubernetesTarget, fn: Callable[[CallDeadline], Any], what: str, stop: threading.Event
    ) -> Any:
        """``fn(deadline)`` until it succeeds, a non-retried error, ``max_attempts``, the deadline or ``stop``.  The
        deadline is the whole call's: every request of every attempt takes its timeout from it."""
        cfg = self.config
        deadline = CallDeadline(cfg.retry_deadline_s, cfg.request_timeout_s, self._clock)
        last = ""
        attempt = 0
        while attempt < cfg.max_attempts and deadline.left() > 0:
            asked_s = 0.0
            if stop.is_set():
                raise given_up(target, what)
            attempt += 1
            try:
                return fn(deadline)
            except ApiException as exc:
                if exc.status not in RETRIED_STATUSES:
                    raise ActuationError(f"{describe(target)}: {what} failed: {api_error(exc)}") from exc
                last = api_error(exc)
                asked_s = retry_after_s(exc)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            except ValueError as exc:  # an answer of the wrong shape (the client's parse, or ours): not retried
                raise ActuationError(f"{describe(target)}: {what} failed: {malformed(exc)}") from exc
            if attempt < cfg.max_attempts:
                delay = min(cfg.backoff_max_s, cfg.backoff_initial_s * 2 ** (attempt - 1))
                # An overloaded API server's Retry-After (429, some 503s) is a floor, as client-go keeps it.
                wanted_s = max(delay * (0.5 + random.random() / 2), asked_s)
                wait_s = min(wanted_s, max(0.0, deadline.left()))
                if self._sleep is None:
                    stop.wait(wait_s)
                else:
                    self._sleep(wait_s)
        within = "" if attempt == cfg.max_attempts else f" within {deadline.seconds:g} s"
        raise ActuationError(f"{describe(target)}: {what} failed after {attempt} attempts{within}: {last}")

    # ---- per-kind reads and writes -------------------------------------
    def _read(self, target: KubernetesTarget, timeout: float) -> _Read:
        if target.hpa is not None:
            hpa = self.autoscaling.read_namespaced_horizontal_pod_autoscaler(
                target.hpa, target.namespace, _request_timeout=timeout
            )
            current = hpa.status.current_replicas if hpa.status is not None else None
            floor = hpa.spec.min_replicas if hpa.spec.min_replicas is not None else 1
            return _Read(desired=floor, ready=current, obj=hpa)
        if target.kind == "deployment":
            scale = self.apps.read_namespaced_deployment_scale(target.name, target.namespace, _request_timeout=timeout)
            ready = scale.status.replicas if scale.status is not None else None
            desired = scale.spec.replicas if scale.spec is not None else None
            return _Read(desired=int(desired or 0), ready=ready, obj=scale)
        obj = self.custom.get_namespaced_custom_object_scale(
            LWS_GROUP, LWS_VERSION, target.namespace, LWS_PLURAL, target.name, _request_timeout=timeout
        )
        if not isinstance(obj, dict):
            raise ActuationError(f"{describe(target)}: scale subresource is not an object")
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        ready = status.get("replicas")
        return _Read(desired=int(spec.get("replicas") or 0), ready=None if ready is None else int(ready), obj=obj)

    def _write(self, target: KubernetesTarget, obj: Any, replicas: int, timeout: float) -> None:
        if target.hpa is not None:
            self.autoscaling.patch_namespaced_horizontal_pod_autoscaler(
                target.hpa, target.namespace, hpa_floor_patch(obj, replicas), _request_timeout=timeout,
                _content_type=MERGE_PATCH,
            )
        elif target.kind == "deployment":
            scale = k8s.V1Scale(
                api_version="autoscaling/v1",
                kind="Scale",
                metadata=k8s.V1ObjectMeta(
                    name=target.name, namespace=target.namespace, resource_version=obj.metadata.resource_version
                ),
                spec=k8s.V1ScaleSpec(replicas=replicas),
            )
            self.apps.replace_namespaced_deployment_scale(
                target.name, target.namespace, scale, _request_timeout=timeout
            )
        else:
            body: dict[str, Any] = {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {
                    "name": target.name,
                    "namespace": target.namespace,
                    "resourceVersion": (obj.get("metadata") or {}).get("resourceVersion"),
                },
                "spec": {"replicas": replicas},
            }
            self.custom.replace_namespaced_custom_object_scale(
                LWS_GROUP, LWS_VERSION, target.namespace, LWS_PLURAL, target.name, body, _request_timeout=timeout
            )

