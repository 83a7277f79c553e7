"""Pod deletion costs before a Deployment's scale-down: the pods with the least in flight go first."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from controller.actuators import KubernetesActuator, api_client, build_actuator
from controller.actuators.kube_pods import (
    DELETION_COST_ANNOTATION,
    MAX_COST,
    PodLoadReader,
    deletion_costs,
    in_flight,
)
from controller.config import ControllerSettings, KubernetesConfig
from controller.errors import ActuationError, LeadershipLostError
from controller.policy import Policy
from tests.controller.kube_standin import Fault, StandInApiServer

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.5
"""


def test_in_flight_sums_running_and_waiting_over_every_engine() -> None:
    assert in_flight(VLLM_METRICS) == 6.0
    assert in_flight("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n") is None


def test_costs_are_the_loads_and_a_pod_not_read_ranks_above_every_pod_read() -> None:
    assert deletion_costs({"a": 5.0, "b": 0.0, "c": 1.5, "d": None}) == {"a": 5, "b": 0, "c": 2, "d": 6}
    assert deletion_costs({"a": None, "b": float("nan")}) == {}  # nothing known: nothing to say which to keep
    assert deletion_costs({}) == {}
    # Kubernetes parses the annotation as an int32: a value past it was refused, and every pod left unmarked.
    assert deletion_costs({"a": 3e9, "b": None}) == {"a": MAX_COST - 1, "b": MAX_COST}


class _Metrics(BaseHTTPRequestHandler):
    def log_message(self, *_args: Any) -> None:
        return

    def do_GET(self) -> None:
        body = VLLM_METRICS.encode() if self.path == "/metrics" else b"not found"
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def metrics_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_loads_are_read_from_each_pods_metrics_and_a_pod_that_does_not_answer_is_none(metrics_url: str) -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    closed_url = f"http://127.0.0.1:{closed.server_address[1]}"
    closed.server_close()  # nothing listens there now
    reader = PodLoadReader(timeout_s=2.0)
    try:
        assert reader([metrics_url, closed_url], 5.0) == {metrics_url: 6.0, closed_url: None}
        assert reader([], 5.0) == {}
    finally:
        reader.close()


def test_a_pod_that_accepts_and_never_answers_reads_as_not_read_within_the_budget(metrics_url: str) -> None:
    """A per-read timeout bounds each network operation, not the answer: a pod that dripped held the scale."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)  # the kernel completes the handshake; nothing ever answers
        silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        reader = PodLoadReader(timeout_s=30.0)
        try:
            started = time.monotonic()
            assert reader([metrics_url, silent_url], 0.5) == {metrics_url: 6.0, silent_url: None}
            assert time.monotonic() - started < 2.0
        finally:
            reader.close()


@pytest.fixture()
def server() -> Iterator[StandInApiServer]:
    with StandInApiServer() as srv:
        yield srv


class Loads:
    """Pods' requests in flight by URL, as :func:`read_in_flight` would read them; the URLs it was asked for."""

    def __init__(self, loads: Mapping[str, float | None], then: Callable[[], None] | None = None) -> None:
        self.loads = dict(loads)
        self.asked: list[list[str]] = []
        self.then = then
        """What happens while the loads are read (a lease lost, a wait)."""

    def __call__(self, urls: Sequence[str], budget_s: float) -> dict[str, float | None]:
        assert 0 < budget_s <= 4.0
        self.asked.append(list(urls))
        if self.then is not None:
            self.then()
        return {url: self.loads.get(url) for url in urls}


# The stand-in's pods qwen-0..2 of a Deployment at 3 replicas have the IPs 10.9.0.1-3 (port 8000).
BUSY = {"http://10.9.0.1:8000": 7.0, "http://10.9.0.2:8000": 0.0, "http://10.9.0.3:8000": 3.0}


def _actuator(server: StandInApiServer, loads: Loads | None) -> KubernetesActuator:
    config = KubernetesConfig(host=server.url, max_attempts=2, backoff_initial_s=0.0, request_timeout_s=5)
    return KubernetesActuator(api_client(config), config=config, sleep=lambda _s: None, read_load=loads)


def _policy(hpa: str | None = None) -> Policy:
    target = {"kind": "deployment", "namespace": "prod", "name": "qwen", "model": "Qwen/Qwen3-30B-A3B"}
    if hpa:
        target["hpa"] = hpa
    return Policy.model_validate({"name": "p", "target": target})


def _costs(server: StandInApiServer) -> dict[str, str | None]:
    return {name: notes.get(DELETION_COST_ANNOTATION) for name, notes in server.pod_annotations("prod").items()}


def test_a_scale_down_marks_the_least_busy_pods_to_go_before_it_writes_the_count(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 3)
    result = asyncio.run(_actuator(server, Loads(BUSY)).scale(_policy(), 2))
    assert result.changed and server.obj(path)["spec"]["replicas"] == 2
    assert _costs(server) == {"qwen-0": "7", "qwen-1": "0", "qwen-2": "3"}
    writes = [(method, p) for method, p, _code in server.state.log if method in ("PATCH", "PUT")]
    assert writes[-1] == ("PUT", path) and len(writes) == 4  # the three costs, then the count


def test_costs_that_did_not_change_are_not_written_again(server: StandInApiServer) -> None:
    server.add_deployment_scale("prod", "qwen", 3)
    actuator = _actuator(server, Loads(BUSY))
    asyncio.run(actuator.scale(_policy(), 2))
    asyncio.run(actuator.scale(_policy(), 1))  # the stand-in deletes no pod: all three are still there
    pod_patches = [p for method, p, _code in server.state.log if method == "PATCH"]
    assert len(pod_patches) == 3


def test_a_pod_whose_load_was_not_read_is_kept_before_those_read(server: StandInApiServer) -> None:
    server.add_deployment_scale("prod", "qwen", 3)
    asyncio.run(_actuator(server, Loads({**BUSY, "http://10.9.0.2:8000": None})).scale(_policy(), 2))
    assert _costs(server) == {"qwen-0": "7", "qwen-1": "8", "qwen-2": "3"}


def test_nothing_is_read_or_written_on_a_scale_up_an_hpa_target_or_without_a_reader(server: StandInApiServer) -> None:
    server.add_deployment_scale("prod", "qwen", 3)
    loads = Loads(BUSY)
    asyncio.run(_actuator(server, loads).scale(_policy(), 4))
    asyncio.run(_actuator(server, None).scale(_policy(), 3))
    server.add_hpa("prod", "qwen", min_replicas=3, max_replicas=10, current=3)
    assert asyncio.run(_actuator(server, loads).scale(_policy(hpa="qwen"), 2)).changed
    assert loads.asked == [] and set(_costs(server).values()) == {None}


def test_a_role_without_patch_on_pods_costs_a_log_line_and_the_scale_goes_on(
    server: StandInApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    path = server.add_deployment_scale("prod", "qwen", 3)
    denied = 'pods "qwen-0" is forbidden: User "system:serviceaccount:moeslo:moeslo-controller" cannot patch'
    server.state.faults.append(Fault("PATCH", "/pods/", 403, message=denied))
    with caplog.at_level(logging.WARNING, logger="controller.actuators.kubernetes"):
        result = asyncio.run(_actuator(server, Loads(BUSY)).scale(_policy(), 2))
    assert result.changed and server.obj(path)["spec"]["replicas"] == 2
    assert any("pod deletion costs not written" in r.message and "cannot patch" in r.message for r in caplog.records)


def test_the_controller_service_builds_the_actuator_with_the_metrics_reader() -> None:
    on = build_actuator(ControllerSettings(actuator="kubernetes", kubernetes=KubernetesConfig(host="http://127.0.0.1:1")))
    off = build_actuator(ControllerSettings(
        actuator="kubernetes", kubernetes=KubernetesConfig(host="http://127.0.0.1:1", pod_deletion_cost=False)))
    assert isinstance(on, KubernetesActuator) and isinstance(on._read_load, PodLoadReader)
    assert isinstance(off, KubernetesActuator) and off._read_load is None
    asyncio.run(on.aclose())


def _pod_writes(server: StandInApiServer) -> list[str]:
    return [path.rsplit("/", 1)[1] for method, path, _code in server.state.log if method == "PATCH"]


def test_a_lease_lost_while_the_loads_are_read_writes_no_count(server: StandInApiServer) -> None:
    """The costs came between the last look at the lease and the count's write: a replica no longer the leader
    wrote it."""
    path = server.add_deployment_scale("prod", "qwen", 3)
    leading = [True]
    loads = Loads(BUSY, then=leading.clear)
    with pytest.raises(LeadershipLostError):
        asyncio.run(_actuator(server, loads).scale(_policy(), 2, still_leading=lambda: bool(leading)))
    assert server.obj(path)["spec"]["replicas"] == 3


def test_a_scale_given_up_on_while_the_loads_are_read_writes_no_count(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 3)
    actuator = _actuator(server, Loads(BUSY, then=lambda: time.sleep(1.0)))

    async def give_up() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(actuator.scale(_policy(), 2), 0.3)
        await asyncio.sleep(1.5)  # the thread has read the loads by now

    asyncio.run(give_up())
    assert server.obj(path)["spec"]["replicas"] == 3 and _pod_writes(server) == []


def test_a_pod_whose_write_fails_is_skipped_and_the_busiest_are_marked_first(server: StandInApiServer) -> None:
    server.add_deployment_scale("prod", "qwen", 3)
    server.state.faults.append(Fault("PATCH", "/pods/qwen-2", 404, message="pods \"qwen-2\" not found"))
    asyncio.run(_actuator(server, Loads(BUSY)).scale(_policy(), 2))
    assert _costs(server) == {"qwen-0": "7", "qwen-1": "0", "qwen-2": None}
    assert _pod_writes(server) == ["qwen-0", "qwen-2", "qwen-1"]  # 7, 3, 0


def test_costs_of_an_earlier_scale_down_are_cleared_when_no_load_can_be_read(server: StandInApiServer) -> None:
    """Kept, they ranked the pods by the loads of then."""
    server.add_deployment_scale("prod", "qwen", 3)
    asyncio.run(_actuator(server, Loads(BUSY)).scale(_policy(), 2))
    asyncio.run(_actuator(server, Loads({})).scale(_policy(), 1))
    assert set(_costs(server).values()) == {None}


def test_a_scale_to_zero_reads_no_load(server: StandInApiServer) -> None:
    server.add_deployment_scale("prod", "qwen", 3)
    loads = Loads(BUSY)
    assert asyncio.run(_actuator(server, loads).scale(_policy(), 0)).changed
    assert loads.asked == []


def test_a_scale_down_refused_for_an_undeclared_hpa_marks_no_pod(server: StandInApiServer) -> None:
    """Marked first, every tick's refused scale-down rewrote the pods' costs of a workload an HPA owns."""
    server.add_deployment_scale("prod", "qwen", 3)
    server.add_hpa("prod", "qwen", min_replicas=1, max_replicas=10, current=3)
    with pytest.raises(ActuationError, match="the HPA 'qwen' scales it"):
        asyncio.run(_actuator(server, Loads(BUSY)).scale(_policy(), 2))
    assert _pod_writes(server) == []


def _stale_costs(server: StandInApiServer, costs: Mapping[str, str]) -> None:
    """Costs an earlier scale-down left on the pods."""
    with server.state.lock:
        for pod in server.state.pods["prod"]:
            pod["metadata"]["annotations"] = {DELETION_COST_ANNOTATION: costs[pod["metadata"]["name"]]}


def test_a_pods_cost_write_answered_with_a_5xx_is_retried(server: StandInApiServer) -> None:
    """A failed write was logged and the pod skipped: qwen-0, busiest now, kept the 0 of an earlier scale-down when
    it was idle, and the ReplicaSet removed it first."""
    path = server.add_deployment_scale("prod", "qwen", 3)
    _stale_costs(server, {"qwen-0": "0", "qwen-1": "9", "qwen-2": "3"})
    server.state.faults.extend([Fault("PATCH", "/pods/qwen-0", 500), Fault("PATCH", "/pods/qwen-0", 429)])
    assert asyncio.run(_actuator(server, Loads(BUSY)).scale(_policy(), 2)).changed
    assert server.obj(path)["spec"]["replicas"] == 2
    assert _costs(server) == {"qwen-0": "7", "qwen-1": "0", "qwen-2": "3"}
    assert _pod_writes(server) == ["qwen-0", "qwen-0", "qwen-0", "qwen-1"]  # qwen-2's cost stands


def test_a_busy_pod_whose_stale_cost_cannot_be_replaced_stops_the_scale_down(
    server: StandInApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("controller.actuators.kubernetes.MARK_BUDGET_S", 0.5)  # the retries' budget, kept short
    path = server.add_deployment_scale("prod", "qwen", 3)
    _stale_costs(server, {"qwen-0": "0", "qwen-1": "9", "qwen-2": "3"})
    server.state.faults.extend(Fault("PATCH", "/pods/qwen-0", 503) for _ in range(50))
    with pytest.raises(ActuationError, match=r"pod qwen-0's deletion cost 7 could not be written.* before pod qwen-1"):
        asyncio.run(_actuator(server, Loads(BUSY)).scale(_policy(), 2))
    assert server.obj(path)["spec"]["replicas"] == 3 and not any(m == "PUT" for m, _p, _c in server.state.log)
    assert _pod_writes(server).count("qwen-0") > 1  # retried within the budget


def test_a_pod_whose_stale_cost_still_ranks_it_right_lets_the_scale_down_go_on(server: StandInApiServer) -> None:
    path = server.add_deployment_scale("prod", "qwen", 3)
    _stale_costs(server, {"qwen-0": "12", "qwen-1": "9", "qwen-2": "3"})  # qwen-0 busiest then and now
    server.state.faults.append(Fault("PATCH", "/pods/qwen-0", 422))  # not retried
    assert asyncio.run(_actuator(server, Loads(BUSY)).scale(_policy(), 2)).changed
    assert server.obj(path)["spec"]["replicas"] == 2
    assert _costs(server) == {"qwen-0": "12", "qwen-1": "0", "qwen-2": "3"}
