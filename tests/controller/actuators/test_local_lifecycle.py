"""The local actuator's replicas over their lifetime: one that exits on its own, one that never becomes ready,
scale-ups racing for the host budget, and a scale-down that lets the requests in flight finish."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from controller.actuators import LocalActuator
from controller.config import LocalActuatorConfig
from controller.errors import ActuationError
from harness.processes import free_port
from tests.controller.actuators.test_local import _REPLICA, _alive, _policy, _wait_ready
from tests.harness.children import still_running


def _sh(script: str, **settings: object) -> LocalActuator:
    config = LocalActuatorConfig(command=("/bin/sh", "-c", script), first_port=free_port(), stop_timeout_s=2,
                                 **settings)  # type: ignore[arg-type]  # fmt: skip
    return LocalActuator(config)


async def _until_exited(actuator: LocalActuator, name: str = "local-p") -> None:
    process = actuator.replicas_by_policy[name][0].process
    await asyncio.to_thread(process.wait, 10)


def test_a_replica_that_exits_on_its_own_is_logged_with_its_status_and_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash (a bad checkpoint, an out-of-memory kill) was dropped from the count without a word."""
    actuator = _sh("echo starting; exit 3", log_dir=str(tmp_path / "logs"))
    policy = _policy()

    async def scenario() -> None:
        await actuator.scale(policy, 1)
        endpoint = actuator.replicas_by_policy[policy.name][0].endpoint  # endpoints() may have dropped it already
        await _until_exited(actuator)
        assert (await actuator.replicas(policy)).desired == 0
        logged = [r for r in caplog.records if r.levelname == "ERROR" and endpoint in r.getMessage()]
        assert len(logged) == 1, caplog.text
        assert "exit status 3" in logged[0].getMessage()
        assert str(tmp_path / "logs" / f"local-p-{endpoint.rsplit(':', 1)[1]}.log") in logged[0].getMessage()
        await actuator.aclose()

    asyncio.run(scenario())


_DIES_LEAVING_A_CHILD = "(trap '' TERM; exec sleep 60) & echo $! > {pidfile}; exit 3"
"""The main process dies on its own; a process of its group (an EP rank) lives on."""


def test_a_dead_replicas_group_is_stopped_before_its_cpus_are_handed_out_again(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    cpu = min(os.sched_getaffinity(0))
    actuator = _sh(_DIES_LEAVING_A_CHILD.replace("{pidfile}", str(pidfile)), cpus_per_replica=1, cpus=(cpu,))
    policy = _policy()
    child = 0

    async def scenario() -> None:
        nonlocal child
        await actuator.scale(policy, 1)
        await _until_exited(actuator)
        child = int(pidfile.read_text())
        assert (await actuator.replicas(policy)).desired == 0
        deadline = time.monotonic() + 5
        while actuator.replica_budget(policy) != 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert still_running([child]) == [], "the dead replica's child still runs"
        assert actuator.replica_budget(policy) == 1  # its slice is free once nothing of it runs

    try:
        asyncio.run(scenario())
    finally:
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)
        asyncio.run(actuator.aclose())


_SERVES_OR_HANGS = f"""
import sys, time
if sys.argv[1] == sys.argv[3]:  # the replica on this port never becomes ready (a load that hangs)
    time.sleep(60)
{_REPLICA}"""


def test_a_scale_down_stops_a_replica_that_never_became_ready_before_a_serving_one() -> None:
    """The newest replica was stopped, though it served and an older one never answered: the scale-down took the
    fleet's only serving replica, and the one that never would was kept."""
    first = free_port()
    command = (sys.executable, "-c", _SERVES_OR_HANGS, "{port}", "200", str(first))
    actuator = LocalActuator(LocalActuatorConfig(command=command, first_port=first, stop_timeout_s=2))
    policy = _policy()

    async def scenario() -> None:
        await actuator.scale(policy, 1)
        await actuator.scale(policy, 2)
        hung, serving = actuator.replicas_by_policy[policy.name]
        assert hung.port == first
        assert await _wait_ready(actuator, policy, 1, timeout_s=20) == 1
        await actuator.scale(policy, 1)
        await actuator.stopped()
        kept = actuator.replicas_by_policy[policy.name]
        assert len(kept) == 1 and kept[0] is serving and hung.process.poll() is not None
        assert (await actuator.replicas(policy)).ready == 1

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(actuator.aclose())


def test_a_replica_never_ready_within_its_timeout_is_stopped_as_broken(caplog: pytest.LogCaptureFixture) -> None:
    """One that never answered (a hung start) was kept forever: counted, holding its CPUs, serving nobody."""
    actuator = _sh("exec sleep 60", ready_timeout_s=0.5)
    policy = _policy()

    async def scenario() -> None:
        await actuator.scale(policy, 1)
        hung = actuator.replicas_by_policy[policy.name][0]
        assert (await actuator.replicas(policy)).desired == 1  # within its timeout: counted, loading
        await asyncio.sleep(0.6)
        assert (await actuator.replicas(policy)).desired == 0  # given up on: the next decision replaces it
        await actuator.stopped()
        assert hung.process.poll() is not None
        assert "not ready 0.5 s after its start" in caplog.text

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(actuator.aclose())


def test_a_scale_up_past_the_host_budget_starts_what_fits_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Two policies scaling up in one tick each read the budget before either started: the second overran it, and
    its scale failed with one replica started, recorded as nothing done."""
    config = LocalActuatorConfig(command=("sleep", "60"), first_port=free_port(), cpus_per_replica=1,
                                 cpus=(min(os.sched_getaffinity(0)),))  # fmt: skip
    actuator = LocalActuator(config)
    policy = _policy()

    async def scenario() -> None:
        result = await actuator.scale(policy, 2)
        assert (result.previous, result.replicas, result.changed) == (0, 1, True)
        assert len(actuator.replicas_by_policy[policy.name]) == 1
        assert "host budget" in caplog.text and "1 replica(s) of 1 CPU(s)" in caplog.text
        with pytest.raises(ActuationError, match="host budget"):  # none could start: an error, as before
            await actuator.scale(policy, 2)

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(actuator.aclose())
