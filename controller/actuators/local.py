"""The local actuator: embedded-engine replicas as real processes on this machine.

Each replica is ``moeslo serve --checkpoint DIR --port P --model-name M``, so
its metrics carry the policy's ``model_name`` (the argv template
comes from the config, so tests and other engines can substitute their own),
bound to loopback on a free port.  Scaling compares the wanted count with the
processes still alive (crashed ones are reaped first, each logged as an error
with its exit status and log file, and what is left of its process group gets
SIGKILL: its CPU slice is free once nothing of it runs), starts the missing
ones, and stops the surplus ones, those not serving at the last look first,
then the newest.  A stop runs in the background (the tick loop goes on while a
replica drains; its CPU slice stays taken until nothing of it runs) and drains:
SIGTERM to the replica's main process alone
(``moeslo serve`` stops accepting, finishes the requests in flight, then stops
its engine core), SIGTERM to what is left of its process group once it exits
or ``stop_timeout_s`` after the first signal, SIGKILL to what is left of the
group at that same deadline (``GROUP_TERM_GRACE_S`` after its SIGTERM at the
least), though the main process be gone; one still not gone
``stop_timeout_s`` after that is logged and left to exit.
A replica counts as ready once its port answers HTTP; one that has not once
answered ``ready_timeout_s`` after its start (a hung start) is stopped as a
broken one is.
A replica whose ``/health`` answers 503 is broken (a dead EP rank, a failed
step: it never serves again) and is stopped like a surplus one, so the count
drops and the next decision starts a replacement: restarting is this
supervisor's job, not the engine's.  A replica started with other launch
settings than the policy's now (a PUT changed its checkpoint or model: the
argv differs) is replaced, one at a time, each tick a step: its successor
starts ahead of it and it stops once the successor is ready, so no fewer
serve meanwhile (with no CPU slice left for one more, it stops first and its
successor starts in its place); a scale-down stops a successor still loading
first (the replica it would replace serves on), then replicas on old settings.
Every replica is stopped when the
controller shuts down, and on Linux gets SIGTERM from the kernel when the
controller dies without a shutdown (``PR_SET_PDEATHSIG``: a kill -9 left
replicas serving, in sessions of their own, for nobody).

The host budget: with ``cpus_per_replica`` set, each replica is pinned to its own
slice of the host's CPUs (every process it starts inherits them), the argv's
``{threads}`` is that slice's size, and a replica for which no slice is left is
refused: the actuator reports its ``replica_budget`` to the decision core, which
then holds scale-ups at the budget with the reason ``host_budget`` instead of
oversubscribing the machine (two replicas on one core serve no faster than one).
A scale-up that finds the budget spent part way (two policies' scales in one
tick, each sized to the budget read before either) starts what fits, logs it,
and reports the count reached, which the decision log shows as applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from contracts.lifetime import child_setup, group_runs
from controller.actuators.background import BackgroundWork
from controller.actuators.base import ReplicaCount, ScaleResult, StillLeading, always_leading
from controller.config import GROUP_TERM_GRACE_S, LocalActuatorConfig
from controller.errors import ActuationError, LeadershipLostError
from controller.policy import LocalTarget, Policy

MAX_STOPS_AT_ONCE = 16
"""Replicas drained at once; more wait for a thread (each stop's waits bound it)."""
READY_PROBE_TIMEOUT_S = 0.5
GROUP_POLL_S = 0.05
"""How often a stop looks whether the replica's process group is gone."""
log = logging.getLogger(__name__)


@dataclass
class LocalReplica:
    process: subprocess.Popen[bytes]
    port: int
    host: str
    started_s: float
    log: IO[bytes] | None = None
    cpus: tuple[int, ...] = ()
    """The CPUs this replica is pinned to (empty: not pinned)."""
    argv: tuple[str, ...] = ()
    """What it was started with: its launch settings."""
    replaces: LocalReplica | None = None
    """The replica on old settings this one was started ahead of (not counted until it is ready and that one
    stops)."""
    state: str = "down"
    """The last probe's answer (``ready``, ``broken``, ``down``): a scale-down stops one that does not serve first."""
    served: bool = False
    """It answered ready once: until then, ``ready_timeout_s`` after its start it is given up on."""

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


def _cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def cpu_slices(config: LocalActuatorConfig) -> list[tuple[int, ...]] | None:
    """The host's CPUs cut into one slice per replica (None: replicas are not pinned)."""
    per = config.cpus_per_replica
    if per is None:
        return None
    available = sorted(config.cpus if config.cpus is not None else os.sched_getaffinity(0))
    return [tuple(available[i : i + per]) for i in range(0, len(available) - per + 1, per)]


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _group_ended(process: subprocess.Popen[bytes], deadline_s: float) -> bool:
    """Whether a replica's main process and every other process of its group ended by ``deadline_s``."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=max(0.0, deadline_s - time.monotonic()))
    while process.poll() is None or group_runs(process.pid):
        if time.monotonic() >= deadline_s:
            return False
        time.sleep(GROUP_POLL_S)
    return True


class LocalActuator:
    """Starts and stops embedded-engine processes; see the module docstring."""

    name = "local"

    def __init__(self, config: LocalActuatorConfig | None = None, *, cwd: str | Path | None = None) -> None:
        self.config = config or LocalActuatorConfig()
        self.cwd = Path(cwd).absolute() if cwd is not None else Path.cwd()
        self.replicas_by_policy: dict[str, list[LocalReplica]] = {}
        self._lock = asyncio.Lock()
        self.cpu_slices = cpu_slices(self.config)
        """Disjoint CPU sets, one per replica the host has room for (None: no budget)."""
        self._dying: list[LocalReplica] = []
        """Replicas being stopped in the background (:meth:`_retire`), and those whose main process exited on its own,
        their group SIGKILLed while a process of it (an EP rank) still ran: each holds its CPU slice until nothing of
        it runs."""
        self._stops = BackgroundWork(self._stop, max_at_once=MAX_STOPS_AT_ONCE, name="moeslo-replica-stop")
        self._probe_client: httpx.AsyncClient | None = None
        """One client for every health probe: a new one per probe loads the CA bundle each tick, which
        cost the demo's controller a quarter of its CPU."""

    def replica_budget(self, policy: Policy) -> int | None:
        """Most replicas ``policy`` may run: the CPU slices not held by other policies' replicas."""
        if self.cpu_slices is None or not self.manages(policy):
            return None
        others = sum(1 for name, rs in self.replicas_by_policy.items() if name != policy.name for r in rs if r.alive)
        return max(0, len(self.cpu_slices) - others - len(self._still_dying()))

    def _retire(self, replica: LocalReplica) -> None:
        """Stop ``replica`` in the background: it drains for up to ``stop_timeout_s`` while the ticks go on (awaited,
        a scale-down held the tick loop, every policy's, for the drain).  It has already left its policy's replicas,
        so it takes no new requests; its CPU slice stays taken until nothing of it runs."""
        self._dying.append(replica)
        self._stops.start(replica)

    async def stopped(self) -> None:
        """Return once the replicas being stopped in the background are (each within its stop's own deadlines)."""
        await self._stops.wait()

    def _still_dying(self) -> list[LocalReplica]:
        """The replicas stopping or stopped of which a process still runs (the rest are forgotten)."""
        self._dying = [r for r in self._dying if group_runs(r.process.pid)]
        return self._dying

    def _free_slice(self) -> tuple[int, ...]:
        if self.cpu_slices is None:
            return ()
        taken = {r.cpus for rs in self.replicas_by_policy.values() for r in rs if r.alive}
        taken |= {r.cpus for r in self._still_dying()}
        for cpus in self.cpu_slices:
            if cpus not in taken:
                return cpus
        per = self.config.cpus_per_replica
        raise ActuationError(
            f"host budget: every CPU slice is in use ({len(self.cpu_slices)} replicas of {per} CPU(s) on CPUs "
            f"{_cpu_list(c for s in self.cpu_slices for c in s)}); a replica more would oversubscribe the machine"
        )

    def check(self, policy: Policy) -> list[str]:
        target = policy.target
        if not isinstance(target, LocalTarget):
            if policy.mode == "enforce" and target.kind != "model":
                return [f"target.kind: {target.kind!r} cannot be scaled by the local actuator"]
            return []
        checkpoint = target.checkpoint or self.config.checkpoint
        if any("{checkpoint}" in part for part in self.config.command):
            if checkpoint is None:
                return ["target.checkpoint: required (the controller has no default checkpoint configured)"]
            folder = self._checkpoint_dir(checkpoint)
            if not folder.is_dir():
                read_as = "" if folder == Path(checkpoint) else f" (read as {folder}, from its working directory)"
                return [f"target.checkpoint: {checkpoint!r} is not a directory on the controller's machine{read_as}"]
        return []

    def _checkpoint_dir(self, checkpoint: str) -> Path:
        """``checkpoint`` as the replicas read it: a relative path from the controller's working directory,
        made absolute so the replica's command and log name the folder it reads."""
        return self.cwd / checkpoint

    def manages(self, policy: Policy) -> bool:
        return isinstance(policy.target, LocalTarget)

    def endpoints(self, policy: Policy) -> Sequence[str]:
        return tuple(r.endpoint for r in self.replicas_by_policy.get(policy.name, []) if r.alive)

    def _reap(self, policy: Policy) -> list[LocalReplica]:
        self._still_dying()
        replicas = self.replicas_by_policy.setdefault(policy.name, [])
        for replica in [r for r in replicas if not r.alive]:  # a stopped one left the list before its stop
            replicas.remove(replica)
            log_file = replica.log.name if replica.log is not None else "none (no log_dir)"
            log.error("replica %s of %r exited on its own (exit status %s); its log: %s", replica.endpoint,
                      policy.name, replica.process.returncode, log_file)  # fmt: skip
            if replica.log is not None:
                replica.log.close()
            if group_runs(replica.process.pid):  # left on its own, a process of it outlived the controller too
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(replica.process.pid, signal.SIGKILL)
                self._dying.append(replica)
        return replicas

    async def replicas(self, policy: Policy) -> ReplicaCount:
        replicas = self._reap(policy)
        states = await asyncio.gather(*(self._probe(r) for r in replicas))
        state_of = {id(r): state for r, state in zip(replicas, states, strict=True)}
        for replica, state in zip(replicas, states, strict=True):
            replica.state, replica.served = state, replica.served or state == "ready"
        broken = [r for r in replicas if state_of[id(r)] == "broken" or self._never_ready(r)]
        for replica in broken:  # the supervisor's part: a broken replica never serves again, so replace it
            why = ("/health answers 503" if state_of[id(replica)] == "broken" else
                   f"not ready {self.config.ready_timeout_s:g} s after its start")  # fmt: skip
            log.error("replica %s of %r is broken (%s); stopping it so a new one replaces it",
                      replica.endpoint, policy.name, why)
            replicas.remove(replica)
            self._retire(replica)
        if not broken:  # one step per read at most
            async with self._lock:
                await self._renew(policy, state_of)
        counted = [r for r in self._reap(policy) if r.replaces is None]
        return ReplicaCount(desired=len(counted), ready=sum(state_of.get(id(r)) == "ready" for r in counted))

    def _never_ready(self, replica: LocalReplica) -> bool:
        """Started ``ready_timeout_s`` ago and not once ready: it held a slice and a count that serve nobody."""
        return not replica.served and time.monotonic() - replica.started_s > self.config.ready_timeout_s

    def _stale(self, policy: Policy, replica: LocalReplica) -> bool:
        """Whether ``replica`` was started with other settings than ``policy``'s now (a checkpoint, a model)."""
        return isinstance(policy.target, LocalTarget) and replica.argv != tuple(self._argv(policy, replica.port))

    async def _renew(self, policy: Policy, state_of: dict[int, str]) -> None:
        """One step of replacing the replicas on old settings (see the module docstring).  As a broken replica's
        stop, a supervisor's step on what this actuator started, not a scale: the count stays."""
        replicas = self._reap(policy)
        ahead = next((r for r in replicas if r.replaces is not None), None)
        if ahead is not None:
            old = ahead.replaces
            if old is None or state_of.get(id(ahead)) != "ready":
                return  # still loading: the old one serves on (a successor that died was reaped: none is ahead)
            ahead.replaces = None
            if any(r is old for r in replicas):  # not gone meanwhile (crashed, broken)
                replicas.remove(old)
                self._retire(old)
            return
        stale = [r for r in replicas if self._stale(policy, r)]
        if not stale or any(state_of.get(id(r)) != "ready" for r in replicas if r not in stale):
            return  # a step at a time: none while a successor still loads
        old = min(stale, key=lambda r: state_of.get(id(r)) == "ready")  # one that does not serve first
        room = self._room()
        if not room and self._still_dying():
            return  # a replica stopping holds the slice: once it is gone, the successor starts ahead as it should
        if not room:  # its successor needs its CPU slice: stopped before the start
            replicas.remove(old)
            await asyncio.to_thread(self._stop, old)
        try:
            successor = self._start(policy, replicas)
        except ActuationError as exc:
            log.warning("replacing replica %s of %r (started with other settings) failed: %s", old.endpoint,
                        policy.name, exc)  # fmt: skip
            return
        log.info("replica %s of %r was started with other settings: %s replaces it", old.endpoint, policy.name,
                 successor.endpoint)  # fmt: skip
        successor.replaces = old if room else None
        replicas.append(successor)

    def _room(self) -> bool:
        """Whether the host budget has a CPU slice left for one more replica."""
        try:
            self._free_slice()
        except ActuationError:
            return False
        return True

    async def _probe(self, replica: LocalReplica) -> str:
        """``ready`` (answers HTTP), ``broken`` (``/health`` answers 503) or ``down`` (no answer yet)."""
        if self._probe_client is None:
            self._probe_client = httpx.AsyncClient(timeout=READY_PROBE_TIMEOUT_S)
        try:
            response = await self._probe_client.get(f"{replica.endpoint}/health")
        except httpx.HTTPError:
            return "down"
        if response.status_code == 503:
            return "broken"
        return "ready" if response.status_code < 500 else "down"

    async def scale(  # expected: not checked, no other writer starts or stops this actuator's replicas
        self, policy: Policy, replicas: int, *, still_leading: StillLeading = always_leading,
        expected: int | None = None,
    ) -> ScaleResult:
        if replicas < 0:
            raise ActuationError(f"cannot run {replicas} replicas of {policy.name!r}")
        async with self._lock:
            running = self._reap(policy)
            previous = sum(r.replaces is None for r in running)
            if previous != replicas and not still_leading():  # asked after the lock's wait, before any change
                raise LeadershipLostError(f"{policy.name}: the lease was lost before the scale to {replicas}")
            ahead = [r for r in running if r.replaces is not None]
            if replicas <= previous:  # successors still loading go first: the replicas they would replace serve
                running[:] = [r for r in running if r.replaces is None]
            for replica in ahead:  # a scale-up counts them now
                replica.replaces = None
            # The surplus, stopped from the end: replicas on old settings first, then ones not serving (one that
            # never became ready was kept forever, and a serving one stopped instead), then the newest.
            running.sort(key=lambda r: (self._stale(policy, r), r.state != "ready", r.started_s))
            self._start_up_to(policy, running, replicas)
            surplus = [*running[replicas:], *(r for r in ahead if r not in running)]
            del running[replicas:]
            for replica in reversed(surplus):
                self._retire(replica)
            return ScaleResult(previous=previous, replicas=len(running), changed=previous != len(running))

    def _start_up_to(self, policy: Policy, running: list[LocalReplica], replicas: int) -> None:
        """Start replicas until ``replicas`` run or the host budget is spent.  Spent after some started (another
        policy's scale in the same tick took the slices its budget counted on): what started is the result, not a
        failure that recorded nothing done; none could start: the budget's ActuationError."""
        started = 0
        while len(running) < replicas:
            if started and not self._room():
                assert self.cpu_slices is not None  # no room: there is a budget
                log.warning("scaling %r to %d stopped at %d: the host budget (%d replica(s) of %d CPU(s)) is spent",
                            policy.name, replicas, len(running), len(self.cpu_slices),
                            self.config.cpus_per_replica)  # fmt: skip
                return
            running.append(self._start(policy, running))
            started += 1

    def _argv(self, policy: Policy, port: int) -> list[str]:
        target = policy.target
        assert isinstance(target, LocalTarget)
        checkpoint = target.checkpoint or self.config.checkpoint
        threads = self.config.cpus_per_replica or 1
        values = {
            "threads": str(threads),
            "checkpoint": "" if checkpoint is None else str(self._checkpoint_dir(checkpoint)),
            "port": str(port),
            "model": target.model,
            "host": self.config.host,
            "moeslo": str(Path(sys.executable).parent / "moeslo"),
        }
        return [part.format(**values) for part in self.config.command]

    def _next_port(self) -> int:
        taken = {r.port for rs in self.replicas_by_policy.values() for r in rs}
        port = self.config.first_port
        while port <= 65535:
            if port not in taken and _port_free(self.config.host, port):
                return port
            port += 1
        raise ActuationError(f"no free port at or above {self.config.first_port}")

    def _start(self, policy: Policy, running: list[LocalReplica]) -> LocalReplica:
        if not isinstance(policy.target, LocalTarget):
            raise ActuationError(f"policy {policy.name!r} has a {policy.target.kind!r} target, not a local one")
        problems = self.check(policy)
        if problems:
            raise ActuationError(f"policy {policy.name!r}: {'; '.join(problems)}")
        cpus = self._free_slice()
        port = self._next_port()
        argv = self._argv(policy, port)
        log: IO[bytes] | None = None
        if self.config.log_dir is not None:
            log_dir = Path(self.config.log_dir)
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
                log = (log_dir / f"{policy.name}-{port}.log").open("ab")
            except OSError as exc:  # an actuation error of this policy, not a failure of the whole tick
                raise ActuationError(f"cannot write the replica's log in {log_dir}: {exc.strerror}") from exc
        try:
            process = subprocess.Popen(
                argv,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log if log is not None else subprocess.DEVNULL,
                stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopping it stops its children too
                # Pinned before exec, so every process the replica starts (EP ranks) inherits its CPUs; SIGTERM
                # when the controller dies (started on its event-loop thread, the main one, which lasts as long).
                preexec_fn=child_setup(cpus),  # noqa: PLW1509
            )
        except (OSError, subprocess.SubprocessError) as exc:  # SubprocessError: the CPU pinning failed
            if log is not None:
                log.close()
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            raise ActuationError(f"cannot start {argv[0]!r} for {policy.name!r}: {why}") from exc
        return LocalReplica(process=process, port=port, host=self.config.host, started_s=time.monotonic(), log=log,
                            cpus=cpus, argv=tuple(argv))  # fmt: skip

    def _stop(self, replica: LocalReplica) -> None:
        """SIGTERM to the replica's main process, a wait for it, SIGTERM to what is left of its group, a wait for all of
        it (the rest of the first, :data:`GROUP_TERM_GRACE_S` at least), SIGKILL to what is left, a wait: never raises.

        The main process first, alone: ``moeslo serve`` then drains (uvicorn's graceful shutdown stops accepting,
        lets the requests in flight finish, then the lifespan stops the engine core and its EP ranks), where a
        SIGTERM to the whole group ended the engine core at once and failed every request the replica was
        serving.  The group after: a child (an EP rank slow to tear down, or deaf to SIGTERM) can outlive the main
        process, and would hold the CPUs the next replica is given.  A replica whose teardown outlasts even the
        last wait (a GPU context, gigabytes of weights to unmap, a hung device) is dying all the same: it is
        logged and left to exit, where a TimeoutExpired out of here ended the whole tick (or the shutdown of the
        other replicas)."""
        process = replica.process
        deadline_s = time.monotonic() + self.config.stop_timeout_s
        with contextlib.suppress(ProcessLookupError, PermissionError):
            process.send_signal(signal.SIGTERM)  # drains: in-flight requests finish within the server's grace
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline_s - time.monotonic()))
        # What is left of the group gets its SIGTERM's grace even when the main process used all of the first wait.
        deadline_s = max(deadline_s, time.monotonic() + GROUP_TERM_GRACE_S)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
            if _group_ended(process, deadline_s):
                break
            deadline_s = time.monotonic() + self.config.stop_timeout_s
        else:
            log.warning("replica %s (pid %d, or a process of its group) is not gone %.3g s after SIGKILL; left to exit",
                        replica.endpoint, process.pid, self.config.stop_timeout_s)  # fmt: skip
        if replica.log is not None:
            replica.log.close()

    async def release(self, policy_name: str) -> None:
        """The policy was deleted, or its target is no longer a local one: its replicas stop (they would hold their
        CPUs and ports for nobody)."""
        async with self._lock:
            gone = self.replicas_by_policy.pop(policy_name, [])
            if gone:
                log.info("policy %r is no longer run here: stopping its %d replica(s)", policy_name, len(gone))
            for replica in gone:
                self._retire(replica)

    async def aclose(self) -> None:
        """Stop every replica this actuator started, and wait for those being stopped in the background."""
        async with self._lock:
            stopping = set(map(id, self._stops.running()))
            everything = [*(r for rs in self.replicas_by_policy.values() for r in rs),
                          *(r for r in self._still_dying() if id(r) not in stopping)]  # fmt: skip
            self.replicas_by_policy.clear()
            self._dying.clear()
            await asyncio.gather(*(asyncio.to_thread(self._stop, r) for r in everything))
            await self.stopped()
            self._stops.shutdown()
        if self._probe_client is not None:
            await self._probe_client.aclose()
            self._probe_client = None
