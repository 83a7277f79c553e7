"""Leader election over a Lease, against the stand-in API server on loopback."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from controller.actuators import api_client
from controller.config import KubernetesConfig, LeaderElectionConfig
from controller.leader import AlwaysLeader, LeaseElector
from tests.controller.kube_standin import Fault, StandInApiServer


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture()
def server() -> Iterator[StandInApiServer]:
    with StandInApiServer() as srv:
        yield srv


CONFIG = LeaderElectionConfig(enabled=True, namespace="moeslo", lease_name="ctl", lease_duration_s=15, renew_period_s=5)


def _elector(server: StandInApiServer, identity: str, clock: FakeClock) -> LeaseElector:
    return LeaseElector(api_client(KubernetesConfig(host=server.url)), CONFIG, identity=identity, clock=clock)


def test_exactly_one_leads_and_a_standby_takes_over_when_the_lease_lapses(server: StandInApiServer) -> None:
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = _elector(server, "a", clock_a), _elector(server, "b", clock_b)
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    lease = server.obj(server.lease_path("moeslo", "ctl"))
    assert lease["spec"]["holderIdentity"] == "a"
    # a keeps renewing: b never takes over, however long it waits.
    for _ in range(5):
        clock_a.now_s += 5
        clock_b.now_s += 5
        assert a.try_acquire_or_renew() is True
        assert b.try_acquire_or_renew() is False
    # a stops renewing (crashed); b sees the record unchanged for lease_duration_s and takes over.
    clock_a.now_s += 10
    assert a.is_leader is False  # a steps down before b may take over
    clock_b.now_s += 10
    assert b.try_acquire_or_renew() is False  # only 10 s of an unchanged record
    clock_b.now_s += 5
    assert b.try_acquire_or_renew() is True
    lease = server.obj(server.lease_path("moeslo", "ctl"))
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    assert a.try_acquire_or_renew() is False


def test_release_on_shutdown_hands_over_at_once(server: StandInApiServer) -> None:
    clock = FakeClock()
    a, b = _elector(server, "a", clock), _elector(server, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.release()
    assert not a.is_leader
    assert b.try_acquire_or_renew()


def test_api_errors_while_renewing_step_down_only_after_the_deadline(server: StandInApiServer) -> None:
    clock = FakeClock()
    a = _elector(server, "a", clock)
    assert a.try_acquire_or_renew()
    server.state.faults.extend(Fault("GET", "/leases/ctl", 503) for _ in range(3))
    clock.now_s += 5
    assert a.try_acquire_or_renew() is True  # still inside lease_duration - renew_period
    clock.now_s += 6
    assert a.try_acquire_or_renew() is False  # 11 s without a renewal: step down
    clock.now_s += 1
    assert a.try_acquire_or_renew() is False  # third injected fault
    assert a.try_acquire_or_renew() is True  # the API server answers again: a renews its own lease


def test_lease_times_at_an_exact_second_keep_six_fractional_digits(server: StandInApiServer) -> None:
    """The API server parses acquireTime and renewTime as RFC 3339 micro time; without the fraction: a 400."""
    exact = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
    a = LeaseElector(api_client(KubernetesConfig(host=server.url)), CONFIG, identity="a", clock=FakeClock(),
                     wall_clock=lambda: exact)
    assert a.try_acquire_or_renew() and a.try_acquire_or_renew()  # creates, then renews
    a.release()
    writes = server.writes_to(server.lease_path("moeslo", "ctl"))
    assert len(writes) == 3
    assert {(w["spec"]["acquireTime"], w["spec"]["renewTime"]) for w in writes} == {
        ("2026-03-01T12:00:00.000000Z", "2026-03-01T12:00:00.000000Z")
    }


@pytest.mark.parametrize(("stored", "sent"), [
    ("2026-03-01T12:00:00.000000Z", "2026-03-01T12:00:00.000000Z"),  # an exact second, as the API server writes it
    ("2026-03-01T14:00:00.5+02:00", "2026-03-01T12:00:00.500000Z"),
])
def test_a_renewal_writes_the_acquire_time_it_read_back_as_micro_time(
    server: StandInApiServer, stored: str, sent: str
) -> None:
    a = _elector(server, "a", FakeClock())
    assert a.try_acquire_or_renew()
    path = server.lease_path("moeslo", "ctl")
    with server.state.lock:
        server.state.objects[path]["spec"]["acquireTime"] = stored
    assert a.try_acquire_or_renew()
    assert server.writes_to(path)[-1]["spec"]["acquireTime"] == sent


def test_micro_time_reads_what_comes_back_robustly() -> None:
    from controller.leader import MicroTime

    default = datetime(2026, 1, 1, tzinfo=UTC)
    assert MicroTime.of("not a time", default).isoformat() == "2026-01-01T00:00:00.000000Z"
    assert MicroTime.of(None, default) == default
    assert MicroTime.of(datetime(2026, 3, 1, 12), default).isoformat() == "2026-03-01T12:00:00.000000Z"  # no zone: UTC
    assert MicroTime.of("2026-03-01T12:00:00.123456789Z", default).isoformat() == "2026-03-01T12:00:00.123456Z"


def test_a_write_landing_between_the_release_read_and_its_write_is_released_again(server: StandInApiServer) -> None:
    a = _elector(server, "a", FakeClock())
    assert a.try_acquire_or_renew()
    path = server.lease_path("moeslo", "ctl")
    # A renewal of a's own lands between the release's read and its write: the release's write gets a 409.
    server.state.before_put[path] = lambda obj: obj["spec"].update(renewTime="2026-03-01T12:00:05.000000Z")
    a.release()
    assert server.obj(path)["spec"].get("holderIdentity") is None
    assert [code for method, p, code in server.state.log if method == "PUT" and p == path] == [409, 200]


def test_stop_waits_for_a_renewal_in_flight_then_releases(
    server: StandInApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling the loop's task does not stop the thread its renewal runs in: the release must come after."""
    config = LeaderElectionConfig(enabled=True, namespace="moeslo", lease_name="race", lease_duration_s=6,
                                  renew_period_s=2)
    elector = LeaseElector(api_client(KubernetesConfig(host=server.url)), config, identity="a")
    assert elector.try_acquire_or_renew()  # holds the lease: the loop's first round renews it
    in_flight, release_read, renewed = threading.Event(), threading.Event(), threading.Event()
    replace, read = elector.api.replace_namespaced_lease, elector.api.read_namespaced_lease

    def slow_renewal(*args: Any, **kwargs: Any) -> Any:
        if in_flight.is_set():
            return replace(*args, **kwargs)
        in_flight.set()
        release_read.wait(0.5)  # the renewal's write waits for the release's read (at most 0.5 s)
        try:
            return replace(*args, **kwargs)
        finally:
            renewed.set()

    def read_then_let_the_renewal_land(*args: Any, **kwargs: Any) -> Any:
        lease = read(*args, **kwargs)
        if in_flight.is_set():  # the release's read
            release_read.set()
            renewed.wait(2)
        return lease

    monkeypatch.setattr(elector.api, "replace_namespaced_lease", slow_renewal)
    monkeypatch.setattr(elector.api, "read_namespaced_lease", read_then_let_the_renewal_land)

    async def scenario() -> float:
        await elector.start()
        assert await asyncio.to_thread(in_flight.wait, 2)
        started = time.monotonic()
        await elector.stop()
        return time.monotonic() - started

    took_s = asyncio.run(scenario())
    path = server.lease_path("moeslo", "race")
    assert server.obj(path)["spec"].get("holderIdentity") is None  # released: a standby takes over at once
    assert [code for method, p, code in server.state.log if method == "PUT" and p == path] == [200, 200]
    assert took_s < config.renew_period_s
    assert elector.is_leader is False


def test_two_candidates_racing_for_a_lapsed_lease_get_one_winner(server: StandInApiServer) -> None:
    clock = FakeClock()
    a, b, c = (_elector(server, name, clock) for name in "abc")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    clock.now_s += 20
    path = server.lease_path("moeslo", "ctl")
    # Between c's read and c's write, b's takeover lands; c's write carries the old version: 409.
    server.state.before_put[path] = lambda obj: obj["spec"].update(holderIdentity="b")
    assert c.try_acquire_or_renew() is False
    assert server.obj(path)["spec"]["holderIdentity"] == "b"
    puts = [code for method, p, code in server.state.log if method == "PUT" and p == path]
    assert puts[-1] == 409


def test_embedded_mode_always_leads() -> None:
    assert AlwaysLeader().is_leader is True


def test_only_the_lease_holder_actuates_and_a_standby_takes_over(server: StandInApiServer, tmp_path) -> None:
    from prometheus_client import CollectorRegistry

    from controller.actuators import KubernetesActuator
    from controller.core import CoreConfig, DecisionCore
    from controller.policy import Policy
    from controller.service import ControllerService
    from controller.store import Store
    from controller.telemetry import ControllerMetrics
    from controller.types import PolicyObservation

    class Overloaded:
        async def observe(self, policies, now_s):  # type: ignore[no-untyped-def]
            return {p.name: PolicyObservation(policy=p.name, observed_at_s=now_s, queue_depth=50.0,
                                              running_requests=4.0, kv_cache_usage=0.9) for p in policies}

        async def aclose(self) -> None:
            return None

    scale_path = server.add_deployment_scale("prod", "qwen", 1)
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'shared.db'}")  # stands in for the shared database
    store.create_policy(Policy.model_validate({
        "name": "qwen", "target": {"kind": "deployment", "namespace": "prod", "name": "qwen"},
        "scaling": {"max_replicas": 10, "max_step": 1},
    }))
    clock = FakeClock()
    kube = KubernetesConfig(host=server.url, backoff_initial_s=0)

    def replica(identity: str) -> tuple[ControllerService, LeaseElector]:
        elector = _elector(server, identity, clock)
        service = ControllerService(
            store=store, source=Overloaded(), actuator=KubernetesActuator(api_client(kube), config=kube),
            core=DecisionCore(config=CoreConfig(tick_interval_s=5, stale_after_s=60)),
            metrics=ControllerMetrics(CollectorRegistry()), elector=elector, clock=clock,
        )
        return service, elector

    (a, elector_a), (b, elector_b) = replica("a"), replica("b")
    assert elector_a.try_acquire_or_renew() and not elector_b.try_acquire_or_renew()
    asyncio.run(a.tick())
    asyncio.run(b.tick())
    assert server.obj(scale_path)["spec"]["replicas"] == 2  # one step, by a only
    runtime_b = b.runtime("qwen")
    assert runtime_b is not None and (runtime_b.current_replicas, runtime_b.desired_replicas) == (2, 3)  # evaluated
    assert [d.outcome for d in store.list_decisions()] == ["applied"]  # only the leader logs
    clock.now_s += 20  # a is gone: b takes the lapsed lease over and acts
    assert b.elector.is_leader is False and elector_b.try_acquire_or_renew()
    asyncio.run(b.tick())
    assert server.obj(scale_path)["spec"]["replicas"] == 3
    assert len(server.writes_to(scale_path)) == 2


def test_the_background_loop_leads_and_releases_on_stop(server: StandInApiServer) -> None:
    config = LeaderElectionConfig(enabled=True, namespace="moeslo", lease_name="loop", lease_duration_s=3,
                                  renew_period_s=0.2)
    elector = LeaseElector(api_client(KubernetesConfig(host=server.url)), config, identity="looper")

    async def scenario() -> None:
        await elector.start()
        for _ in range(50):
            if elector.is_leader:
                break
            await asyncio.sleep(0.1)
        assert elector.is_leader
        await asyncio.sleep(0.5)  # a few renewals
        await elector.stop()

    asyncio.run(scenario())
    lease = server.obj(server.lease_path("moeslo", "loop"))
    assert lease["spec"].get("holderIdentity") is None  # released for a fast takeover
    renewals = [code for method, path, code in server.state.log if method == "PUT" and path.endswith("/loop")]
    assert len(renewals) >= 3 and set(renewals) == {200}


def test_a_silent_api_server_ends_a_round_and_the_release_within_the_renew_period() -> None:
    """A server that accepts connections and never answers: the round and the release at shutdown give up
    after ``renew_period_s`` instead of hanging (a standby could never take over, a stop never end)."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        held: list[socket.socket] = []
        threading.Thread(target=lambda: held.extend(silent.accept()[0] for _ in range(4)), daemon=True).start()
        config = LeaderElectionConfig(enabled=True, lease_duration_s=1.5, renew_period_s=0.5)
        host = f"http://127.0.0.1:{silent.getsockname()[1]}"
        elector = LeaseElector(api_client(KubernetesConfig(host=host)), config, identity="a")
        started = time.monotonic()
        assert elector.try_acquire_or_renew() is False
        elector._renewed_at_s = time.monotonic()  # as if it led: the release reads and writes the lease
        elector.release()
        assert time.monotonic() - started < 5.0
        for conn in held:
            conn.close()


def test_a_standby_waits_out_the_lease_duration_the_record_names(server: StandInApiServer) -> None:
    # A rolling update that shortens the lease: the old pod holds a 60 s lease, renewed every 20 s; the new pod,
    # set to 15 s, must wait the record's 60 s, not its own 15, or both lead.
    old = LeaderElectionConfig(enabled=True, namespace="moeslo", lease_name="ctl", lease_duration_s=60,
                               renew_period_s=20)  # fmt: skip
    clock_a, clock_b = FakeClock(), FakeClock()
    a = LeaseElector(api_client(KubernetesConfig(host=server.url)), old, identity="a", clock=clock_a)
    b = _elector(server, "b", clock_b)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    for _ in range(3):
        clock_a.now_s += 5
        clock_b.now_s += 5
        assert not b.try_acquire_or_renew() and a.is_leader
    clock_a.now_s += 45  # a crashed at 1000: its lease lapses at 1060 by the record
    clock_b.now_s += 45
    assert not a.is_leader and b.try_acquire_or_renew()


def test_a_renewal_counts_from_when_it_was_sent_not_when_its_answer_came(server: StandInApiServer) -> None:
    clock_a, clock_b = FakeClock(), FakeClock()
    a, b = _elector(server, "a", clock_a), _elector(server, "b", clock_b)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    real = a.api.replace_namespaced_lease

    def slow_answer(*args: Any, **kwargs: Any) -> Any:
        answer = real(*args, **kwargs)  # committed at once; its answer takes 4 s to arrive
        clock_a.now_s += 4
        return answer

    a.api.replace_namespaced_lease = slow_answer  # type: ignore[method-assign]
    clock_a.now_s += 5
    clock_b.now_s += 5
    assert a.try_acquire_or_renew()  # sent at 1005, answered at 1009
    assert not b.try_acquire_or_renew()  # b sees the renewed record at 1005 (on its clock) ...
    clock_a.now_s += 6
    assert not a.is_leader  # ... and a must step down by 1005 + 15 - 5, before b may take over at 1020


def test_a_sole_leader_on_a_slow_api_server_keeps_leading(server: StandInApiServer) -> None:
    """Each round slept the renew period after it ended: with requests that take 3/8 of the period, the rounds
    drifted apart and the leadership lapsed between renewals although nobody else wanted the lease."""
    config = LeaderElectionConfig(enabled=True, namespace="moeslo", lease_name="slow", lease_duration_s=2.4,
                                  renew_period_s=0.8)  # fmt: skip
    elector = LeaseElector(api_client(KubernetesConfig(host=server.url)), config, identity="only")
    assert elector.try_acquire_or_renew()
    server.state.stalls["/leases"] = 0.3  # a round's read and write: 0.6 s of the 0.8 s period

    async def scenario() -> list[bool]:
        await elector.start()
        samples = []
        for _ in range(150):
            samples.append(elector.is_leader)
            await asyncio.sleep(0.02)
        await elector.stop()
        return samples

    samples = asyncio.run(scenario())
    assert samples.count(False) == 0
    assert server.obj(server.lease_path("moeslo", "slow"))["spec"].get("holderIdentity") is None  # released


def test_a_release_after_a_long_round_has_a_read_and_a_write_of_its_own(server: StandInApiServer) -> None:
    """The release's deadline counted from before it waited for the round in flight: what the wait left was too
    short for its read and write, and the standbys waited out the lease."""
    config = LeaderElectionConfig(enabled=True, namespace="moeslo", lease_name="rel", lease_duration_s=1.5,
                                  renew_period_s=0.5)  # fmt: skip
    elector = LeaseElector(api_client(KubernetesConfig(host=server.url)), config, identity="a")
    assert elector.try_acquire_or_renew()
    server.state.stalls["/leases"] = 0.1
    elector._round_lock.acquire()  # a round in flight for 0.45 s of the 0.5 s period
    threading.Timer(0.45, elector._round_lock.release).start()
    elector.release()
    assert server.obj(server.lease_path("moeslo", "rel"))["spec"].get("holderIdentity") is None


def test_each_lease_request_may_take_half_the_renew_period(server: StandInApiServer) -> None:
    """A round of a read and a write fits in the renew period, so the rounds keep their pace."""
    config = LeaderElectionConfig(enabled=True, namespace="moeslo", lease_name="cap", lease_duration_s=15,
                                  renew_period_s=4)  # fmt: skip
    elector = LeaseElector(api_client(KubernetesConfig(host=server.url)), config, identity="a")
    timeouts: list[float] = []
    for name in ("read_namespaced_lease", "create_namespaced_lease", "replace_namespaced_lease"):
        real = getattr(elector.api, name)

        def recording(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            timeouts.append(kwargs["_request_timeout"])
            return _real(*args, **kwargs)

        setattr(elector.api, name, recording)
    assert elector.try_acquire_or_renew() and elector.try_acquire_or_renew()  # created, then renewed
    elector.release()
    assert len(timeouts) == 6 and max(timeouts) <= 2.0


def test_a_fractional_lease_duration_is_written_rounded_up(server: StandInApiServer) -> None:
    """2.5 s was written as 2 (rounded half to even): a standby took over while the holder still led."""
    config = LeaderElectionConfig(enabled=True, namespace="moeslo", lease_name="frac", lease_duration_s=2.5,
                                  renew_period_s=0.2)  # fmt: skip
    clock_a, clock_b = FakeClock(), FakeClock()
    a = LeaseElector(api_client(KubernetesConfig(host=server.url)), config, identity="a", clock=clock_a)
    b = LeaseElector(api_client(KubernetesConfig(host=server.url)), config, identity="b", clock=clock_b)
    assert a.try_acquire_or_renew() and not b.try_acquire_or_renew()
    assert server.obj(server.lease_path("moeslo", "frac"))["spec"]["leaseDurationSeconds"] == 3
    clock_a.now_s += 2.1  # a is cut off from the API server and still leads (until 2.3 s)
    clock_b.now_s += 2.1
    assert a.is_leader and not b.try_acquire_or_renew()
