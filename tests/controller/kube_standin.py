"""A stand-in Kubernetes API server on loopback, for actuator and leader-election tests.

No real API server can be installed on the test machines, so this small
``http.server`` app serves just the endpoints the controller uses, with the
semantics that matter:

- ``GET``/``PUT`` of a Deployment's and a LeaderWorkerSet's ``scale``
  subresource, an HPA (autoscaling/v2) and a Lease (coordination.k8s.io/v1),
  plus ``POST`` to create a Lease and ``PATCH`` with a JSON merge patch
  (RFC 7386, ``application/merge-patch+json``; other patch types get 415);
  a ``PUT`` replaces the spec, a merge patch keeps every field it does not
  name (also those no client model knows);
- ``GET`` of a namespace's pods, filtered by an equality ``labelSelector``, and a merge ``PATCH`` of one pod's
  metadata (its annotations);
- optimistic concurrency: a ``PUT`` or ``PATCH`` whose ``metadata.resourceVersion``
  is not the stored one gets ``409 Conflict``; every write bumps the version;
- fault injection: queued 5xx answers (optionally *after* applying the write,
  like a server that commits and then fails to answer), and a concurrent
  writer that changes an object between a client's read and its write.

Every request is logged for assertions.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from controller.api.policy_routes import merge_patch


@dataclass
class Fault:
    method: str
    path_contains: str
    status: int
    apply_first: bool = False
    message: str = "injected fault"
    retry_after: str | None = None
    """The ``Retry-After`` header the fault's answer carries."""


@dataclass
class StandInState:
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: deque[Fault] = field(default_factory=deque)
    log: list[tuple[str, str, int]] = field(default_factory=list)
    applied_writes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    before_put: dict[str, Callable[[dict[str, Any]], None]] = field(default_factory=dict)
    """Path: a change another writer makes to the object just before the next ``PUT`` or ``PATCH`` of it."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_version: int = 100
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Pods by namespace (``add_pod``)."""
    stalls: dict[str, float] = field(default_factory=dict)
    """Path part: seconds every matching request waits before it is answered."""


def _matches(labels: dict[str, str], selector: str) -> bool:
    """An equality-based label selector (``a=b,c=d``), as the scale subresource reports it."""
    wanted = [term.split("=", 1) for term in selector.split(",") if term]
    return all(labels.get(key) == value for key, value in wanted)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": message
    }


class StandInApiServer:
    """Start with ``with StandInApiServer() as server:``; ``server.url`` is the API server URL."""

    def __init__(self) -> None:
        self.state = StandInState()
        state = self.state

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                return

            def _send(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if (retry_after := getattr(self, "retry_after", None)) is not None:
                    self.send_header("Retry-After", retry_after)
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def _handle(self, method: str) -> None:
                path = self.path.split("?", 1)[0]
                body = self._body() if method in ("PUT", "POST", "PATCH") else {}
                stall_s = max((s for part, s in state.stalls.items() if part in path), default=0.0)
                if stall_s:
                    time.sleep(stall_s)  # an API server that does not answer in time
                with state.lock:
                    if method == "GET" and path.startswith("/api/v1/namespaces/") and path.endswith("/pods"):
                        code, answer = self._pods(path.split("/")[4])
                    elif method == "PATCH" and path.startswith("/api/v1/namespaces/") and "/pods/" in path:
                        code, answer = self._patch_pod(path, body)
                    else:
                        code, answer = self._dispatch(method, path, body)
                    state.log.append((method, path, code))
                self._send(code, answer)

            def _pods(self, namespace: str) -> tuple[int, dict[str, Any]]:
                if (fault := self._fault("GET", f"/api/v1/namespaces/{namespace}/pods")) is not None:
                    return fault.status, _status(fault.status, "InternalError", fault.message)
                query = parse_qs(urlsplit(self.path).query)
                selector = query.get("labelSelector", [""])[0]
                items = [p for p in state.pods.get(namespace, []) if _matches(p["metadata"]["labels"], selector)]
                return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}

            def _patch_pod(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
                if (fault := self._fault("PATCH", path)) is not None:
                    return fault.status, _status(fault.status, "Forbidden", fault.message)
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    return 415, _status(415, "UnsupportedMediaType", str(self.headers.get("Content-Type")))
                _, _, _, _, namespace, _, name = path.split("/")
                for i, pod in enumerate(state.pods.get(namespace, [])):
                    if pod["metadata"]["name"] == name:
                        state.pods[namespace][i] = merge_patch(pod, {"metadata": body.get("metadata") or {}})
                        state.applied_writes.append((path, json.loads(json.dumps(state.pods[namespace][i]))))
                        return 200, state.pods[namespace][i]
                return 404, _status(404, "NotFound", f"pod {name} not found")

            def _fault(self, method: str, path: str) -> Fault | None:
                for fault in list(state.faults):
                    if fault.method == method and fault.path_contains in path:
                        state.faults.remove(fault)
                        self.retry_after = fault.retry_after
                        return fault
                return None

            def _dispatch(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
                fault = self._fault(method, path)
                if fault is not None and not fault.apply_first:
                    return fault.status, _status(fault.status, "InternalError", fault.message)
                if method == "GET" and path.endswith("/horizontalpodautoscalers"):  # a list
                    items = [o for p, o in state.objects.items() if p.rsplit("/", 1)[0] == path]
                    return 200, {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscalerList",
                                 "metadata": {}, "items": items}  # fmt: skip
                if method == "GET":
                    obj = state.objects.get(path)
                    if obj is None:
                        return 404, _status(404, "NotFound", f"{path} not found")
                    return 200, obj
                if method == "POST":
                    name = body.get("metadata", {}).get("name", "")
                    full = f"{path}/{name}"
                    if full in state.objects:
                        return 409, _status(409, "AlreadyExists", f"{name} already exists")
                    state.next_version += 1
                    body.setdefault("metadata", {})["resourceVersion"] = str(state.next_version)
                    state.objects[full] = body
                    state.applied_writes.append((full, json.loads(json.dumps(body))))
                    return 201, body
                if method in ("PUT", "PATCH"):
                    return self._write(method, path, body, fault)
                return 405, _status(405, "MethodNotAllowed", method)

            def _write(self, method: str, path: str, body: dict[str, Any], fault: Fault | None
                       ) -> tuple[int, dict[str, Any]]:  # fmt: skip
                current = state.objects.get(path)
                if current is None:
                    return 404, _status(404, "NotFound", f"{path} not found")
                if method == "PATCH" and self.headers.get("Content-Type") != "application/merge-patch+json":
                    return 415, _status(415, "UnsupportedMediaType", str(self.headers.get("Content-Type")))
                hook = state.before_put.pop(path, None)
                if hook is not None:
                    hook(current)
                    state.next_version += 1
                    current["metadata"]["resourceVersion"] = str(state.next_version)
                sent = body.get("metadata", {}).get("resourceVersion")
                if sent is not None and sent != current["metadata"]["resourceVersion"]:
                    message = "the object has been modified; please apply your changes to the latest version"
                    return 409, _status(409, "Conflict", message)
                state.next_version += 1
                if method == "PATCH":
                    merged = merge_patch(current, {k: v for k, v in body.items() if k in ("spec", "metadata")})
                else:
                    merged = {**current, **{k: v for k, v in body.items() if k in ("spec",)}}
                    sent_meta = body.get("metadata") or {}
                    kept = {"annotations": sent_meta["annotations"]} if "annotations" in sent_meta else {}
                    merged["metadata"] = {**current["metadata"], **kept}
                merged["metadata"]["resourceVersion"] = str(state.next_version)
                state.objects[path] = merged
                state.applied_writes.append((path, json.loads(json.dumps(merged))))
                if fault is not None:
                    return fault.status, _status(fault.status, "InternalError", "injected fault after apply")
                return 200, merged

            def do_GET(self) -> None:
                self._handle("GET")

            def do_PUT(self) -> None:
                self._handle("PUT")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> StandInApiServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    # ---- fixtures ---------------------------------------------------------
    def _put(self, path: str, obj: dict[str, Any]) -> None:
        with self.state.lock:
            self.state.next_version += 1
            obj.setdefault("metadata", {})["resourceVersion"] = str(self.state.next_version)
            self.state.objects[path] = obj

    def add_deployment_scale(self, namespace: str, name: str, replicas: int, *, ready_pods: int | None = None) -> str:
        """A Deployment's scale (selector ``app=x``) and its pods: ``ready_pods`` Ready ones (default: as many
        as its replicas, a settled Deployment; pass 0 to add pods by hand)."""
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"
        self._put(path, {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas, "selector": "app=x"},
        })
        for i in range(replicas if ready_pods is None else ready_pods):
            self.add_pod(namespace, f"{name}-{i}", f"10.9.0.{i + 1}", {"app": "x"})
        return path

    def add_lws_scale(self, namespace: str, name: str, replicas: int) -> str:
        path = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{namespace}/leaderworkersets/{name}/scale"
        self._put(path, {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas, "selector": f"lws={name},worker-index=0"},
        })
        return path

    def add_hpa(self, namespace: str, name: str, *, min_replicas: int, max_replicas: int, current: int) -> str:
        path = f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{name}"
        self._put(path, {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "minReplicas": min_replicas, "maxReplicas": max_replicas,
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            },
            "status": {"currentReplicas": current, "desiredReplicas": current},
        })
        return path

    def add_pod(self, namespace: str, name: str, ip: str, labels: dict[str, str], *, ready: bool = True,
                terminating: bool = False) -> None:  # fmt: skip
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
        if terminating:
            metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "status": {
            "phase": "Running", "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
        with self.state.lock:
            self.state.pods.setdefault(namespace, []).append(pod)

    def pod_annotations(self, namespace: str) -> dict[str, dict[str, str]]:
        with self.state.lock:
            return {p["metadata"]["name"]: dict(p["metadata"].get("annotations") or {})
                    for p in self.state.pods.get(namespace, [])}  # fmt: skip

    def lease_path(self, namespace: str, name: str) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"

    def obj(self, path: str) -> dict[str, Any]:
        with self.state.lock:
            return json.loads(json.dumps(self.state.objects[path]))

    def writes_to(self, path: str) -> list[dict[str, Any]]:
        with self.state.lock:
            return [body for p, body in self.state.applied_writes if p == path]
