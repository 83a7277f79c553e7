"""The pods behind a Kubernetes workload: which serve, their URLs, and which a scale-down removes.

:func:`serving_ip` and :func:`pod_url` name the ready pods (the entry router's replicas).  :func:`mark_for_deletion`
makes a Deployment's scale-down remove the pods with the least work in flight.

A ReplicaSet scaled down deletes pods in an order of its own: unscheduled, pending and not-ready pods first, then
those with the lowest ``controller.kubernetes.io/pod-deletion-cost`` annotation (beta and on by default since
Kubernetes 1.22), then by further rules the newest. Without costs the newest go, however many requests they hold,
and each of those must finish within the pod's drain or be cut off. Before the actuator lowers a Deployment's count,
it reads each ready pod's requests in flight (``vllm:num_requests_running`` + ``vllm:num_requests_waiting`` from its
``/metrics``, which vLLM and the embedded engine both serve) and writes them as the pods' costs, so the pods that go
are those with the least to drain.

- Written only on a scale-down (not to zero), and only where a pod's cost changed: the annotation is no live metric
  (each write is a pod update every watcher of pods sees, which Kubernetes' docs warn against doing often).  The
  busiest first, all within ``MARK_BUDGET_S``, before the scale's last looks at its lease and at a cut-off.
- A pod whose load is not read in time is ranked above every pod whose load was: it may be the busiest.  When no
  pod's load can be read (the controller runs outside the cluster network), the costs an earlier scale-down left
  are cleared: they would rank the pods by the loads of then.
- Not for an HPA-owned workload: the HPA scales down later, on its own schedule, when these costs would be stale;
  nor for a LeaderWorkerSet, whose controller removes the groups with the highest indices.
- A pod's cost write that fails with a 5xx, 429 or connection error is retried within the budget.  A pod whose cost
  still is not written keeps its old one: when that ranks it no higher than a less busy pod (a busy pod an earlier
  scale-down found idle), the scale-down is not written this time (an ActuationError naming the pod; nothing is
  lost, the next tick tries again).  Other failures (no RBAC ``patch`` on pods, pods whose loads cannot be read)
  are logged and the scale goes on; Kubernetes then picks as it did without costs.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import httpx
import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from contracts.catalogue import RUNNING, WAITING
from controller.errors import ActuationError
from controller.policy import KubernetesTarget

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
MERGE_PATCH = "application/merge-patch+json"
"""RFC 7386: the fields the patch names are set (``null`` removes), every other one stays as the server has it."""
READ_TIMEOUT_S = 2.0
"""Each pod's ``/metrics`` read, per network operation: a pod slower than this reads as one whose load is unknown."""
MAX_READERS = 16
"""Pods read at once."""
MAX_COST = 2**31 - 1
"""Kubernetes parses the annotation as an int32."""
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_PAUSE_S = 0.1
"""A pod's cost write failed with a 5xx, 429 or connection error: retried after this, then twice as long each time."""

LoadReader = Callable[[Sequence[str], float], Mapping[str, float | None]]
"""(base URLs of pods, seconds it may take) -> each one's requests in flight (None: not read in time)."""
log = logging.getLogger(__name__)


def workload_selector(scale: Any) -> str | None:
    """The label selector a scale subresource reports (typed for Deployments, a dict for custom objects)."""
    if isinstance(scale, dict):
        value = (scale.get("status") or {}).get("selector")
        return value if isinstance(value, str) else None
    status = getattr(scale, "status", None)
    value = getattr(status, "selector", None)
    return value if isinstance(value, str) else None


def serving_ip(pod: k8s.V1Pod) -> str | None:
    """The pod's IP when it is Ready and not terminating, else None."""
    status = pod.status
    if pod.metadata is None or pod.metadata.deletion_timestamp is not None or status is None or not status.pod_ip:
        return None
    ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])
    return str(status.pod_ip) if ready else None


def pod_url(ip: str, port: int) -> str:
    """``http://<ip>:<port>``, an IPv6 address in brackets (bare, its colons would read as the port's)."""
    try:
        bracketed = ipaddress.ip_address(ip).version == 6
    except ValueError:
        bracketed = False
    return f"http://[{ip}]:{port}" if bracketed else f"http://{ip}:{port}"


def ready_pods(
    core: k8s.CoreV1Api, target: KubernetesTarget, scale: Any, timeout_s: float
) -> dict[str, k8s.V1ObjectMeta] | None:
    """The workload's pods that are Ready and not terminating, by ``http://<pod IP>:<port>`` (None: the workload
    names no selector)."""
    selector = workload_selector(scale)
    if not selector:
        return None
    listed = core.list_namespaced_pod(target.namespace, label_selector=selector, _request_timeout=timeout_s)
    return {
        pod_url(ip, target.port): meta for pod in listed.items if (ip := serving_ip(pod)) and (meta := pod.metadata)
    }


def in_flight(metrics_text: str) -> float | None:
    """Requests running and waiting in one engine's ``/metrics`` text (None: it exports neither)."""
    wanted = {RUNNING, WAITING}
    samples = [
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name in wanted
    ]
    return float(sum(samples)) if samples else None


class PodLoadReader:
    """Reads pods' :func:`in_flight` from ``<url>/metrics``, :data:`MAX_READERS` at once, each within its own
    ``timeout_s`` and all within the caller's budget: a pod that answers slowly or drips its answer reads as not
    read.  One client and pool for the actuator's life (:meth:`close`)."""

    def __init__(self, timeout_s: float = READ_TIMEOUT_S) -> None:
        self._client = httpx.Client(timeout=timeout_s)
        self._pool = ThreadPoolExecutor(MAX_READERS, thread_name_prefix="moeslo-pod-load")

    def __call__(self, urls: Sequence[str], budget_s: float) -> dict[str, float | None]:
        futures = {url: self._pool.submit(self._one, url) for url in urls}
        done, late = wait(futures.values(), timeout=max(budget_s, 0.0))
        for future in late:  # one still queued is dropped; one in flight ends at its own timeout
            future.cancel()
        return {url: future.result() if future in done else None for url, future in futures.items()}

    def _one(self, url: str) -> float | None:
        try:
            response = self._client.get(f"{url}/metrics")
            response.raise_for_status()
            return in_flight(response.text)
        except (httpx.HTTPError, ValueError, RuntimeError) as exc:  # RuntimeError: the client closed meanwhile
            log.info("pod-deletion-cost: cannot read %s/metrics: %s", url, exc)
            return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()


def deletion_costs(loads: Mapping[str, float | None]) -> dict[str, int]:
    """Pod -> its cost: its requests in flight, rounded up; one above the busiest read for a pod not read.  Empty
    when no pod was read (the costs would not say which pod to keep).  Within int32, as Kubernetes parses them."""
    known = {pod: min(math.ceil(load), MAX_COST - 1) for pod, load in loads.items()
             if load is not None and math.isfinite(load) and load >= 0}  # fmt: skip
    if not known:
        return {}
    unknown_cost = max(known.values()) + 1
    return {pod: known.get(pod, unknown_cost) for pod in loads}


def mark_for_deletion(
    core: k8s.CoreV1Api, target: KubernetesTarget, scale: Any, read_load: LoadReader, *, budget_s: float,
    timeout_s: float, stop: threading.Event, clock: Callable[[], float] = time.monotonic,
) -> dict[str, str | None]:
    """Write :func:`deletion_costs` on the workload's ready pods, the busiest first, where a cost changed, all within
    ``budget_s``; when no pod's load was read, clear the costs an earlier scale-down left (they would rank pods by
    the loads of then).  The values written, by pod name.  ``stop`` set (the scale's caller gave up): no further
    write.  A pod's write is retried on a 5xx, 429 or connection error within the budget; a pod whose cost still
    is not written and whose old cost ranks it no higher than a less busy pod stops the scale-down
    (:class:`~controller.errors.ActuationError`).  A refusal (401/403) is the caller's."""
    deadline_s = clock() + budget_s
    pods = ready_pods(core, target, scale, min(timeout_s, budget_s))
    if not pods:
        return {}
    costs = deletion_costs(read_load(list(pods), deadline_s - clock()))
    values: dict[str, str | None] = {url: str(cost) for url, cost in costs.items()} or dict.fromkeys(pods)
    written: dict[str, str | None] = {}
    unwritten: list[str] = []
    for url in sorted(values, key=lambda url: -costs.get(url, 0)):
        metadata, value = pods[url], values[url]
        if stop.is_set():
            break  # the scale writes no count either
        if (metadata.annotations or {}).get(DELETION_COST_ANNOTATION) == value:
            continue
        done = _write_cost(core, target, metadata, value, timeout_s=timeout_s, deadline_s=deadline_s, stop=stop,
                           clock=clock)  # fmt: skip
        if done:
            written[str(metadata.name)] = value
        elif done is False:
            unwritten.append(url)
    _refuse_misranked(target, pods, costs, unwritten)
    return written


def _write_cost(
    core: k8s.CoreV1Api, target: KubernetesTarget, metadata: k8s.V1ObjectMeta, value: str | None, *, timeout_s: float,
    deadline_s: float, stop: threading.Event, clock: Callable[[], float],
) -> bool | None:
    """One pod's cost, retried on a 5xx, 429 or connection error until ``deadline_s``: a pod skipped after one
    failed write kept its old cost, and a busy pod an earlier scale-down found idle went first.  True: written;
    False: not (its old cost stands); None: the pod is gone.  A refusal (401/403) is raised."""
    pause_s, why = RETRY_PAUSE_S, "no time left"
    while (left_s := deadline_s - clock()) > 0 and not stop.is_set():
        try:
            core.patch_namespaced_pod(str(metadata.name), target.namespace,
                                      {"metadata": {"annotations": {DELETION_COST_ANNOTATION: value}}},
                                      _request_timeout=min(timeout_s, left_s),
                                      _content_type=MERGE_PATCH)  # fmt: skip
            return True
        except ApiException as exc:
            if exc.status in (401, 403):
                raise
            if exc.status == 404:
                return None  # deleted since the list: it ranks no pod
            why = f"HTTP {exc.status} {exc.reason}"
            if exc.status not in RETRIED_STATUSES:
                break
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        stop.wait(min(pause_s, max(0.0, deadline_s - clock())))
        pause_s *= 2
    log.warning("pod-deletion-cost: pod %s not marked: %s", metadata.name, why)
    return False


def _refuse_misranked(
    target: KubernetesTarget, pods: Mapping[str, k8s.V1ObjectMeta], costs: Mapping[str, int], unwritten: Sequence[str]
) -> None:
    """An ActuationError naming the first pod whose cost was not written and whose old cost now ranks it no higher
    than a pod less busy than it (or lower than a busier pod ranks it below): the ReplicaSet could remove the busier
    one first.  Not scaling down this time loses nothing; the next tick tries again."""
    kept = {url: _cost_on(pods[url]) for url in unwritten}
    ranked = {url: kept.get(url, cost) for url, cost in costs.items()}  # the costs the ReplicaSet will see
    for url in unwritten:
        for other in costs:
            busier, idler = (url, other) if costs[url] > costs[other] else (other, url)
            if costs[busier] > costs[idler] and ranked[busier] <= ranked[idler]:
                raise ActuationError(
                    f"{target.kind} {target.namespace}/{target.name}: pod {pods[url].name}'s deletion cost "
                    f"{costs[url]} could not be written, and its old cost {kept[url]} would let the ReplicaSet remove "
                    f"pod {pods[busier].name} (in flight: {costs[busier]}) before pod {pods[idler].name} "
                    f"({costs[idler]}); the scale-down is not written this time"
                )


def _cost_on(metadata: k8s.V1ObjectMeta) -> int:
    """The deletion cost a pod carries (Kubernetes reads none, or one not a number, as 0)."""
    try:
        return int((metadata.annotations or {}).get(DELETION_COST_ANNOTATION) or 0)
    except ValueError:
        return 0
