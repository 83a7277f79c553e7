"""The controller service when its lease is lost during a tick: what is left of the tick, a scale's retries and the
rebalancing, is left to the new leader and logged ``standby``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controller.actuators import KubernetesActuator, api_client
from controller.config import KubernetesConfig
from controller.policy import Policy
from tests.controller.kube_standin import Fault, StandInApiServer
from tests.controller.test_service import OVERLOADED, Clock, LosesTheLease, LosesTheLeaseWhenScaled, _policy, _service


def test_a_scale_whose_retries_outlive_the_lease_writes_no_more_and_is_logged_standby(tmp_path: Path) -> None:
    """Leadership was read once before the scale; its retries (up to ``retry_deadline_s``) went on writing after a
    standby had taken the lease over, and the decision was logged ``applied``."""
    elector = LosesTheLease()
    with StandInApiServer() as server:
        path = server.add_deployment_scale("prod", "chat", 1)
        server.state.faults.append(Fault("PUT", "/scale", 503))  # the first write fails; the lease goes in the backoff
        config = KubernetesConfig(host=server.url, backoff_initial_s=0.0, request_timeout_s=5)
        actuator = KubernetesActuator(api_client(config), config=config,
                                      sleep=lambda _s: setattr(elector, "is_leader", False))  # fmt: skip
        service, store, _ = _service(tmp_path, Clock(), actuator=actuator, elector=elector)
        store.create_policy(_policy())
        service.source.fields = OVERLOADED  # type: ignore[attr-defined]
        asyncio.run(service.tick())
        assert [code for method, p, code in server.state.log if method == "PUT" and p == path] == [503]
        assert server.obj(path)["spec"]["replicas"] == 1
    [record] = store.list_decisions()
    assert (record.action, record.outcome) == ("scale_up", "standby")
    assert "the lease was lost before the scale to 3 was written" in record.detail


class RecordingRebalancer:
    """Records the policies it was asked to rebalance."""

    def __init__(self) -> None:
        self.ticked: list[str] = []

    async def tick(self, policy: Policy, endpoints: list[str], now_s: float, **_: object) -> list[object]:
        self.ticked.append(policy.name)
        return []

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize("lost", [True, False])
def test_a_lease_lost_during_the_tick_starts_no_rebalance(tmp_path: Path, lost: bool) -> None:
    elector = LosesTheLease()
    service, store, _ = _service(tmp_path, Clock(), actuator=LosesTheLeaseWhenScaled(elector, loses=lost),
                                 elector=elector)  # fmt: skip
    rebalancer = service.rebalancer = RecordingRebalancer()  # type: ignore[assignment]
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    # Leader when the tick began, not when the rebalancing would begin: the new leader rebalances.
    assert rebalancer.ticked == ([] if lost else ["chat"])
