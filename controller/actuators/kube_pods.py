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

- Written only on a scale-down, and only where a pod's cost changed: the annotation is no live metric (each write
  is a pod update every watcher of pods sees, which Kubernetes' docs warn against doing often).
- A pod whose load cannot be read is ranked above every pod whose load was read: it may be the busiest.  When no
  pod's load can be read (the controller runs outside the cluster network), nothing is written.
- Not for an HPA-owned workload: the HPA scales down later, on its own schedule, when these costs would be stale;
  nor for a LeaderWorkerSet, whose controller removes the groups with the highest indices.
- A failure here (no RBAC ``patch`` on pods, pods that do not answer) is logged and the scale goes on; Kubernetes
  then picks as it did without costs.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from contracts.catalogue import RUNNING, WAITING
from controller.policy import KubernetesTarget

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
READ_TIMEOUT_S = 2.0
"""Each pod's ``/metrics`` read: a pod slower than this is ranked as one whose load is unknown."""
MAX_READERS = 16
"""Pods read at once."""

LoadReader = Callable[[Sequence[str]], Mapping[str, float | None]]
"""Base URLs of pods -> each one's requests in flight (None: not read)."""
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


def read_in_flight(urls: Sequence[str], timeout_s: float = READ_TIMEOUT_S) -> dict[str, float | None]:
    """Each pod's :func:`in_flight`, read at once from ``<url>/metrics`` (None: no answer, or not a number)."""

    def one(client: httpx.Client, url: str) -> float | None:
        try:
            response = client.get(f"{url}/metrics")
            response.raise_for_status()
            return in_flight(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            log.info("pod-deletion-cost: cannot read %s/metrics: %s", url, exc)
            return None

    if not urls:
        return {}
    with httpx.Client(timeout=timeout_s) as client, ThreadPoolExecutor(min(MAX_READERS, len(urls))) as pool:
        return dict(zip(urls, pool.map(lambda url: one(client, url), urls), strict=True))


def deletion_costs(loads: Mapping[str, float | None]) -> dict[str, int]:
    """Pod -> its cost: its requests in flight, rounded up; one above the busiest read for a pod not read.  Empty
    when no pod was read (the costs would not say which pod to keep)."""
    known = {pod: math.ceil(load) for pod, load in loads.items() if load is not None and math.isfinite(load)}
    if not known:
        return {}
    unknown_cost = max(known.values()) + 1
    return {pod: known.get(pod, unknown_cost) for pod in loads}


def mark_for_deletion(
    core: k8s.CoreV1Api, target: KubernetesTarget, scale: Any, read_load: LoadReader, *, timeout_s: float,
    stop: threading.Event,
) -> dict[str, int]:
    """Write :func:`deletion_costs` on the workload's ready pods where a cost changed; the costs written, by pod
    name.  ``stop`` set (the scale's caller gave up): no further write.  API errors are the caller's."""
    selector = workload_selector(scale)
    if not selector:
        return {}
    listed = core.list_namespaced_pod(target.namespace, label_selector=selector, _request_timeout=timeout_s)
    pods = {pod_url(ip, target.port): pod for pod in listed.items if (ip := serving_ip(pod))}
    costs = deletion_costs(read_load(list(pods)))
    written: dict[str, int] = {}
    for url, cost in costs.items():
        metadata = pods[url].metadata
        if stop.is_set() or metadata is None or (metadata.annotations or {}).get(DELETION_COST_ANNOTATION) == str(cost):
            continue
        patch = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}}
        core.patch_namespaced_pod(str(metadata.name), target.namespace, patch, _request_timeout=timeout_s,
                                  _content_type="application/merge-patch+json")  # fmt: skip
        written[str(metadata.name)] = cost
    return written
