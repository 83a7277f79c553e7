"""The router's error document is OpenAI's: ``{"error": {"message", "type", "param", "code", ...}}``.

Every way the router refuses a request is driven here without a socket: the error classes through
:func:`router.errors.error_document` and the SSE error event, and the app's error middleware with
aiohttp's own refusals and a bug of ours.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from contracts.errors import MoesloError, NotFoundError, OverloadedError, UnavailableError, ValidationError
from engine.openai_errors import error_body as engine_error_body
from router.app import create_app
from router.config import RouterConfig
from router.errors import UpstreamError, UpstreamTimeoutError, error_document, sse_error_event

OPENAI_KEYS = {"message", "type", "param", "code"}
REPLICA = "http://127.0.0.1:18399"


@pytest.mark.parametrize(
    ("exc", "status", "param", "kind"),
    [
        (ValidationError("body: not JSON (Expecting value)"), 400, None, "invalid_request_error"),
        (NotFoundError("route", "GET /v2/nothing"), 404, None, "invalid_request_error"),
        (NotFoundError("model", "other"), 404, "model", "invalid_request_error"),
        (OverloadedError("every replica is over the objective", retry_after_s=2.7), 429, None, "rate_limit_error"),
        (UnavailableError("no healthy replica"), 503, None, "service_unavailable_error"),
        (UpstreamError(f"replica {REPLICA} broke the connection", replica=REPLICA), 502, None, "server_error"),
        (UpstreamTimeoutError(f"replica {REPLICA} did not answer in time", replica=REPLICA), 504, None,
         "server_error"),
    ],
)  # fmt: skip
def test_every_error_class_has_openais_fields_with_param(
    exc: MoesloError, status: int, param: str | None, kind: str
) -> None:
    got_status, body, _ = error_document(exc)
    error = body["error"]
    assert got_status == status and error["code"] == status
    assert error.keys() >= OPENAI_KEYS, error
    assert error["param"] == param and error["message"] == str(exc)
    assert error["type"] == kind  # OpenAI's word, as the engine writes it: a client sees one vocabulary
    if not isinstance(exc, UpstreamError):
        assert error["type"] == engine_error_body(exc)["type"]
    streamed = json.loads(sse_error_event(exc).split(b"\n\n")[0].removeprefix(b"data: "))
    assert streamed == json.loads(json.dumps(body))  # the stream's last event is the same document


def _through_middleware(raised: BaseException) -> tuple[int, dict[str, Any]]:
    app = create_app(RouterConfig(replicas=(REPLICA,)), monitor=False)
    (middleware,) = app.middlewares

    async def handler(_request: web.Request) -> web.StreamResponse:
        raise raised

    async def answer() -> web.StreamResponse:
        return await middleware(make_mocked_request("POST", "/v1/completions", app=app), handler)

    response = asyncio.run(answer())
    assert isinstance(response, web.Response) and response.body is not None
    assert isinstance(response.body, bytes)
    return response.status, json.loads(response.body)["error"]


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        (web.HTTPRequestEntityTooLarge(max_size=64, actual_size=65), 413),
        (web.HTTPNotFound(), 404),
        (web.HTTPMethodNotAllowed("GET", ["POST"]), 405),
        (RuntimeError("a bug"), 500),
        (UnavailableError("the router wrote no answer"), 503),
    ],
)
def test_the_middleware_answers_every_refusal_with_openais_fields(raised: BaseException, status: int) -> None:
    got_status, error = _through_middleware(raised)
    assert (got_status, error["code"]) == (status, status)
    assert error.keys() >= OPENAI_KEYS, error
    assert error["param"] is None
    assert error["type"] == ("server_error" if status == 500 else
                             "service_unavailable_error" if status == 503 else "invalid_request_error")
