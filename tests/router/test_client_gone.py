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


@pytest.mark.parametrize("handler_cancellation", [True, False])
def test_a_client_that_leaves_after_done_was_served(handler_cancellation: bool) -> None:
    # The stream's last bytes come late, after [DONE]: a client that stops reading at [DONE] (as most do)
    # leaves before the upstream ends, and still counts as served.
    chunks = (b"data: 1\n\n", b"data: [DONE]\n\n", b"\n")
    with stubs(1, stream_chunks=chunks, chunk_delay_s=0.3) as (stub,), \
            router([stub], handler_cancellation=handler_cancellation) as r:  # fmt: skip
        with httpx.stream("POST", r.url + "/v1/completions", json={"prompt": "hi", "stream": True},
                          timeout=5) as answer:  # fmt: skip
            received = b""
            for part in answer.iter_raw():
                received += part
                if received.endswith(b"data: [DONE]\n\n"):
                    break
        ok = {"replica": url_of(stub), "decision": "lowest_predicted_ttft", "outcome": "ok"}
        eventually(lambda: r.sample("moeslo_router_requests_total", **ok) == 1, 10, "the request counted as served")
        assert r.sample("moeslo_router_requests_total", **{**ok, "outcome": "client_disconnected"}) == 0
        assert r.replicas()[url_of(stub)]["healthy"] is True  # nor is its replica at fault
        assert r.sample("moeslo_router_ejections_total", replica=url_of(stub)) == 0


def test_a_client_that_leaves_before_the_first_byte_is_counted_out() -> None:
    # The engine sends no headers before a whole answer (or a stream's first token) is ready: a client that
    # times out first cancels the router's request while it waits on the replica.
    with stubs(1, mode="hang") as (stub,), router([stub]) as r:
        name = url_of(stub)
        for stream in (False, True):
            with pytest.raises(httpx.TimeoutException):
                httpx.post(r.url + "/v1/completions", json={"prompt": "hi", "stream": stream}, timeout=0.3)
        eventually(lambda: stub.peer_closed == 2, 10, "both requests left the replica")
        eventually(lambda: r.replicas()[name]["outstanding"] == 0, 10, "the requests counted out")
        assert r.replicas()[name]["waiting"] == 0 and r.replicas()[name]["pending_prefill_tokens"] == 0
        assert r.sample("moeslo_router_outstanding_requests", replica=name) == 0
