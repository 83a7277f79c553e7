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


async def _models_with_a_slash(_: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "Qwen/Qwen3-30B-A3B", "object": "model"}]})


@pytest.mark.parametrize("asked", ["Qwen/Qwen3-30B-A3B", "Qwen%2FQwen3-30B-A3B"])
def test_a_model_id_with_a_slash_is_found(asked: str) -> None:
    # Hugging Face ids are owner/name; the engine's route takes them whole ({model_id:path}), so must the router's.
    with serving(replica_app(gets={"/v1/models": _models_with_a_slash})) as replica, router([replica]) as r:
        answer = httpx.get(r.url + "/v1/models/" + asked, timeout=10)
        assert (answer.status_code, answer.json()["id"]) == (200, "Qwen/Qwen3-30B-A3B")
        assert httpx.get(r.url + "/v1/models/Qwen/other", timeout=10).status_code == 404


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


async def _tokenize(request: web.Request) -> web.Response:
    body = await request.json()
    if "prompt" not in body:
        return web.json_response({"error": {"message": "prompt: field required", "code": 400}}, status=400)
    tokens = [len(word) for word in body["prompt"].split()]
    return web.json_response({"count": len(tokens), "max_model_len": 2048, "tokens": tokens})


async def _detokenize(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"prompt": " ".join("x" * t for t in body["tokens"])})


def test_tokenize_and_detokenize_are_answered_by_a_replica_that_answers_and_refusals_are_relayed() -> None:
    tokenizer = {"/tokenize": _tokenize, "/detokenize": _detokenize}
    failing = {"/tokenize": _fails, "/detokenize": _fails}
    with serving(replica_app(posts=failing)) as bad, serving(replica_app(posts=tokenizer)) as good, \
            router([bad, good], scrape_timeout_s=0.5) as r:  # fmt: skip
        answer = httpx.post(r.url + "/tokenize", json={"prompt": "ab cde"}, timeout=10)
        assert (answer.status_code, answer.json()) == (200, {"count": 2, "max_model_len": 2048, "tokens": [2, 3]})
        back = httpx.post(r.url + "/detokenize", json={"tokens": [2, 3]}, timeout=10)
        assert (back.status_code, back.json()) == (200, {"prompt": "xx xxx"})
        refused = httpx.post(r.url + "/tokenize", json={"text": "ab"}, timeout=10)
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == "prompt: field required"
        assert r.replicas()[good]["healthy"] is True


async def _slow_tokenize(request: web.Request) -> web.Response:
    await asyncio.sleep(1.5)  # past the 0.5 s scrape timeout: a long document's tokenizing
    return await _tokenize(request)


def test_tokenize_has_the_upstream_timeout_and_is_not_sent_twice() -> None:
    calls: list[str] = []

    def counted(name: str) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            calls.append(name)
            return await _slow_tokenize(request)
        return handler

    with serving(replica_app(posts={"/tokenize": counted("a")})) as a, \
            serving(replica_app(posts={"/tokenize": counted("b")})) as b, \
            router([a, b], scrape_timeout_s=0.5, upstream_timeout_s=30.0) as r:  # fmt: skip
        answer = httpx.post(r.url + "/tokenize", json={"prompt": "ab cde"}, timeout=10)
        assert (answer.status_code, answer.json()["count"]) == (200, 2)
        assert len(calls) == 1, calls
    with serving(replica_app(posts={"/tokenize": counted("c")})) as c, \
            serving(replica_app(posts={"/tokenize": counted("d")})) as d, \
            router([c, d], scrape_timeout_s=0.5, upstream_timeout_s=0.5) as r:  # fmt: skip
        calls.clear()
        answer = httpx.post(r.url + "/tokenize", json={"prompt": "ab"}, timeout=10)
        assert answer.status_code == 504
        assert len(calls) == 1, calls
