"""Local replicas started with other launch settings (a policy's checkpoint or model changed) are replaced: the
replicas already running served the old checkpoint until they were stopped for another reason."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from controller.actuators import LocalActuator
from controller.config import LocalActuatorConfig
from controller.policy import Policy
from harness.processes import free_port
from tests.controller.actuators.test_local import _REPLICA, _alive, _policy, _wait_ready

COMMAND = (sys.executable, "-c", _REPLICA, "{port}", "200", "{checkpoint}", "{model}")
"""A replica answering 200; its argv names the checkpoint and model it was started on."""


def _actuator(tmp_path: Path, **settings: object) -> tuple[LocalActuator, Policy, Policy]:
    for name in ("old", "new"):
        (tmp_path / name).mkdir()
    settings = {"command": COMMAND, **settings}
    config = LocalActuatorConfig(first_port=free_port(), stop_timeout_s=2, **settings)  # type: ignore[arg-type]
    return LocalActuator(config, cwd=tmp_path), _policy(checkpoint=Path("old")), _policy(checkpoint=Path("new"))


def _on(actuator: LocalActuator, policy: Policy, checkpoint: Path) -> list[bool]:
    return [str(checkpoint) in r.process.args for r in actuator.replicas_by_policy[policy.name]]  # type: ignore[operator]


async def _renew(actuator: LocalActuator, policy: Policy, checkpoint: Path) -> list[tuple[int, int | None]]:
    """The counts each look read until every replica runs ``checkpoint`` and is ready."""
    counts: list[tuple[int, int | None]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        count = await actuator.replicas(policy)
        counts.append((count.desired, count.ready))
        if all(_on(actuator, policy, checkpoint)) and count.ready == count.desired:
            return counts
        await asyncio.sleep(0.1)
    raise AssertionError(f"not renewed: {counts[-5:]}")


def test_replicas_on_an_old_checkpoint_are_replaced_each_after_its_successor_is_ready(tmp_path: Path) -> None:
    actuator, old, new = _actuator(tmp_path)

    async def scenario() -> None:
        await actuator.scale(old, 2)
        assert await _wait_ready(actuator, old, 2, timeout_s=20) == 2
        stale = [r.process.pid for r in actuator.replicas_by_policy[old.name]]
        counts = await _renew(actuator, new, tmp_path / "new")  # the policy now names another checkpoint
        assert set(counts) == {(2, 2)}  # one started ahead of each: never a replica fewer serving, nor one more counted
        await actuator.stopped()
        assert len(actuator.replicas_by_policy[new.name]) == 2 and not any(_alive(pid) for pid in stale)

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(actuator.aclose())


def test_without_room_for_one_more_a_replica_is_replaced_in_place(tmp_path: Path) -> None:
    actuator, old, new = _actuator(tmp_path, cpus_per_replica=1, cpus=(min(os.sched_getaffinity(0)),))

    async def scenario() -> None:
        await actuator.scale(old, 1)
        assert await _wait_ready(actuator, old, 1, timeout_s=20) == 1
        (stale,) = [r.process.pid for r in actuator.replicas_by_policy[old.name]]
        counts = await _renew(actuator, new, tmp_path / "new")
        assert {desired for desired, _ in counts} == {1} and not _alive(stale)

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(actuator.aclose())


def test_a_scale_down_stops_the_replicas_on_old_settings_first(tmp_path: Path) -> None:
    actuator, old, new = _actuator(tmp_path)

    async def scenario() -> None:
        await actuator.scale(old, 1)
        await actuator.scale(new, 2)  # the new one on the new checkpoint
        assert _on(actuator, new, tmp_path / "new") == [False, True]
        await actuator.scale(new, 1)  # the older replica goes: it runs the old checkpoint
        assert _on(actuator, new, tmp_path / "new") == [True]

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(actuator.aclose())


def test_a_scale_down_while_a_successor_loads_stops_the_successor_not_the_replicas_serving(tmp_path: Path) -> None:
    """The successor started ahead counted at once and the replicas on old settings went first: a scale-down from
    2 to 1 kept only the one still loading, and no replica served until it had loaded."""
    actuator, old, new = _actuator(tmp_path)

    async def scenario() -> None:
        await actuator.scale(old, 2)
        assert await _wait_ready(actuator, old, 2, timeout_s=20) == 2
        serving = {r.process.pid for r in actuator.replicas_by_policy[old.name]}
        await actuator.replicas(new)  # the policy now names another checkpoint: a successor starts ahead
        (successor,) = [r for r in actuator.replicas_by_policy[new.name] if r.replaces is not None]
        await actuator.scale(new, 1)
        await actuator.stopped()
        left = [r.process.pid for r in actuator.replicas_by_policy[new.name]]
        assert len(left) == 1 and set(left) <= serving and not _alive(successor.process.pid)

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(actuator.aclose())


SLOW_TO_DRAIN = (sys.executable, "-c", "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + _REPLICA,
                 "{port}", "200", "{checkpoint}", "{model}")  # fmt: skip
"""As :data:`COMMAND`, but its drain lasts until its group's SIGKILL (``stop_timeout_s`` after its SIGTERM)."""


def test_a_replica_draining_in_the_background_delays_a_renewal_rather_than_stop_the_one_serving(
    tmp_path: Path,
) -> None:
    """The draining replica held its slice, so the renewal found no room and stopped the only serving replica
    before its successor loaded."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("needs two CPUs for two slices")
    actuator, old, new = _actuator(tmp_path, cpus_per_replica=1, cpus=tuple(cpus), command=SLOW_TO_DRAIN)

    async def scenario() -> None:
        await actuator.scale(old, 2)
        assert await _wait_ready(actuator, old, 2, timeout_s=20) == 2
        await asyncio.sleep(0.5)  # their SIGTERM handlers are set
        await actuator.scale(old, 1)  # one drains in the background for stop_timeout_s
        (serving,) = actuator.replicas_by_policy[old.name]
        counts = await _renew(actuator, new, tmp_path / "new")
        assert all(ready == 1 for _, ready in counts), counts  # never a replica fewer serving
        await actuator.stopped()
        assert not _alive(serving.process.pid)

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(actuator.aclose())
