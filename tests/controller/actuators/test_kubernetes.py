"""The Kubernetes actuator against a stand-in API server on loopback (conflicts, 5xx, idempotence)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controller.actuators import KubernetesActuator, api_client
from controller.config import KubernetesConfig
from controller.errors import ActuationError, LeadershipLostError
from controller.policy import Policy
from controller.sources.base import LateAnswerError, within
from tests.controller.kube_standin import Fault, StandInApiServer


@pytest.fixture()
def server() -> Iterator[StandInApiServer]:
    with StandInApiServer() as srv:
        yield srv


def _actuator(server: StandInApiServer, attempts: int = 4) -> KubernetesActuator:
    config = KubernetesConfig(host=server.url, max_attempts=attempts, backoff_initial_s=0.0, request_timeout_s=5)
    return KubernetesActuator(api_client(config), config=config, sleep=lambda _s: None)


def _policy(kind: str = "deployment", hpa: str | None = None) -> Policy:
    target = {"kind": kind, "namespace": "prod", "name": "qwen", "model": "Qwen/Qwen3-30B-A3B"}
    if hpa:
        target["hpa"] = hpa
    return Policy.model_validate({"name": "p", "target": target})


def test_deployment_scale_reads_and_patches_the_scale_subresource(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 2)
    actuator = _actuator(server)
    count = asyncio.run(actuator.replicas(_policy()))
    assert (count.desired, count.ready) == (2, 2)
    result = asyncio.run(actuator.scale(_policy(), 5))
    assert (result.previous, result.replicas, result.changed) == (2, 5, True)
    assert server.obj(path)["spec"]["replicas"] == 5
    assert len(server.writes_to(path)) == 1


def test_ready_counts_the_ready_pods_not_every_pod_created(server: StandInApiServer) -> None:
    # Scaled to 3, the scale's status counts 3 pods; two are still loading the model (not Ready).
    server.add_deployment_scale("prod", "qwen", 3, ready_pods=1)
    server.add_pod("prod", "late-1", "10.0.0.8", {"app": "x"}, ready=False)
    server.add_pod("prod", "late-2", "10.0.0.9", {"app": "x"}, ready=False)
    count = asyncio.run(_actuator(server).replicas(_policy()))
    assert (count.desired, count.ready) == (3, 1)


def test_scaling_to_the_current_count_writes_nothing(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 3)
    result = asyncio.run(_actuator(server).scale(_policy(), 3))
    assert not result.changed
    assert server.writes_to(path) == []


def test_resource_version_conflict_rereads_and_retries(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 2)

    def someone_else(obj: dict) -> None:
        obj["metadata"]["annotations"] = {"note": "touched"}  # another writer changed the object, not its count

    server.state.before_put[path] = someone_else
    actuator = _actuator(server)
    result = asyncio.run(actuator.scale(_policy(), 6))
    assert result.replicas == 6 and result.attempts == 2
    assert server.obj(path)["spec"]["replicas"] == 6
    codes = [code for method, p, code in server.state.log if method == "PUT" and p == path]
    assert codes == [409, 200]


def test_a_count_another_writer_set_meanwhile_is_not_overwritten(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 6)
    # Decided from 6; meanwhile someone ran `kubectl scale --replicas=10`.
    server.state.before_put[path] = lambda obj: obj["spec"].__setitem__("replicas", 10)
    with pytest.raises(ActuationError, match=r"another writer changed the count from 6 to 10 .* not overwritten"):
        asyncio.run(_actuator(server).scale(_policy(), 4))
    assert server.obj(path)["spec"]["replicas"] == 10


def test_a_stalled_api_server_is_given_up_on_within_the_deadline(server: StandInApiServer) -> None:
    server.add_deployment_scale("prod", "qwen", 2)
    server.state.stalls["/scale"] = 2.0
    config = KubernetesConfig(host=server.url, max_attempts=5, backoff_initial_s=0.0, request_timeout_s=10,
                              retry_deadline_s=0.6)  # fmt: skip
    actuator = KubernetesActuator(api_client(config), config=config, sleep=lambda _s: None)
    began = time.monotonic()
    with pytest.raises(ActuationError, match=r"scale to 4 failed after 1 attempts within 0.6 s"):
        asyncio.run(actuator.scale(_policy(), 4))
    assert time.monotonic() - began < 1.5  # not 5 attempts of 10 s: the tick loop goes on


def test_an_overloaded_api_servers_retry_after_is_waited_for(server: StandInApiServer) -> None:
    """A 429's ``Retry-After`` was ignored: the retry came after the backoff's few milliseconds, into the same
    overload (client-go waits as asked)."""
    path = server.add_deployment_scale("prod", "qwen", 2)
    server.state.faults.append(Fault("PUT", "/scale", 429, retry_after="3"))
    server.state.faults.append(Fault("PUT", "/scale", 503, retry_after="soon"))  # not a number: the backoff alone
    waits: list[float] = []
    config = KubernetesConfig(host=server.url, max_attempts=4, backoff_initial_s=0.01, request_timeout_s=5,
                              retry_deadline_s=30)  # fmt: skip
    actuator = KubernetesActuator(api_client(config), config=config, sleep=waits.append)
    assert asyncio.run(actuator.scale(_policy(), 5)).replicas == 5
    assert [c for m, p, c in server.state.log if m == "PUT" and p == path] == [429, 503, 200]
    assert waits[0] == pytest.approx(3.0, abs=0.01) and waits[1] < 0.1


def test_a_workload_an_undeclared_hpa_scales_is_refused_with_the_hpa_named(server: StandInApiServer) -> None:
    """Scaled behind an HPA's back, the count went back within seconds and every tick wrote it again."""
    path = server.add_deployment_scale("prod", "qwen", 2)
    server.add_hpa("prod", "other", min_replicas=1, max_replicas=3, current=2)  # scales deployment "other"
    assert asyncio.run(_actuator(server).scale(_policy(), 3)).replicas == 3
    server.add_hpa("prod", "qwen", min_replicas=1, max_replicas=8, current=3)
    with pytest.raises(ActuationError, match=r"the HPA 'qwen' scales it .* \(target.hpa: qwen\)"):
        asyncio.run(_actuator(server).scale(_policy(), 5))
    assert server.obj(path)["spec"]["replicas"] == 3
    assert asyncio.run(_actuator(server).scale(_policy(), 3)).changed is False  # no write: no check needed


def test_hpas_that_cannot_be_listed_leave_scaling_as_it_was(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 2)
    server.state.faults.append(Fault("GET", "/horizontalpodautoscalers", 403))  # a Role from before the check
    assert asyncio.run(_actuator(server).scale(_policy(), 4)).replicas == 4
    assert server.obj(path)["spec"]["replicas"] == 4


def test_a_scale_its_caller_gave_up_on_sends_no_write_after(server: StandInApiServer) -> None:
    """The tick's bound cut the scale's await off, but its worker thread went on: after the backoff it wrote, the
    scale already logged as failed."""
    path = server.add_deployment_scale("prod", "qwen", 2)
    server.state.faults.append(Fault("PUT", "/scale", 503))
    config = KubernetesConfig(host=server.url, max_attempts=4, backoff_initial_s=1.0, backoff_max_s=1.0,
                              request_timeout_s=5, retry_deadline_s=30)  # fmt: skip
    actuator = KubernetesActuator(api_client(config), config=config)  # the real backoff: cut off during it
    with pytest.raises(LateAnswerError):
        asyncio.run(within(actuator.scale(_policy(), 5), 0.3, "kubernetes scale"))  # waits for the worker to end
    time.sleep(0.2)
    assert [c for m, p, c in server.state.log if m == "PUT" and p == path] == [503]
    assert server.obj(path)["spec"]["replicas"] == 2


def test_a_read_its_caller_gave_up_on_stops_retrying_a_stalled_api_server(server: StandInApiServer) -> None:
    """Each read cut off by the tick's bound left a thread retrying for ``max_attempts`` requests: they piled up
    while the API server stalled."""
    path = server.add_deployment_scale("prod", "qwen", 2)
    server.state.stalls["/scale"] = 0.5
    config = KubernetesConfig(host=server.url, max_attempts=20, backoff_initial_s=0.0, request_timeout_s=0.2,
                              retry_deadline_s=30)  # fmt: skip
    actuator = KubernetesActuator(api_client(config), config=config)
    with pytest.raises(LateAnswerError):
        asyncio.run(within(actuator.replicas(_policy()), 0.5, "kubernetes replica count"))
    time.sleep(0.6)  # the stalled requests' answers, logged when the stand-in sends them
    assert 1 <= len([p for m, p, _ in server.state.log if m == "GET" and p == path]) <= 4  # not 20


def test_a_write_applied_but_answered_with_an_error_on_the_last_attempt_counts_as_applied(
    server: StandInApiServer,
) -> None:
    path = server.add_deployment_scale("prod", "qwen", 2)
    server.state.faults.append(Fault("PUT", "/scale", 500, apply_first=True))
    result = asyncio.run(_actuator(server, attempts=1).scale(_policy(), 5))
    assert (result.previous, result.replicas, result.changed) == (2, 5, True)
    assert server.obj(path)["spec"]["replicas"] == 5


def test_conflict_where_the_other_writer_already_set_the_count_stops_without_writing(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 2)
    server.state.before_put[path] = lambda obj: obj["spec"].__setitem__("replicas", 4)
    actuator = _actuator(server)
    result = asyncio.run(actuator.scale(_policy(), 4))
    assert result.replicas == 4
    assert server.writes_to(path) == []  # the only change was the other writer's
    assert actuator.writes == 1  # our one attempt got 409, the re-read saw 4 and stopped


def test_5xx_is_retried_with_backoff(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 1)
    server.state.faults.extend([Fault("PUT", "/scale", 503), Fault("GET", "/scale", 500)])
    result = asyncio.run(_actuator(server).scale(_policy(), 2))
    assert result.replicas == 2
    assert server.obj(path)["spec"]["replicas"] == 2
    assert len(server.writes_to(path)) == 1


def test_a_write_applied_but_answered_with_500_is_never_applied_twice(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 1)
    server.state.faults.append(Fault("PUT", "/scale", 500, apply_first=True))
    actuator = _actuator(server)
    result = asyncio.run(actuator.scale(_policy(), 3))
    assert result.replicas == 3 and result.changed
    assert len(server.writes_to(path)) == 1
    assert actuator.writes == 1


def test_persistent_5xx_raises_actuation_error_after_the_attempts(server: StandInApiServer) -> None:
    server.add_deployment_scale("prod", "qwen", 1)
    server.state.faults.extend(Fault("GET", "/scale", 503) for _ in range(10))
    with pytest.raises(ActuationError, match=r"after 3 attempts: HTTP 503"):
        asyncio.run(_actuator(server, attempts=3).scale(_policy(), 2))


def test_missing_workload_is_not_retried(server: StandInApiServer) -> None:
    with pytest.raises(ActuationError, match=r"deployment prod/qwen: .*HTTP 404"):
        asyncio.run(_actuator(server).scale(_policy(), 2))
    assert len(server.state.log) == 1


def test_leaderworkerset_scale_subresource(server: StandInApiServer) -> None:
    path = server.add_lws_scale("prod", "qwen", 2)
    actuator = _actuator(server)
    assert asyncio.run(actuator.replicas(_policy("leaderworkerset"))).desired == 2
    server.state.before_put[path] = lambda obj: None  # bumps the resourceVersion: one conflict
    result = asyncio.run(actuator.scale(_policy("leaderworkerset"), 1))
    assert result.replicas == 1
    assert server.obj(path)["spec"]["replicas"] == 1


def test_hpa_owned_workload_gets_its_min_replicas_raised(server: StandInApiServer) -> None:
    path = server.add_hpa("prod", "qwen-hpa", min_replicas=2, max_replicas=4, current=3)
    server.add_deployment_scale("prod", "qwen", 3)
    actuator = _actuator(server)
    policy = _policy(hpa="qwen-hpa")
    count = asyncio.run(actuator.replicas(policy))
    assert (count.desired, count.ready) == (3, 3)
    asyncio.run(actuator.scale(policy, 6))
    spec = server.obj(path)["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (6, 6)
    asyncio.run(actuator.scale(policy, 3))
    spec = server.obj(path)["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (3, 4)  # the owner's maxReplicas given back


def test_an_hpa_scaled_above_its_floor_reports_the_replicas_that_run(server: StandInApiServer) -> None:
    """The floor was reported as the count: with 4 pods serving over a floor of 1, a scale-up was sized from 1
    and asked for fewer replicas than ran, a write that changed nothing."""
    path = server.add_hpa("prod", "qwen-hpa", min_replicas=1, max_replicas=8, current=4)
    server.add_deployment_scale("prod", "qwen", 4)
    actuator, policy = _actuator(server), _policy(hpa="qwen-hpa")
    count = asyncio.run(actuator.replicas(policy))
    assert (count.desired, count.ready) == (4, 4)
    assert asyncio.run(actuator.scale(policy, 1, expected=4)).changed is False  # the floor already is 1
    result = asyncio.run(actuator.scale(policy, 6, expected=4))  # compared with the count reported, not the floor
    assert (result.previous, result.replicas, result.changed) == (4, 6, True)
    assert server.obj(path)["spec"]["minReplicas"] == 6
    assert asyncio.run(actuator.replicas(policy)).desired == 6  # the floor, above the workload's count until it grows


def test_an_hpa_maximum_its_owner_changed_after_a_lift_is_kept(server: StandInApiServer) -> None:
    path = server.add_hpa("prod", "qwen-hpa", min_replicas=2, max_replicas=4, current=3)
    server.add_deployment_scale("prod", "qwen", 3)
    actuator, policy = _actuator(server), _policy(hpa="qwen-hpa")
    asyncio.run(actuator.scale(policy, 6))
    server.state.objects[path]["spec"]["maxReplicas"] = 12  # the owner raised it by hand
    asyncio.run(actuator.scale(policy, 3))
    spec = server.obj(path)["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (3, 12)


def _hpa_with_fields_of_a_newer_server(server: StandInApiServer) -> str:
    """An HPA with spec fields the installed client's model may not know (a newer API server's)."""
    path = server.add_hpa("prod", "qwen-hpa", min_replicas=1, max_replicas=8, current=1)
    server.add_deployment_scale("prod", "qwen", 1)  # a scale reads the count that runs too
    with server.state.lock:
        spec = server.state.objects[path]["spec"]
        spec["behavior"] = {"scaleUp": {"stabilizationWindowSeconds": 0, "tolerance": "0.05", "futureKnob": "keep"}}
        spec["futureSpecField"] = {"x": 1}
    return path


def test_an_hpa_floor_change_keeps_the_spec_fields_the_client_does_not_know(server: StandInApiServer) -> None:
    """The floor was written by replacing the whole HPA as the client's typed model read it: fields a newer API
    server serves and the model lacks were dropped.  A merge patch names only the fields it sets."""
    path = _hpa_with_fields_of_a_newer_server(server)
    actuator, policy = _actuator(server), _policy(hpa="qwen-hpa")
    for floor, bounds, lifted_from in ((3, (3, 8), None), (10, (10, 10), "8"), (2, (2, 8), None)):
        asyncio.run(actuator.scale(policy, floor))
        hpa = server.obj(path)
        spec = hpa["spec"]
        assert (spec["minReplicas"], spec["maxReplicas"]) == bounds
        assert (spec["behavior"]["scaleUp"]["futureKnob"], spec["futureSpecField"]) == ("keep", {"x": 1})
        assert (hpa["metadata"].get("annotations") or {}).get("moeslo.io/max-replicas-before-floor") == lifted_from
    assert [(m, c) for m, p, c in server.state.log if p == path and m != "GET"] == [("PATCH", 200)] * 3


def test_an_hpa_changed_since_its_read_is_a_conflict_and_read_again(server: StandInApiServer) -> None:
    path = _hpa_with_fields_of_a_newer_server(server)

    def someone_else(hpa: dict) -> None:
        hpa["spec"]["behavior"]["scaleDown"] = {"stabilizationWindowSeconds": 300}  # the owner's edit, not the floor

    server.state.before_put[path] = someone_else
    result = asyncio.run(_actuator(server).scale(_policy(hpa="qwen-hpa"), 4))
    assert (result.previous, result.replicas, result.attempts) == (1, 4, 2)
    spec = server.obj(path)["spec"]
    assert spec["minReplicas"] == 4 and spec["behavior"]["scaleDown"] == {"stabilizationWindowSeconds": 300}
    assert [(m, c) for m, p, c in server.state.log if p == path and m != "GET"] == [("PATCH", 409), ("PATCH", 200)]


def test_a_lease_lost_between_attempts_stops_the_scale_before_its_next_write(server: StandInApiServer) -> None:
    """A deposed leader's retries went on writing for up to ``retry_deadline_s`` after a standby had taken the
    lease over: leadership is now asked right before each write."""
    path = server.add_deployment_scale("prod", "qwen", 2)
    server.state.faults.append(Fault("PUT", "/scale", 503))
    leading = iter([True, False])  # the first write (answered 503) was made as the leader; the retry is not
    actuator = _actuator(server)
    with pytest.raises(LeadershipLostError, match=r"deployment prod/qwen: the lease was lost before the scale to 5"):
        asyncio.run(actuator.scale(_policy(), 5, still_leading=lambda: next(leading)))
    assert [c for m, p, c in server.state.log if m == "PUT" and p == path] == [503]  # no write after the loss
    assert server.obj(path)["spec"]["replicas"] == 2 and actuator.writes == 1


def test_an_hpa_floor_of_zero_is_refused() -> None:
    config = KubernetesConfig(host="http://127.0.0.1:9")
    actuator = KubernetesActuator(api_client(config), config=config)
    target = {"kind": "deployment", "namespace": "prod", "name": "qwen", "hpa": "qwen-hpa"}
    policy = Policy.model_validate({"name": "p", "target": target, "scaling": {"min_replicas": 0}})
    [problem] = actuator.check(policy)
    assert problem.startswith("scaling.min_replicas: 0")
    assert actuator.check(_policy(hpa="qwen-hpa")) == []


def test_non_kubernetes_targets_are_refused_for_enforcement() -> None:
    config = KubernetesConfig(host="http://127.0.0.1:9")
    actuator = KubernetesActuator(api_client(config), config=config)
    local = Policy.model_validate({"name": "p", "target": {"kind": "local"}})
    assert actuator.check(local) == ["target.kind: 'local' cannot be scaled by the kubernetes actuator"]
    assert actuator.check(_policy()) == []


def test_the_ready_pods_of_the_workload_are_its_endpoints(server: StandInApiServer) -> None:
    server.add_deployment_scale("prod", "qwen", 3, ready_pods=0)  # its scale reports the selector app=x
    server.add_pod("prod", "a", "10.0.0.2", {"app": "x"})
    server.add_pod("prod", "b", "10.0.0.3", {"app": "x"}, ready=False)  # starting: not yet
    server.add_pod("prod", "c", "10.0.0.4", {"app": "x"}, terminating=True)  # leaving: no more
    server.add_pod("prod", "d", "10.0.0.5", {"app": "y"})  # another workload
    server.add_pod("dev", "e", "10.0.0.6", {"app": "x"})  # another namespace
    actuator, policy = _actuator(server), _policy()
    assert actuator.endpoints(policy) == ()  # nothing read yet
    asyncio.run(actuator.replicas(policy))
    assert actuator.endpoints(policy) == ("http://10.0.0.2:8000",)
    server.add_pod("prod", "f", "10.0.0.7", {"app": "x"})
    asyncio.run(actuator.replicas(policy))
    assert actuator.endpoints(policy) == ("http://10.0.0.2:8000", "http://10.0.0.7:8000")


def test_an_ipv6_pod_is_named_by_a_url_a_client_reads(server: StandInApiServer) -> None:
    """``http://fd00:10:244::5:8000`` is no URL: on an IPv6 cluster the router was given no replica."""
    server.add_deployment_scale("prod", "qwen", 2, ready_pods=0)
    server.add_pod("prod", "a", "fd00:10:244::5", {"app": "x"})
    server.add_pod("prod", "b", "10.0.0.2", {"app": "x"})  # a dual-stack cluster's IPv4 pod as it was
    actuator, policy = _actuator(server), _policy()
    asyncio.run(actuator.replicas(policy))
    assert actuator.endpoints(policy) == ("http://10.0.0.2:8000", "http://[fd00:10:244::5]:8000")
    assert httpx.URL(actuator.endpoints(policy)[1]).host == "fd00:10:244::5"


def test_leaderworkerset_endpoints_are_the_group_leaders_and_a_failed_list_keeps_the_last(
    server: StandInApiServer,
) -> None:
    server.add_lws_scale("prod", "qwen", 2)
    server.add_pod("prod", "qwen-0", "10.0.1.1", {"lws": "qwen", "worker-index": "0"})
    server.add_pod("prod", "qwen-0-1", "10.0.1.2", {"lws": "qwen", "worker-index": "1"})
    actuator, policy = _actuator(server), _policy("leaderworkerset")
    asyncio.run(actuator.replicas(policy))
    assert actuator.endpoints(policy) == ("http://10.0.1.1:8000",)
    server.state.faults.append(Fault("GET", "/pods", 500))
    server.add_pod("prod", "qwen-1", "10.0.1.3", {"lws": "qwen", "worker-index": "0"})
    assert asyncio.run(actuator.replicas(policy)).desired == 2  # the count is still read
    assert actuator.endpoints(policy) == ("http://10.0.1.1:8000",)
    assert ("GET", "/api/v1/namespaces/prod/pods", 500) in server.state.log
    asyncio.run(actuator.replicas(policy))
    assert actuator.endpoints(policy) == ("http://10.0.1.1:8000", "http://10.0.1.3:8000")


def test_a_kubeconfig_that_cannot_load_is_one_clear_error(tmp_path: Path) -> None:
    from contracts.errors import ValidationError

    missing = tmp_path / "absent-kubeconfig"
    with pytest.raises(ValidationError, match=f"kubernetes: cannot load kubeconfig {missing}"):
        api_client(KubernetesConfig(kubeconfig=str(missing)))
    empty = tmp_path / "empty-kubeconfig"
    empty.write_text("")
    with pytest.raises(ValidationError, match="cannot load kubeconfig"):
        api_client(KubernetesConfig(kubeconfig=str(empty)))
    with pytest.raises(ValidationError, match="cannot load the in-cluster service account"):
        api_client(KubernetesConfig(in_cluster=True))


def test_a_refusal_carries_the_api_servers_own_message(server: StandInApiServer) -> None:
    server.add_deployment_scale("prod", "qwen", 2)
    rbac = ('deployments.apps "qwen" is forbidden: User "system:serviceaccount:moeslo:moeslo-controller" cannot '
            'update resource "deployments/scale" in API group "apps" in the namespace "prod"')
    server.state.faults.append(Fault("PUT", "/scale", 403, message=rbac))
    with pytest.raises(ActuationError) as refused:
        asyncio.run(_actuator(server).scale(_policy(), 5))
    assert "HTTP 403" in str(refused.value) and 'in the namespace "prod"' in str(refused.value)


def test_a_deleted_workload_stops_advertising_its_pods(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 2)
    actuator, policy = _actuator(server), _policy()
    asyncio.run(actuator.replicas(policy))
    assert len(actuator.endpoints(policy)) == 2
    del server.state.objects[path]
    with pytest.raises(ActuationError, match="HTTP 404"):
        asyncio.run(actuator.replicas(policy))
    assert actuator.endpoints(policy) == ()  # their IPs may serve other pods by now


def test_an_answer_of_the_wrong_shape_is_an_actuation_error(server: StandInApiServer) -> None:
    # A Deployment's scale whose count is no number (a proxy's rewrite, a skewed API server): the client's
    # parse raises ValueError, which is this workload's failure, not the tick's.
    for path in (server.add_deployment_scale("prod", "qwen", 2), server.add_lws_scale("prod", "lws", 2)):
        server.state.objects[path]["spec"]["replicas"] = "two"
    actuator = _actuator(server)
    with pytest.raises(ActuationError, match="malformed answer"):
        asyncio.run(actuator.replicas(_policy()))
    with pytest.raises(ActuationError, match="malformed answer"):
        asyncio.run(actuator.scale(_policy(), 3))
    lws_policy = Policy.model_validate({"name": "l", "target": {"kind": "leaderworkerset", "namespace": "prod",
                                                                "name": "lws"}})  # fmt: skip
    with pytest.raises(ActuationError, match="malformed answer"):
        asyncio.run(actuator.scale(lws_policy, 3))
