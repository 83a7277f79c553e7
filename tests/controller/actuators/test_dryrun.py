"""The dry-run actuator: in-memory counts seeded from the fleet observed, and the same leadership check as the
actuators that write."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controller.actuators import DryRunActuator, ReplicaCount
from controller.errors import LeadershipLostError
from controller.policy import Policy
from tests.controller.test_service import Clock, _service


def _policy() -> Policy:
    return Policy.model_validate({"name": "p", "target": {"kind": "deployment", "namespace": "prod", "name": "q"}})


def test_a_lease_lost_before_the_scale_changes_no_count() -> None:
    actuator = DryRunActuator()
    with pytest.raises(LeadershipLostError, match="p: the lease was lost before the scale to 3"):
        asyncio.run(actuator.scale(_policy(), 3, still_leading=lambda: False))
    assert (actuator.counts, actuator.calls) == ({"p": 1}, [])
    assert asyncio.run(actuator.scale(_policy(), 1, still_leading=lambda: False)).changed is False  # nothing to write
    assert asyncio.run(actuator.scale(_policy(), 3)).changed and actuator.calls == [("p", 3)]


def test_its_count_starts_from_the_fleet_observed_and_reports_no_ready_count_of_its_own() -> None:
    actuator = DryRunActuator()
    count = asyncio.run(actuator.replicas(_policy()))
    assert (count.desired, count.ready) == (1, None)  # nothing observed yet: min_replicas; ready unknown
    actuator.seed("p", None)  # a source error: nothing to start from
    actuator.seed("p", 4)
    actuator.seed("p", 7)  # only the first observation seeds; later ones are the fleet its scales pretend to change
    assert asyncio.run(actuator.replicas(_policy())) == ReplicaCount(desired=4)
    assert asyncio.run(actuator.scale(_policy(), 6)).previous == 4
    asyncio.run(actuator.release("p"))  # deleted: created again, it starts from what is observed then
    actuator.seed("p", 2)
    assert asyncio.run(actuator.replicas(_policy())) == ReplicaCount(desired=2)


def test_a_dry_run_decides_from_the_replicas_observed(tmp_path: Path) -> None:
    """It reported its own count (min_replicas) as ready and as current: with 4 engines serving, a dry run decided
    1 -> 2 where the actuator that writes decides 4 -> 8."""
    actuator = DryRunActuator()
    service, store, _ = _service(tmp_path, Clock(), actuator=actuator)
    store.create_policy(Policy.model_validate({
        "name": "chat", "target": {"kind": "deployment", "namespace": "prod", "name": "chat"},
        "scaling": {"min_replicas": 1, "max_replicas": 8},
    }))  # fmt: skip
    service.source.fields = {  # type: ignore[attr-defined]
        "ready_replicas": 4, "queue_depth": 8.0, "running_requests": 8.0, "kv_cache_usage": 0.9,
    }
    asyncio.run(service.tick())
    [record] = store.list_decisions()
    assert (record.action, record.current_replicas, record.desired_replicas) == ("scale_up", 4, 8)
    assert record.inputs["ready_replicas"] == 4 and actuator.calls == [("chat", 8)]
