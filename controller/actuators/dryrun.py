"""The dry-run actuator: remembers the counts it was asked for and touches nothing.

It reads no fleet, so the replicas the source observes stand: its count starts
from the first ready count observed (see :meth:`DryRunActuator.seed`), and it
reports no ready count of its own, so a dry run decides as the actuator that
writes would on the same fleet.
"""

from __future__ import annotations

from collections.abc import Sequence

from controller.actuators.base import ReplicaCount, ScaleResult, StillLeading, always_leading
from controller.errors import LeadershipLostError
from controller.policy import KubernetesTarget, LocalTarget, Policy


class DryRunActuator:
    """Scale calls only update an in-memory count (starting at the first observed ready count, else the policy's
    min_replicas)."""

    name = "dryrun"

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.calls: list[tuple[str, int]] = []
        """Every scale call that changed a count, in order."""

    def check(self, policy: Policy) -> list[str]:
        return []

    def manages(self, policy: Policy) -> bool:
        return isinstance(policy.target, (KubernetesTarget, LocalTarget))

    def seed(self, policy_name: str, observed_ready: int | None) -> None:
        """Start ``policy_name``'s count from the replicas observed serving, once (later its scales set it)."""
        if observed_ready is not None:
            self.counts.setdefault(policy_name, observed_ready)

    async def replicas(self, policy: Policy) -> ReplicaCount:
        count = self.counts.get(policy.name, max(policy.scaling.min_replicas, 1))  # kept once seeded or scaled
        return ReplicaCount(desired=count)  # ready unknown: the observed count stands, not a made-up one

    async def scale(  # expected: not checked, nothing but its own scales changes its count
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        previous = self.counts.setdefault(policy.name, max(policy.scaling.min_replicas, 1))
        if previous != replicas and not still_leading():
            raise LeadershipLostError(f"{policy.name}: the lease was lost before the scale to {replicas}")
        self.counts[policy.name] = replicas
        if previous != replicas:
            self.calls.append((policy.name, replicas))
        return ScaleResult(previous=previous, replicas=replicas, changed=previous != replicas)

    def replica_budget(self, policy: Policy) -> int | None:
        return None  # it starts nothing, so nothing limits it

    async def release(self, policy_name: str) -> None:
        """It started nothing; its count goes, so a policy created again under the name starts from what is
        observed then."""
        self.counts.pop(policy_name, None)

    def endpoints(self, policy: Policy) -> Sequence[str]:
        return ()

    async def aclose(self) -> None:
        return None
