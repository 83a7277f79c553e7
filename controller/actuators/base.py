"""The one small interface every actuator implements: read the replica count, scale to N.

Scaling is *to* an absolute count, never *by* a delta, so a retried or
repeated call cannot apply a change twice; actuators also read before they
write and skip writes that would change nothing.

A scale is decided from a count read earlier in the tick: the caller passes it as
``expected``, and an actuator whose target others can scale (Kubernetes) writes
nothing when the count has changed since (the next tick decides afresh).

Only the leader scales, and a scale call can outlive the lease (a Kubernetes
write is retried for up to ``retry_deadline_s``): the caller passes
``still_leading``, which the actuator asks right before each change it makes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from controller.policy import Policy

StillLeading = Callable[[], bool]
"""Whether this replica still holds the lease; asked right before each change an actuator makes.  False stops
the call with :class:`~controller.errors.LeadershipLostError` before that change (another replica acts now)."""


def always_leading() -> bool:
    """The ``still_leading`` of a caller with no election (the embedded mode, a one-off scale)."""
    return True


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplicaCount:
    """Replicas asked for (``desired``) and serving (``ready``; None when unknown)."""

    desired: int
    ready: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ScaleResult:
    """What a scale call did: ``changed`` is False when the count already matched."""

    previous: int
    replicas: int
    changed: bool
    attempts: int = 1


class Actuator(Protocol):
    """Carries out scale decisions for the targets it understands."""

    name: str

    def check(self, policy: Policy) -> list[str]:
        """Problems (``"field: message"``) that stop this actuator from acting on the policy's target."""
        ...

    def manages(self, policy: Policy) -> bool:
        """Whether this actuator reads and scales the policy's target (False: read-only target)."""
        ...

    async def replicas(self, policy: Policy) -> ReplicaCount:
        """The current count; raises :class:`~controller.errors.ActuationError` when it cannot be read."""
        ...

    async def scale(
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        """Make the target run ``replicas``; raises :class:`~controller.errors.ActuationError` after retries, and
        :class:`~controller.errors.LeadershipLostError` (one) when ``still_leading`` says False before a change.
        ``expected``: the count (as :meth:`replicas` reports it) the decision was made from; an actuator whose
        target another writer can scale refuses, with an ActuationError, when the count is no longer that (None:
        no check)."""
        ...

    def endpoints(self, policy: Policy) -> Sequence[str]:
        """Base URLs of replicas this actuator started (for the direct-scrape source)."""
        ...

    def replica_budget(self, policy: Policy) -> int | None:
        """Most replicas the actuator has room for (None: no limit it knows of, e.g. a cluster)."""
        ...

    async def release(self, policy_name: str) -> None:
        """The policy was deleted, or its target switched to one this actuator does not manage: stop what this
        actuator itself started for it (a cluster's workloads stay: they are the cluster's, and the controller only
        stops managing them)."""
        ...

    async def aclose(self) -> None: ...
