"""``GET /v1/models`` through the router: one replica that hangs or fails does not decide the answer."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from aiohttp import web

from bench.stub_upstream import MODELS
from tests.router.servers import Handler, replica_app, router, serving

pytestmark = pytest.mark.timeout(60)


async def _models(_: web.Request) -> web.Response:
    return web.Response(body=MODELS, content_type="application/json")


async def _hangs(_: web.Request) -> web.Response:
    await asyncio.sleep(30)  # cancelled when the router lets the connection go
    return await _models(_)


async def _fails(_: web.Request) -> web.Response:
    return web.json_response({"error": {"message": "engine starting", "code": 500}}, status=500)


@pytest.mark.parametrize("first", [_hangs, _fails], ids=["hangs", "fails"])
def test_the_model_list_comes_from_a_replica_that_answers(first: Handler) -> None:
    with serving(replica_app(gets={"/v1/models": first})) as bad, \
            serving(replica_app(gets={"/v1/models": _models})) as good, \
            router([bad, good], upstream_timeout_s=30.0, scrape_timeout_s=0.5) as r:  # fmt: skip
        began = time.monotonic()
        answer = httpx.get(r.url + "/v1/models", timeout=10)
        assert (answer.status_code, answer.content) == (200, MODELS)
        assert time.monotonic() - began < 5, "waited on the hung replica past the scrape timeout"
        assert httpx.get(r.url + "/v1/models/stub", timeout=10).status_code == 200


def test_the_model_list_is_an_error_naming_the_replica_when_none_answers() -> None:
    with serving(replica_app(gets={"/v1/models": _hangs})) as hung, \
            serving(replica_app(gets={"/v1/models": _fails})) as failing, \
            router([hung, failing], upstream_timeout_s=30.0, scrape_timeout_s=0.5) as r:  # fmt: skip
        answer = httpx.get(r.url + "/v1/models", timeout=10)
        assert answer.status_code == 502
        assert answer.json()["error"]["replica"] == failing
        assert "HTTP 500" in answer.json()["error"]["message"]


KEY = "Bearer sk-test"


async def _guarded_models(request: web.Request) -> web.Response:
    if request.headers.get("Authorization") != KEY:  # vLLM's --api-key guards every /v1 route so
        return web.json_response({"error": "Unauthorized"}, status=401, headers={"X-Request-Id": "r1"})
    return await _models(request)


def test_the_model_list_is_asked_with_the_clients_headers_and_a_refusal_is_relayed_unchanged() -> None:
    with serving(replica_app(gets={"/v1/models": _guarded_models})) as guarded, router([guarded]) as r:
        for path in ("/v1/models", "/v1/models/stub"):
            assert httpx.get(r.url + path, headers={"Authorization": KEY}, timeout=10).status_code == 200, path
            refused = httpx.get(r.url + path, timeout=10)
            assert (refused.status_code, refused.json()) == (401, {"error": "Unauthorized"}), path
            assert refused.headers["x-request-id"] == "r1"
        assert r.replicas()[guarded]["healthy"] is True
