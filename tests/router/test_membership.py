"""The replica set read from a real controller API (on 127.0.0.1): replicas added and removed follow its list."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from contracts.errors import DataError, ValidationError
from controller.api import create_app as controller_app
from controller.config import ControllerSettings
from controller.policy import Policy
from controller.runtime import PolicyRuntime
from controller.store import Store
from router.config import RouterConfig
from router.forward import Router
from router.membership import Membership, endpoints_from, only_policy
from tests.controller.api.page.browser import serving
from tests.router.servers import eventually, router, stubs, url_of

pytestmark = pytest.mark.timeout(60)
TOKEN = "t"


class Replicas:
    """A leader's view whose replica list the test changes, as scale-ups and scale-downs would."""

    is_leader = True
    last_tick_at = datetime(2026, 1, 1, tzinfo=UTC)

    def __init__(self) -> None:
        self.urls: list[str] = []

    def runtime(self, name: str) -> PolicyRuntime | None:
        return None

    def check_target(self, policy: Policy) -> list[str]:
        return []

    def endpoints_for(self, policy: Policy) -> list[str]:
        return list(self.urls)




def _add_policies(url: str, names: tuple[str, ...]) -> None:
    for name in names:
        answer = httpx.post(f"{url}/v1/policies", json={"name": name, "target": {"kind": "local", "model": name}},
                            headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert answer.status_code == 201, answer.text


def test_the_answers_are_checked() -> None:
    listed = {"endpoints": ["http://a:1/", "http://a:1", "http://b:2"]}
    assert endpoints_from(listed) == (("http://a:1", "http://b:2"), ())
    assert endpoints_from({"endpoints": []}) == ((), ())
    for bad in ({}, {"endpoints": "http://a:1"}, {"endpoints": ["ftp://a"]}, [1], {"endpoints": [1]}):
        with pytest.raises(DataError):
            endpoints_from(bad)
    # The controller scrapes a URL with a path (behind a gateway); the router cannot forward to one
    # (its requests went to /v1/v1/completions), so that one is left out and named, the rest are used.
    usable, unusable = endpoints_from({"endpoints": ["http://a:1", "http://b:2/v1"]})
    assert usable == ("http://a:1",) and len(unusable) == 1 and "'http://b:2/v1' must be" in unusable[0]
    with pytest.raises(DataError, match="'http://b:99999' is not a URL"):
        endpoints_from({"endpoints": ["http://b:99999"]})
    assert only_policy({"items": [{"name": "qwen"}]}) == "qwen"
    with pytest.raises(DataError, match="2 policies"):
        only_policy({"items": [{"name": "a"}, {"name": "b"}]})
    with pytest.raises(ValidationError, match="not both"):
        RouterConfig(replicas=("http://a:1",), controller_url="http://c:2")
    with pytest.raises(ValidationError, match="at least one URL"):
        RouterConfig()


def test_replicas_the_controller_adds_and_removes_take_and_stop_taking_requests(tmp_path: Path) -> None:
    view = Replicas()
    settings = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN)
    with serving(controller_app(settings, Store(settings.db_url), service=view)) as controller, \
            stubs(2) as (one, two):  # fmt: skip
        _add_policies(controller, ("qwen",))
        view.urls = [url_of(one)]
        with router([], controller_url=controller, membership_interval_s=0.05) as running:
            assert set(running.replicas()) == {url_of(one)}  # read before the first request
            eventually(lambda: running.replicas()[url_of(one)]["healthy"] is True, what="admitted after checks")
            body = {"model": "stub", "prompt": "hi", "max_tokens": 2}
            assert httpx.post(running.url + "/v1/completions", json=body, timeout=10).status_code == 200
            view.urls = [url_of(one), url_of(two)]
            eventually(lambda: set(running.replicas()) == {url_of(one), url_of(two)}, what="the added replica")
            eventually(lambda: running.replicas()[url_of(two)]["healthy"] is True, what="the added one admitted")
            view.urls = [url_of(two)]
            eventually(lambda: set(running.replicas()) == {url_of(two)}, what="the removed replica gone")
            for _ in range(3):
                assert httpx.post(running.url + "/v1/completions", json=body, timeout=10).status_code == 200

            def served(replica: str) -> float:  # counted just after the answer is sent
                return sum(s.value for m in running.registry.collect() if m.name == "moeslo_router_requests"
                           for s in m.samples if s.name.endswith("_total") and s.labels["outcome"] == "ok"
                           and s.labels["replica"] == replica)  # fmt: skip

            eventually(lambda: served(url_of(two)) == 3 and served(url_of(one)) == 1, what="the requests counted")
            assert running.sample("moeslo_router_replica_healthy", replica=url_of(one)) == 0  # series removed
            view.urls = []
            eventually(lambda: not running.replicas(), what="an empty set")
            answer = httpx.post(running.url + "/v1/completions", json=body, timeout=10)
            assert answer.status_code == 503 and "Retry-After" in answer.headers


def _read_once(controller: str, policy: str | None = None) -> tuple[str | None, tuple[str, ...]]:
    """One membership read from ``controller``: why it kept or trimmed the set (None: nothing to say), and the set."""

    async def go() -> tuple[str | None, tuple[str, ...]]:
        routing = Router(RouterConfig(controller_url=controller, controller_policy=policy))
        membership = Membership(routing)
        await membership.refresh()
        await membership.stop()
        await routing.aclose()
        return membership.last_error, routing.pool.names

    return asyncio.run(go())


def test_several_policies_and_none_named_keep_the_set_and_say_why(tmp_path: Path) -> None:
    view = Replicas()
    view.urls = ["http://127.0.0.1:9"]
    settings = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN)
    with serving(controller_app(settings, Store(settings.db_url), service=view)) as controller:
        _add_policies(controller, ("a", "b"))
        error, names = _read_once(controller)
        assert error is not None and "2 policies" in error and names == ()
        assert _read_once(controller, "b")[1] == ("http://127.0.0.1:9",)


def test_a_listed_url_with_a_path_is_left_out_and_the_rest_routed(tmp_path: Path) -> None:
    """The controller accepts ``http://gw/model-b`` (it scrapes ``/model-b/metrics``); the router keeps the
    replicas it can forward to and names the one it cannot, instead of refusing the list and serving 503."""
    view = Replicas()
    view.urls = ["http://127.0.0.1:9", "http://gw.example:80/model-b"]
    settings = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN)
    with serving(controller_app(settings, Store(settings.db_url), service=view)) as controller:
        _add_policies(controller, ("a",))
        error, names = _read_once(controller)
    assert names == ("http://127.0.0.1:9",)
    assert error is not None and "model-b" in error


def test_an_added_replica_takes_requests_only_after_its_health_checks() -> None:
    from router.pool import ReplicaPool

    pool = ReplicaPool(("http://a:1",), prefill_tokens_per_s=1000.0, mean_prompt_tokens=100.0, readmit_after=2)
    ticket = pool.begin("http://a:1", 50)
    assert pool.set_members(("http://b:2",)) == (["http://b:2"], ["http://a:1"])
    assert not pool.is_healthy("http://b:2")
    pool.finish(ticket)  # a request on a removed replica finishes without a trace
    assert not pool.health_result("http://b:2", True) and pool.health_result("http://b:2", True)
    assert [s.name for s in pool.snapshot() if s.healthy] == ["http://b:2"]


def test_queue_mode_holds_requests_while_the_fleet_is_at_zero(tmp_path: Path) -> None:
    """Scale from zero: the router holds requests with no replica, the controller reads that queue, a replica comes."""
    import threading

    from controller.sources.router_page import parse_router_queue

    view = Replicas()
    settings = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN)
    with serving(controller_app(settings, Store(settings.db_url), service=view)) as controller, \
            stubs(1) as (one,), router([], controller_url=controller, membership_interval_s=0.05,
                                     admission="queue", max_queue_s=20.0) as running:  # fmt: skip
        _add_policies(controller, ("qwen",))
        health = httpx.get(running.url + "/health", timeout=5)
        assert (health.status_code, health.json()["healthy_replicas"]) == (200, 0)  # stays in its Service
        answers: list[httpx.Response] = []
        body = {"model": "stub", "prompt": "hi", "max_tokens": 2}
        sender = threading.Thread(target=lambda: answers.append(
            httpx.post(running.url + "/v1/completions", json=body, timeout=30)))  # fmt: skip
        sender.start()
        eventually(lambda: running.sample("moeslo_router_queued_requests") == 1, what="the request held")
        page = httpx.get(running.url + "/metrics", timeout=5).text
        assert parse_router_queue(page) == 1.0  # what the controller's scrape source reads
        assert not answers
        view.urls = [url_of(one)]  # the controller started a replica
        sender.join(15)
        assert [a.status_code for a in answers] == [200]
        assert running.sample("moeslo_router_queued_requests") == 0
