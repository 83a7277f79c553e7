"""A client that leaves mid-stream is not the replica's fault: nothing is ejected, the upstream is closed."""

from __future__ import annotations

import httpx
import pytest

from tests.router.servers import eventually, router, stubs, url_of

pytestmark = pytest.mark.timeout(30)


def test_a_failed_write_to_a_departed_client_ejects_nothing() -> None:
    chunks = tuple(b"data: " + b"x" * 2000 + b"\n\n" for _ in range(400))  # more than the socket buffers hold
    with stubs(1, stream_chunks=chunks, chunk_delay_s=0.005) as (stub,), \
            router([stub], handler_cancellation=False) as r:  # fmt: skip
        body = {"prompt": "hi", "stream": True}
        with httpx.stream("POST", r.url + "/v1/completions", json=body, timeout=5) as answer:
            next(answer.iter_raw())
        labels = {"replica": url_of(stub), "decision": "lowest_predicted_ttft", "outcome": "client_disconnected"}
        eventually(lambda: r.sample("moeslo_router_requests_total", **labels) == 1, 10, "the departure counted")
        assert r.replicas()[url_of(stub)]["healthy"] is True
        assert r.sample("moeslo_router_ejections_total", replica=url_of(stub)) == 0
        eventually(lambda: stub.peer_closed == 1, 10, "the upstream closed")
