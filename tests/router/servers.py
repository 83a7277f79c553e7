"""The router and stub upstreams on 127.0.0.1 for the proxy tests, each in a thread, each bounded in time."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from aiohttp import web
from prometheus_client import CollectorRegistry

from bench.stub_upstream import StubUpstream
from router.app import create_app
from router.config import RouterConfig

WAITING_TEXT = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="stub"}} {waiting}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="stub"}} 0.0
"""


def eventually(check: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        time.sleep(0.02)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _empty(_: web.Request) -> web.StreamResponse:
    return web.Response(text="")


def replica_app(completion: Handler | None = None, gets: Mapping[str, Handler] | None = None,
                posts: Mapping[str, Handler] | None = None) -> web.Application:  # fmt: skip
    """A replica as an aiohttp app: ``completion`` serves POST /v1/completions, ``gets`` GET paths and ``posts``
    POST paths; /metrics and /health answer an empty 200 unless ``gets`` has them."""
    app = web.Application()
    if completion is not None:
        app.router.add_post("/v1/completions", completion)
    for path, handler in (posts or {}).items():
        app.router.add_post(path, handler)
    for path, handler in {"/metrics": _empty, "/health": _empty, **(gets or {})}.items():
        app.router.add_get(path, handler)
    return app


@dataclass
class RunningRouter:
    url: str
    app: web.Application
    registry: CollectorRegistry

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def replicas(self) -> dict[str, dict[str, object]]:
        states = httpx.get(self.url + "/router/replicas", timeout=5).json()["replicas"]
        return {s["name"]: s for s in states}


@contextmanager
def stubs(count: int, **options: object) -> Iterator[list[StubUpstream]]:
    started = [StubUpstream(**options) for _ in range(count)]  # type: ignore[arg-type]
    for stub in started:
        stub.start_in_thread()
    try:
        yield started
    finally:
        for stub in started:
            stub.stop_in_thread()


def url_of(stub: StubUpstream) -> str:
    return f"http://127.0.0.1:{stub.port}"


@contextmanager
def serving(app: web.Application, *, handler_cancellation: bool = True) -> Iterator[str]:
    """``app`` served on 127.0.0.1 from a thread of its own; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, handler_cancellation=handler_cancellation)
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.SockSite(runner, sock).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="aiohttp-app", daemon=True)
    thread.start()
    try:
        assert ready.wait(10), "the server did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        sock.close()


@contextmanager
def router(upstreams: list[StubUpstream] | list[str], *, handler_cancellation: bool = True,
           **options: object) -> Iterator[RunningRouter]:  # fmt: skip
    """The router on 127.0.0.1 in front of stubs (or replica URLs), its scrape interval short for the tests.

    ``handler_cancellation=False``: a client's leaving shows only when a write to it fails.
    """
    settings: dict[str, object] = {"scrape_interval_s": 0.05, "readmit_after": 2, **options}
    urls = tuple(u if isinstance(u, str) else url_of(u) for u in upstreams)
    config = RouterConfig(replicas=urls, **settings)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    app = create_app(config, registry=registry)
    with serving(app, handler_cancellation=handler_cancellation) as url:
        yield RunningRouter(url, app, registry)
