"""Headers through the router: a replica's own headers reach the client, the connection's own do not."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web

from bench.stub_upstream import COMPLETION, DEFAULT_CHUNKS
from router.wire import relayed_headers, upstream_headers
from tests.router.servers import replica_app, router, serving, stubs

pytestmark = pytest.mark.timeout(60)
OWN = {"X-Request-Id": "req-42", "OpenAI-Processing-Ms": "17", "Server": "stub-engine"}


def replica_with_headers() -> web.Application:
    """A replica that sets headers of its own on whole and streamed answers."""

    async def completion(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.Response(body=COMPLETION, content_type="application/json", headers=OWN)
        answer = web.StreamResponse(headers={**OWN, "Content-Type": "text/event-stream"})
        answer.enable_chunked_encoding()
        await answer.prepare(request)
        for chunk in DEFAULT_CHUNKS:
            await answer.write(chunk)
        await answer.write_eof()
        return answer

    return replica_app(completion)


@pytest.mark.parametrize("stream", [False, True])
def test_a_replicas_own_headers_reach_the_client(stream: bool) -> None:
    with serving(replica_with_headers()) as replica, router([replica]) as r:
        answer = httpx.post(r.url + "/v1/completions", json={"prompt": "hi", "stream": stream}, timeout=5)
        assert answer.status_code == 200
        assert answer.content == (b"".join(DEFAULT_CHUNKS) if stream else COMPLETION)
        assert (answer.headers["x-request-id"], answer.headers["openai-processing-ms"]) == ("req-42", "17")
        assert answer.headers.get_list("content-length") == ([] if stream else [str(len(COMPLETION))])
        assert answer.headers.get_list("transfer-encoding") == (["chunked"] if stream else [])
        assert answer.headers["server"] != "stub-engine"  # the router answers the client; its own Date and Server
        assert len(answer.headers.get_list("date")) == 1


def test_the_connections_own_headers_are_not_relayed() -> None:
    raw = [(b"Content-Type", b"application/json"), (b"Connection", b"keep-alive, X-Hop"), (b"X-Hop", b"1"),
           (b"Keep-Alive", b"timeout=5"), (b"Proxy-Authenticate", b"Basic"), (b"Transfer-Encoding", b"chunked"),
           (b"TE", b"trailers"), (b"Trailer", b"X-Sum"), (b"Upgrade", b"h2c"), (b"Content-Length", b"12"),
           (b"Date", b"Mon, 01 Jan 2024 00:00:00 GMT"), (b"Server", b"uvicorn"), (b"X-Request-Id", b"a"),
           (b"Set-Cookie", b"a=1"), (b"Set-Cookie", b"b=2"), (b"Retry-After", b"3")]  # fmt: skip
    assert relayed_headers(raw) == [(b"content-type", b"application/json"), (b"x-request-id", b"a"),
                                    (b"set-cookie", b"a=1"), (b"set-cookie", b"b=2"), (b"retry-after", b"3")]


def test_a_clients_expect_100_continue_stays_with_the_router() -> None:
    """The router has the whole body before it sends upstream: forwarded, ``Expect`` made the upstream client wait
    for a 100 Continue before sending it, and a replica that sends none (the stub) never answered."""
    with stubs(1) as (stub,), router([stub], upstream_timeout_s=3.0) as r:
        answer = httpx.post(r.url + "/v1/completions", json={"prompt": "hi"}, headers={"Expect": "100-continue"},
                            timeout=5)  # fmt: skip
        assert (answer.status_code, answer.content) == (200, COMPLETION)
    assert upstream_headers([(b"Expect", b"100-continue"), (b"X-Request-Id", b"a")]) == [("x-request-id", "a")]
