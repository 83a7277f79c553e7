"""The Kubernetes actuator's small parts: one call's deadline, the HPA floor's patch, and its error texts."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from controller.errors import ActuationError, LeadershipLostError
from controller.policy import KubernetesTarget

LIFTED_MAX_ANNOTATION = "moeslo.io/max-replicas-before-floor"
"""On an HPA whose ``maxReplicas`` the actuator lifted: the value it had, given back when the floor comes down."""


class CallDeadline:
    """One call's deadline, shared by all its requests: each one's timeout is the request timeout or the time left,
    whichever is less.  A call makes several requests in a row (a read, the HPA list, the write); each with the
    full request timeout, one attempt outlasted the service's bound on the call, which then logged it failed (and
    let a scale-down's cooldown go) while its write still landed."""

    def __init__(self, seconds: float, request_timeout_s: float, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.seconds = seconds
        self.at = clock() + seconds
        self.request_timeout_s = request_timeout_s

    def left(self) -> float:
        return self.at - self._clock()

    def timeout(self) -> float:
        """The next request's timeout.  No time left: a TimeoutError, which ends the call as a stalled request
        would, no request sent."""
        left = self.left()
        if left <= 0:
            raise TimeoutError(f"no time left of the call's {self.seconds:g} s")
        return min(self.request_timeout_s, left)

    def extend(self, seconds: float) -> None:
        """Add what a step with its own budget took (a scale-down's pod costs): the service's bound counts it."""
        self.at += max(0.0, seconds)
        self.seconds += max(0.0, seconds)


def hpa_floor_patch(hpa: Any, floor: int) -> dict[str, Any]:
    """The merge patch that sets the read HPA's ``minReplicas`` to ``floor``, lifting ``maxReplicas`` to fit it and
    giving it back as the floor comes down.  It names only those fields, the annotation that remembers a lift, and
    the read's ``resourceVersion`` (a precondition: a change since is a 409)."""
    meta, spec = hpa.metadata, hpa.spec
    lifted_from = (meta.annotations or {}).get(LIFTED_MAX_ANNOTATION)
    # Still as it was left (lifted to the floor): the remembered value is the owner's; otherwise someone set it since.
    still_lifted = (lifted_from or "").isdigit() and spec.max_replicas == spec.min_replicas
    own_max = int(lifted_from or 0) if still_lifted else spec.max_replicas
    changes: dict[str, Any] = {"minReplicas": floor}
    if max(own_max, floor) != spec.max_replicas:
        changes["maxReplicas"] = max(own_max, floor)
    metadata: dict[str, Any] = {"resourceVersion": meta.resource_version}
    remembered = str(own_max) if floor > own_max else None
    if remembered != lifted_from:
        metadata["annotations"] = {LIFTED_MAX_ANNOTATION: remembered}  # None: removed
    return {"metadata": metadata, "spec": changes}


def lost_lease(target: KubernetesTarget, replicas: int, *, wrote_before: bool) -> LeadershipLostError:
    earlier = " (an earlier attempt's write was answered with an error: it may have landed)" if wrote_before else ""
    return LeadershipLostError(
        f"{describe(target)}: the lease was lost before the scale to {replicas} was written{earlier}; "
        "another replica acts"
    )


def given_up(target: KubernetesTarget, what: str) -> ActuationError:
    return ActuationError(f"{describe(target)}: {what} given up: its caller no longer waits for it")


def api_error(exc: ApiException) -> str:
    """``HTTP <status> <reason>``, and the API server's own message when it sent one (an RBAC denial names the
    verb, resource and namespace refused; a 422 the field)."""
    text = f"HTTP {exc.status} {exc.reason}"
    try:
        message = json.loads(exc.body or "").get("message")
    except (ValueError, TypeError, AttributeError):
        message = None
    return f"{text}: {str(message)[:400]}" if message else text


def retry_after_s(exc: ApiException) -> float:
    """The seconds an answer's ``Retry-After`` asks for (0 when absent, an HTTP date, or not a number)."""
    try:
        value = float((exc.headers or {}).get("Retry-After", ""))
    except (TypeError, ValueError, AttributeError):
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


def malformed(exc: ValueError) -> str:
    """A parse's error in one line (pydantic's span several)."""
    return f"malformed answer ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})"


def describe(target: KubernetesTarget) -> str:
    if target.hpa is not None:
        return f"hpa {target.namespace}/{target.hpa}"
    return f"{target.kind} {target.namespace}/{target.name}"


def workload_of(target: KubernetesTarget) -> KubernetesTarget:
    """The workload an HPA target's HPA scales (the target itself when it names no HPA)."""
    return target.model_copy(update={"hpa": None})
