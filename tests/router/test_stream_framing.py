"""How a streamed answer is framed to the client: its headers as soon as the replica's, and HTTP/1.0 clients."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest
from aiohttp import web

from tests.router.servers import replica_app, router, serving, stubs, url_of

pytestmark = pytest.mark.timeout(60)


def post_raw(url: str, version: str, body: dict[str, object]) -> tuple[list[bytes], bytes]:
    """POST /v1/completions over a socket as HTTP/``version``: the head's lines and the body read to EOF."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(f"POST /v1/completions HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)  # fmt: skip
        data = b""
        while chunk := conn.recv(65536):  # the router closes the connection when the body ends
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head.lower().split(b"\r\n"), rest


def test_a_stream_asked_over_http_1_0_ends_at_the_connections_close() -> None:
    # HTTP/1.0 has no chunked encoding (curl --http1.0, ApacheBench): the body runs to the close, as vLLM's does.
    with stubs(1) as (stub,), router([stub]) as r:
        head, body = post_raw(r.url, "1.0", {"prompt": "hello there", "max_tokens": 2, "stream": True})
        assert head[0].endswith(b" 200 ok"), head
        assert b"transfer-encoding: chunked" not in head
        assert body.startswith(b"data: ") and body.endswith(b"data: [DONE]\n\n")
        head, body = post_raw(r.url, "1.0", {"prompt": "hello there", "max_tokens": 2})
        assert head[0].endswith(b" 200 ok") and json.loads(body)["choices"]
        assert r.sample("moeslo_router_requests_total", replica=url_of(stub),
                        decision="lowest_predicted_ttft", outcome="ok") == 2  # fmt: skip



def test_a_streams_headers_reach_the_client_before_its_first_token() -> None:
    # The replica sends its headers at once and its first token after prefill: the client hears it began.
    first_token = threading.Event()

    async def prefilling(request: web.Request) -> web.StreamResponse:
        await request.read()
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        await asyncio.get_running_loop().run_in_executor(None, first_token.wait, 6.0)
        await answer.write(b"data: {}\n\ndata: [DONE]\n\n")
        await answer.write_eof()
        return answer

    with serving(replica_app(prefilling)) as replica, router([replica]) as r:
        started = time.monotonic()
        with httpx.stream("POST", r.url + "/v1/completions", json={"prompt": "x", "stream": True}, timeout=20) as a:
            headers_s = time.monotonic() - started
            first_token.set()
            assert a.status_code == 200 and a.read().endswith(b"data: [DONE]\n\n")
        assert headers_s < 3.0, f"the headers waited {headers_s:.1f} s for the first token"


def test_an_error_event_is_found_across_chunks_and_generated_text_is_not_one() -> None:
    from router.wire import StreamErrors

    text = json.dumps({"choices": [{"text": 'say "error": {"code": 500}'}]}).encode()
    clean = StreamErrors()
    clean.scan(b"data: " + text + b"\n\ndata: [DONE]\n\n")
    assert clean.code is None and clean.outcome(200) == "ok"
    event = b'data: {"id": "c", "error": {"message": "failed", "code": 503}}\n\n'
    split = StreamErrors()
    for part in (event[:20], event[20:], b"data: [DONE]\n\n"):
        split.scan(part)
    assert split.code == 503 and split.outcome(200) == "upstream_status"
