"""The one small interface every actuator implements: read the replica count, scale to N.

Scaling is *to* an absolute count, never *by* a delta, so a retried or
repeated call cannot apply a change twice; actuators also read before they
write and skip writes that would change nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from controller.policy import Policy


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

    async def scale(self, policy: Policy, replicas: int) -> ScaleResult:
        """Make the target run ``replicas``; raises :class:`~controller.errors.ActuationError` after retries."""
        ...

    def endpoints(self, policy: Policy) -> Sequence[str]:
        """Base URLs of replicas this actuator started (for the direct-scrape source)."""
        ...

    def replica_budget(self, policy: Policy) -> int | None:
        """Most replicas the actuator has room for (None: no limit it knows of, e.g. a cluster)."""
        ...

    async def release(self, policy_name: str) -> None:
        """The policy was deleted: stop what this actuator itself started for it (a cluster's workloads stay:
        they are the cluster's, and the controller only stops managing them)."""
        ...

    async def aclose(self) -> None: ...
