"""A Kubernetes scale checked against the count it was decided from, within one deadline, and refused for an HPA
target when it would remove no replica (against the stand-in API server on loopback)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.actuators import DryRunActuator, KubernetesActuator, ScaleResult, StillLeading, api_client
from controller.actuators.base import always_leading
from controller.config import FINAL_READ_TIMEOUT_S, ControllerSettings, KubernetesConfig
from controller.errors import ActuationError
from controller.policy import Policy
from tests.controller.kube_standin import StandInApiServer
from tests.controller.test_service import OVERLOADED, Clock, _policy, _service


@pytest.fixture()
def server() -> Iterator[StandInApiServer]:
    with StandInApiServer() as srv:
        yield srv


def _actuator(server: StandInApiServer, **config: float) -> KubernetesActuator:
    settings = KubernetesConfig(host=server.url, backoff_initial_s=0.0, **config)  # type: ignore[arg-type]
    return KubernetesActuator(api_client(settings), config=settings, sleep=lambda _s: None)


def _k8s_policy(hpa: str | None = None) -> Policy:
    target = {"kind": "deployment", "namespace": "prod", "name": "qwen", "model": "Qwen/Qwen3-30B-A3B"}
    if hpa:
        target["hpa"] = hpa
    return Policy.model_validate({"name": "p", "target": target})


def _writes(server: StandInApiServer) -> list[tuple[str, str]]:
    return [(method, path) for method, path, _code in server.state.log if method in ("PUT", "PATCH")]


def test_a_count_another_writer_changed_since_the_ticks_read_is_not_overwritten(server: StandInApiServer) -> None:
    """The scale's own first read was the count it compared retries with: an operator's ``kubectl scale`` to 10
    between the tick's read (4) and the scale (to 6) was overwritten, and 4 serving pods were removed."""
    path = server.add_deployment_scale("prod", "qwen", 4)
    actuator, policy = _actuator(server), _k8s_policy()
    assert asyncio.run(actuator.replicas(policy)).desired == 4  # the tick decides 4 -> 6 from this
    with server.state.lock:
        server.state.objects[path]["spec"]["replicas"] = 10  # the operator, meanwhile
    with pytest.raises(ActuationError, match=r"from 4 to 10 .*not written \(the next tick decides from 10"):
        asyncio.run(actuator.scale(policy, 6, expected=4))
    assert server.obj(path)["spec"]["replicas"] == 10 and actuator.writes == 0 and _writes(server) == []
    assert asyncio.run(actuator.scale(policy, 6, expected=10)).previous == 10  # decided afresh: written


def test_an_hpa_target_is_compared_with_the_count_it_reports_not_its_floor(server: StandInApiServer) -> None:
    """``replicas()`` reports the higher of the floor and the workload's count: compared with the floor, every scale
    of an HPA the workload runs above would be refused."""
    hpa = server.add_hpa("prod", "qwen-hpa", min_replicas=2, max_replicas=8, current=4)
    server.add_deployment_scale("prod", "qwen", 4)
    actuator, policy = _actuator(server), _k8s_policy(hpa="qwen-hpa")
    reported = asyncio.run(actuator.replicas(policy)).desired
    assert reported == 4
    with pytest.raises(ActuationError, match="another writer changed the count from 2 to 4"):
        asyncio.run(actuator.scale(policy, 6, expected=2))
    result = asyncio.run(actuator.scale(policy, 6, expected=reported))
    assert (result.previous, result.replicas, result.changed) == (4, 6, True)
    assert server.obj(hpa)["spec"]["minReplicas"] == 6


class Recording(DryRunActuator):
    """Remembers the ``expected`` count each scale was given."""

    def __init__(self) -> None:
        super().__init__()
        self.expected: list[int | None] = []

    async def scale(
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        self.expected.append(expected)
        return await super().scale(policy, replicas, still_leading=still_leading, expected=expected)


def test_the_service_scales_from_the_count_its_decision_was_made_from(tmp_path: Path) -> None:
    actuator = Recording()
    service, store, _registry = _service(tmp_path, Clock(), actuator=actuator)
    store.create_policy(_policy())
    service.source.fields = OVERLOADED  # type: ignore[attr-defined]
    asyncio.run(service.tick())
    [record] = store.list_decisions()
    assert record.outcome == "applied" and record.current_replicas is not None
    assert actuator.expected == [record.current_replicas]


def test_one_scale_ends_within_its_deadline_however_many_requests_it_makes(server: StandInApiServer) -> None:
    """Each request of an attempt (the read, the HPA list, the write) had the full request timeout: against an API
    server answering each in 0.6 s, a call with a 1 s deadline wrote its count after 1.8 s, past the service's bound
    on it, which had logged the scale failed (and given its cooldown back) by then."""
    path = server.add_deployment_scale("prod", "qwen", 3)
    server.state.stalls.update({"/scale": 0.6, "/horizontalpodautoscalers": 0.6})
    actuator = _actuator(server, request_timeout_s=1.0, retry_deadline_s=1.0)
    started = time.monotonic()
    with pytest.raises(ActuationError, match=r"scale to 2 failed after 1 attempts within 1 s"):
        asyncio.run(actuator.scale(_k8s_policy(), 2, expected=3))
    took_s = time.monotonic() - started
    time.sleep(0.8)  # a request the stand-in still answers would have landed by now
    assert server.obj(path)["spec"]["replicas"] == 3 and _writes(server) == []
    settings = ControllerSettings(actuator="kubernetes", kubernetes=actuator.config)
    assert settings.scale_backstop_s is not None and took_s < 1.0 + FINAL_READ_TIMEOUT_S < settings.scale_backstop_s
