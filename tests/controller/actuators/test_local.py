"""The local actuator really starts and stops embedded-engine processes (``moeslo serve``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from controller.actuators import LocalActuator
from controller.actuators.base import ScaleResult
from controller.actuators.local import LocalReplica
from controller.config import LocalActuatorConfig
from controller.errors import ActuationError, LeadershipLostError
from controller.policy import Policy
from harness.processes import free_port
from tests.harness.children import still_running


def _policy(name: str = "local-p", checkpoint: Path | None = None) -> Policy:
    target = {"kind": "local", "model": "tiny-moe"}
    if checkpoint is not None:
        target["checkpoint"] = str(checkpoint)
    return Policy.model_validate({"name": name, "target": target})


async def _wait_ready(actuator: LocalActuator, policy: Policy, want: int, timeout_s: float = 150.0) -> int:
    deadline = time.monotonic() + timeout_s
    ready = 0
    while time.monotonic() < deadline:
        ready = (await actuator.replicas(policy)).ready or 0
        if ready >= want:
            return ready
        await asyncio.sleep(0.5)
    return ready


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_closing(actuator: LocalActuator, scenario: Callable[[], Awaitable[None]]) -> None:
    """Run ``scenario``, then stop every replica: never leave engine processes behind, even when an assertion fails."""

    async def run() -> None:
        try:
            await scenario()
        finally:
            await actuator.aclose()

    asyncio.run(run())


@pytest.mark.integration
@pytest.mark.slow
def test_scale_up_down_and_shutdown_with_real_engine_processes(tiny_checkpoint: Path) -> None:
    config = LocalActuatorConfig(first_port=free_port(), stop_timeout_s=10)
    actuator = LocalActuator(config)
    policy = _policy(checkpoint=tiny_checkpoint)
    assert actuator.check(policy) == []

    async def scenario() -> None:
        result = await actuator.scale(policy, 2)
        assert (result.previous, result.replicas, result.changed) == (0, 2, True)
        assert await _wait_ready(actuator, policy, 2) == 2
        endpoints = actuator.endpoints(policy)
        assert len(endpoints) == 2
        async with httpx.AsyncClient(timeout=10) as client:
            for endpoint in endpoints:
                page = (await client.get(endpoint + "/metrics")).text
                port = endpoint.rsplit(":", 1)[1]
                assert 'model_name="tiny-moe"' in page and f'engine="{port}"' in page
        pids = [r.process.pid for r in actuator.replicas_by_policy[policy.name]]
        again = await actuator.scale(policy, 2)  # idempotent: nothing started twice
        assert not again.changed
        assert [r.process.pid for r in actuator.replicas_by_policy[policy.name]] == pids
        down = await actuator.scale(policy, 1)
        assert (down.previous, down.replicas) == (2, 1)
        assert len(actuator.endpoints(policy)) == 1  # the stopped replica takes no new requests at once
        await actuator.stopped()  # its drain ran in the background
        assert _alive(pids[0]) and not _alive(pids[1])  # the newest replica was stopped
        assert (await actuator.replicas(policy)).desired == 1
        # A crashed replica is reaped: the count reads 0, so the next decision starts a new one.
        os.killpg(pids[0], signal.SIGKILL)
        actuator.replicas_by_policy[policy.name][0].process.wait(timeout=10)
        assert (await actuator.replicas(policy)).desired == 0
        assert actuator.endpoints(policy) == ()
        await actuator.scale(policy, 1)
        last = actuator.replicas_by_policy[policy.name][0].process.pid
        await actuator.aclose()  # shutdown stops every replica, also one still starting
        assert not _alive(last)

    _run_closing(actuator, scenario)


async def _stream_through_scale_down(actuator: LocalActuator, policy: Policy, max_tokens: int
                                     ) -> tuple[list[dict], bool]:  # fmt: skip
    """Stream one completion from the policy's only replica, scaling the policy to 0 once its first chunk came; the
    chunks, and whether the scale call had returned before the last one (the replica drained in the background)."""
    endpoint = actuator.endpoints(policy)[0]
    body = {"model": "tiny-moe", "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    chunks: list[dict] = []
    down: asyncio.Task[object] | None = None
    async with httpx.AsyncClient(timeout=60) as client, client.stream(
        "POST", endpoint + "/v1/completions", json=body
    ) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks.append(json.loads(line[len("data: "):]))
            if down is None:  # in flight: the replica is stopped under it
                down = asyncio.create_task(actuator.scale(policy, 0))
    assert down is not None
    returned_first = down.done()
    await down
    return chunks, returned_first


@pytest.mark.integration
@pytest.mark.slow
def test_a_scale_down_lets_the_requests_in_flight_finish(tiny_checkpoint: Path) -> None:
    """The stopped replica drains: its stream goes on to the end; SIGTERM to its whole group ended the engine
    core at once, and the stream with an error."""
    actuator = LocalActuator(LocalActuatorConfig(first_port=free_port(), stop_timeout_s=30))
    policy = _policy(checkpoint=tiny_checkpoint)
    max_tokens = 400

    async def scenario() -> None:
        await actuator.scale(policy, 1)
        assert await _wait_ready(actuator, policy, 1) == 1
        pid = actuator.replicas_by_policy[policy.name][0].process.pid
        started = time.monotonic()
        chunks, returned_first = await _stream_through_scale_down(actuator, policy, max_tokens)
        assert returned_first  # the drain held no tick
        await actuator.stopped()
        assert not _alive(pid) and actuator.endpoints(policy) == ()
        assert [c for c in chunks if "error" in c] == []
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == max_tokens
        print(f"streamed {len(chunks)} chunks in {time.monotonic() - started:.2f} s")

    _run_closing(actuator, scenario)


def test_checkpoint_is_required_and_must_exist(tmp_path) -> None:
    actuator = LocalActuator(LocalActuatorConfig(checkpoint=None), cwd=tmp_path)
    assert actuator.check(_policy()) == [
        "target.checkpoint: required (the controller has no default checkpoint configured)"
    ]
    missing = Policy.model_validate({"name": "x", "target": {"kind": "local", "checkpoint": "nope"}})
    assert actuator.check(missing) == [f"target.checkpoint: 'nope' is not a directory on the controller's machine "
                                       f"(read as {tmp_path / 'nope'}, from its working directory)"]
    (tmp_path / "ckpt").mkdir()
    ok = Policy.model_validate({"name": "x", "target": {"kind": "local", "checkpoint": "ckpt"}})
    assert actuator.check(ok) == []
    k8s = Policy.model_validate({"name": "k", "target": {"kind": "deployment", "namespace": "a", "name": "b"}})
    assert actuator.check(k8s) == ["target.kind: 'deployment' cannot be scaled by the local actuator"]


def test_a_relative_checkpoint_is_the_controllers_and_replicas_are_started_on_its_absolute_path(
    tmp_path: Path,
) -> None:
    """A relative checkpoint (a policy's or the config's) is read from the controller's working directory, and the
    replica's command names the absolute folder: its command and log said ``ckpt`` with no hint of which one,
    and a refusal did not say where the controller had looked."""
    (tmp_path / "ckpt").mkdir()
    actuator = LocalActuator(LocalActuatorConfig(checkpoint="ckpt"), cwd=tmp_path)
    argv = actuator._argv(_policy(), 18100)
    assert argv[argv.index("--checkpoint") + 1] == str(tmp_path / "ckpt")
    absolute = tmp_path / "elsewhere"
    absolute.mkdir()
    argv = actuator._argv(_policy(checkpoint=absolute), 18100)
    assert argv[argv.index("--checkpoint") + 1] == str(absolute)
    gone = Policy.model_validate({"name": "x", "target": {"kind": "local", "checkpoint": str(tmp_path / "gone")}})
    assert actuator.check(gone) == [f"target.checkpoint: {str(tmp_path / 'gone')!r} is not a directory on the "
                                    "controller's machine"]  # an absolute path needs no word on where it was read


def test_the_host_budget_pins_replicas_and_refuses_one_too_many() -> None:
    """One replica per CPU, each pinned to its own; one more is refused, and the budget says so."""
    cpus = sorted(os.sched_getaffinity(0))
    config = LocalActuatorConfig(command=("sleep", "60"), first_port=free_port(), cpus_per_replica=1)
    actuator = LocalActuator(config)
    assert actuator.cpu_slices == [(cpu,) for cpu in cpus]
    first, other = _policy("first"), _policy("other")
    assert actuator.replica_budget(first) == len(cpus)

    async def scenario() -> None:
        await actuator.scale(first, len(cpus))
        pinned = [os.sched_getaffinity(r.process.pid) for r in actuator.replicas_by_policy["first"]]
        assert pinned == [{cpu} for cpu in cpus]  # pinned before exec, each to its own CPU
        assert actuator.replica_budget(first) == len(cpus)  # its own replicas are room it holds
        assert actuator.replica_budget(other) == 0
        with pytest.raises(ActuationError, match="host budget: every CPU slice is in use"):
            await actuator.scale(other, 1)
        await actuator.aclose()

    asyncio.run(scenario())
    assert LocalActuator(LocalActuatorConfig()).replica_budget(first) is None  # no cpus_per_replica: no budget


_REPLICA = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(int(sys.argv[2]) if self.path == "/health" else 200)
        self.end_headers()

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_a_broken_replica_is_stopped_so_the_next_decision_replaces_it(tmp_path: Path) -> None:
    """The supervisor's part: /health 503 (a dead EP rank, a failed step) means stop it; 200 means keep it."""
    (tmp_path / "ckpt").mkdir()

    def actuator_for(health: int) -> LocalActuator:
        command = (sys.executable, "-c", _REPLICA, "{port}", str(health))
        return LocalActuator(LocalActuatorConfig(command=command, first_port=free_port(), checkpoint="ckpt"),
                             cwd=tmp_path)

    healthy, broken = actuator_for(200), actuator_for(503)
    policy = _policy()

    async def scenario() -> None:
        for actuator in (healthy, broken):
            await actuator.scale(policy, 1)
        assert await _wait_ready(healthy, policy, 1, timeout_s=20) == 1
        pid = broken.replicas_by_policy[policy.name][0].process.pid
        deadline = time.monotonic() + 20
        while broken.replicas_by_policy[policy.name] and time.monotonic() < deadline:
            count = await broken.replicas(policy)
            await asyncio.sleep(0.1)
        assert count.desired == 0 and count.ready == 0
        await broken.stopped()
        assert not _alive(pid)
        assert (await healthy.replicas(policy)).desired == 1

    async def run() -> None:
        try:
            await scenario()
        finally:
            await healthy.aclose()
            await broken.aclose()

    asyncio.run(run())


def test_a_replica_that_cannot_start_is_an_actuation_error(tmp_path: Path) -> None:
    """An unwritable log folder or a program that is not there fail that policy's scale-up with an ActuationError
    (logged with its decision), not an OSError that ended the whole tick for every policy.  (A CPU the host lacks
    is refused with the settings: tests/controller/test_config.py.)"""
    unwritable = tmp_path / "file"
    unwritable.write_text("")
    config = LocalActuatorConfig(command=("sleep", "60"), first_port=free_port(), log_dir=str(unwritable / "logs"))
    with pytest.raises(ActuationError, match="cannot write the replica's log"):
        asyncio.run(LocalActuator(config).scale(_policy(), 1))
    config = LocalActuatorConfig(command=(str(tmp_path / "no-such-engine"), "60"), first_port=free_port(),
                                 cpus_per_replica=1)  # fmt: skip
    actuator = LocalActuator(config)
    with pytest.raises(ActuationError, match=r"cannot start '.*no-such-engine'"):
        asyncio.run(actuator.scale(_policy(), 1))
    asyncio.run(actuator.aclose())


_IGNORES_SIGTERM = (
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint(flush=True)\ntime.sleep(60)"
)


class SlowToDie(subprocess.Popen[bytes]):
    """A real process whose teardown after SIGKILL outlasts the stop timeout (a GPU context, gigabytes of weights
    to unmap): its third wait, the one after the kill (the first two follow the SIGTERMs to its main process and
    to its group), times out as such a replica's would."""

    waits = 0

    def wait(self, timeout: float | None = None) -> int:
        self.waits += 1
        if self.waits == 3:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return super().wait(timeout)

    def poll(self) -> int | None:
        # Still tearing down after the timed-out wait: the kernel may have reaped the killed process already, and
        # the actuator's look after the wait then found it gone (the test failed now and then).
        return None if self.waits == 3 else super().poll()


def test_a_replica_still_not_gone_after_sigkill_is_logged_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM, waits, SIGKILL, wait: the last wait's TimeoutExpired escaped scale() (no ActuationError), which
    ended the whole tick for every policy, and aclose(), which left the other replicas' logs open."""
    process = SlowToDie([sys.executable, "-c", _IGNORES_SIGTERM], stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None and process.stdout.readline() == b"\n"  # SIGTERM is ignored from here on
    actuator = LocalActuator(LocalActuatorConfig(command=("sleep", "60"), first_port=free_port(), stop_timeout_s=0.2))
    actuator.replicas_by_policy["local-p"] = [LocalReplica(process=process, port=1, host="127.0.0.1", started_s=0.0)]
    async def scale_to_zero() -> ScaleResult:
        result = await actuator.scale(_policy(), 0)
        await actuator.stopped()
        return result

    try:
        result = asyncio.run(scale_to_zero())
        killed = process.wait(timeout=10)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        process.stdout.close()
    assert (result.previous, result.replicas) == (1, 0) and actuator.endpoints(_policy()) == ()
    assert "replica http://127.0.0.1:1 (pid" in caplog.text and "after SIGKILL; left to exit" in caplog.text
    assert killed == -signal.SIGKILL  # the kill was sent: it exits



_DIES_WITHOUT_SHUTDOWN = """
import asyncio, sys, time
from controller.actuators import LocalActuator
from controller.config import LocalActuatorConfig
from controller.policy import Policy
actuator = LocalActuator(LocalActuatorConfig(command=(sys.executable, "-c", "import time; time.sleep(60)"),
                                             first_port=int(sys.argv[1])))
policy = Policy.model_validate({"name": "local-p", "target": {"kind": "local", "model": "tiny-moe"}})
asyncio.run(actuator.scale(policy, 1))
print(actuator.replicas_by_policy["local-p"][0].process.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_replica_does_not_outlive_a_controller_killed_without_a_shutdown() -> None:
    """Replicas run in sessions of their own: a controller killed with SIGKILL left them serving for nobody."""
    controller = subprocess.Popen([sys.executable, "-c", _DIES_WITHOUT_SHUTDOWN, str(free_port())],
                                  stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3])
    assert controller.stdout is not None
    replica = int(controller.stdout.readline())
    controller.kill()
    controller.wait(10)
    controller.stdout.close()
    left = still_running([replica])
    if left:
        os.killpg(replica, signal.SIGKILL)
    assert left == [], "the replica outlived its controller"


def test_a_lease_lost_before_the_scale_starts_no_replica() -> None:
    config = LocalActuatorConfig(command=("sleep", "60"), first_port=free_port(), cpus_per_replica=1)
    actuator = LocalActuator(config)
    with pytest.raises(LeadershipLostError, match="the lease was lost before the scale to 1"):
        asyncio.run(actuator.scale(_policy("first"), 1, still_leading=lambda: False))
    assert actuator.replicas_by_policy.get("first", []) == []
    assert asyncio.run(actuator.scale(_policy("first"), 0, still_leading=lambda: False)).changed is False


_LEAVES_A_CHILD = (  # the main process exits on SIGTERM; a child of its group ignores it (an EP rank slow to go)
    "(trap '' TERM; exec sleep 60) & echo $! > {pidfile}; trap 'exit 0' TERM; while :; do sleep 0.05; done"
)


def test_a_child_that_outlives_the_replicas_main_process_gets_the_sigkill(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    command = ("/bin/sh", "-c", _LEAVES_A_CHILD.replace("{pidfile}", str(pidfile)))
    actuator = LocalActuator(LocalActuatorConfig(command=command, first_port=free_port(), stop_timeout_s=0.5))
    child = 0
    try:
        asyncio.run(actuator.scale(_policy(), 1))
        deadline = time.monotonic() + 10
        while not pidfile.exists() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline, "the replica never started its child"
            time.sleep(0.05)
        child = int(pidfile.read_text())
        started = time.monotonic()
        asyncio.run(actuator.scale(_policy(), 0))
        assert time.monotonic() - started < 5
        assert still_running([child]) == [], "the replica's child outlived its stop"
    finally:
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
        asyncio.run(actuator.aclose())


def test_the_group_gets_its_sigterms_grace_when_the_main_process_drains_past_the_stop_timeout(tmp_path: Path) -> None:
    """The main process used all of ``stop_timeout_s``: the group's SIGTERM and SIGKILL came at once, and a child
    that stops itself on SIGTERM in half a second (an EP rank, an engine core) was killed instead."""
    marker = tmp_path / "graceful"
    child = (f"import signal, time\ndef stop(*_):\n    time.sleep(0.5); open({str(marker)!r}, 'w').close(); "
             "raise SystemExit(0)\nsignal.signal(signal.SIGTERM, stop)\ntime.sleep(60)")  # fmt: skip
    main = ("import signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"subprocess.Popen([sys.executable, '-c', {child!r}])\nprint(flush=True)\ntime.sleep(60)")  # fmt: skip
    process = subprocess.Popen([sys.executable, "-c", main], stdout=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None and process.stdout.readline() == b"\n"
    time.sleep(0.5)  # the child has set its handler
    actuator = LocalActuator(LocalActuatorConfig(command=("sleep", "60"), first_port=free_port(), stop_timeout_s=1))
    replica = LocalReplica(process=process, port=1, host="127.0.0.1", started_s=0.0)
    try:
        actuator._stop(replica)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.stdout.close()
    assert marker.exists(), "the child was killed before its SIGTERM's grace"


def test_a_scale_down_returns_while_its_replica_drains_and_the_replicas_cpus_stay_taken_until_it_is_gone() -> None:
    """Awaited, a replica's drain held the tick loop, every policy's ticks, for up to ``stop_timeout_s``."""
    command = (sys.executable, "-c", _IGNORES_SIGTERM)  # drains (ignores SIGTERM) until its group's SIGKILL
    config = LocalActuatorConfig(command=command, first_port=free_port(), cpus_per_replica=1, stop_timeout_s=1.5)
    actuator = LocalActuator(config)
    policy = _policy()

    async def scenario() -> None:
        await actuator.scale(policy, 1)
        (replica,) = actuator.replicas_by_policy[policy.name]
        await asyncio.sleep(1.0)  # its SIGTERM handler is set
        budget = actuator.replica_budget(policy)
        assert budget is not None
        started = time.monotonic()
        result = await actuator.scale(policy, 0)
        assert (result.replicas, actuator.endpoints(policy)) == (0, ())
        assert time.monotonic() - started < 0.5  # returned at once
        await asyncio.sleep(0.3)  # its SIGTERM sent (the stop's thread ran), it drains on
        assert replica.process.poll() is None
        assert actuator.replica_budget(policy) == budget - 1  # its CPU is not free yet
        await actuator.stopped()
        assert time.monotonic() - started >= 1.5 and replica.process.poll() is not None
        assert actuator.replica_budget(policy) == budget

    _run_closing(actuator, scenario)
