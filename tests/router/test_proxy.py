"""The proxy against stub upstreams on 127.0.0.1: relaying, streaming, failures, admission, bad answers.

Every test is bounded (``timeout``) and every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
from aiohttp import web

from bench.stub_upstream import COMPLETION, DEFAULT_CHUNKS
from tests.router.servers import WAITING_TEXT, Handler, eventually, replica_app, router, serving, stubs, url_of

pytestmark = pytest.mark.timeout(60)
STREAM = {"prompt": "hello there", "max_tokens": 8, "stream": True}
PLAIN = {"prompt": "hello there", "max_tokens": 1}


def test_a_completion_and_the_model_list_are_relayed_as_the_replica_wrote_them() -> None:
    with stubs(1) as (stub,), router([stub]) as r:
        answer = httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5)
        assert (answer.status_code, answer.content) == (200, COMPLETION)
        assert answer.headers["content-type"] == "application/json"
        models = httpx.get(r.url + "/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == "stub"
        one = httpx.get(r.url + "/v1/models/stub", timeout=5)  # the OpenAI SDK's models.retrieve
        assert (one.status_code, one.json()) == (200, models["data"][0])
        missing = httpx.get(r.url + "/v1/models/other", timeout=5)
        assert missing.status_code == 404 and "other" in missing.json()["error"]["message"]
        assert missing.json()["error"]["param"] == "model"  # OpenAI's field at fault
        chat = httpx.post(r.url + "/v1/chat/completions", json={"messages": []}, timeout=5)
        assert chat.status_code == 200  # the stub serves chat; an engine without it answers its own 404
        labels = {"replica": url_of(stub), "decision": "lowest_predicted_ttft", "outcome": "ok"}
        eventually(lambda: r.sample("moeslo_router_requests_total", **labels) == 2, 5, "two counted")  # after the reply
        assert r.sample("moeslo_router_overhead_seconds_count") == 2


def test_streaming_passes_through_byte_for_byte_as_it_arrives() -> None:
    chunks = (b'data: {"text": "a"}\n\n', b'data: {"text": "\xc3\xa9"}\n\n', b"data: [DONE]\n\n")
    with stubs(1, stream_chunks=chunks, chunk_delay_s=0.3) as (stub,), router([stub]) as r:
        arrivals: list[tuple[float, bytes]] = []
        with httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=5) as answer:
            assert answer.headers["content-type"] == "text/event-stream"
            for piece in answer.iter_raw():
                arrivals.append((time.monotonic(), piece))
        assert b"".join(p for _, p in arrivals) == b"".join(chunks)
        assert arrivals[-1][0] - arrivals[0][0] > 0.4, "the first chunk waited for the last: buffered"
        labels = {"replica": url_of(stub)}
        assert r.sample("moeslo_router_observed_ttft_seconds_count", **labels) == 1
        assert r.sample("moeslo_router_ttft_prediction_error_seconds_count", **labels) == 1


def test_a_client_that_goes_away_closes_the_upstream_request() -> None:
    chunks = tuple(f"data: {i}\n\n".encode() for i in range(100))
    with stubs(1, stream_chunks=chunks, chunk_delay_s=0.05) as (stub,), router([stub]) as r:
        with httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=5) as answer:
            next(answer.iter_raw())
        eventually(lambda: stub.peer_closed == 1, 5, "the upstream seeing the disconnect")
        eventually(lambda: r.replicas()[url_of(stub)]["outstanding"] == 0, 5, "the request leaving the pool")
        stub.mode = "hang"
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=0.5)
        eventually(lambda: stub.peer_closed == 2, 5, "the upstream seeing the non-streaming disconnect")
        labels = {"replica": url_of(stub), "decision": "lowest_predicted_ttft", "outcome": "client_disconnected"}
        eventually(lambda: r.sample("moeslo_router_requests_total", **labels) == 2, 5, "two disconnects counted")


def test_a_replica_dying_mid_stream_gives_a_clean_error_then_is_ejected_and_readmitted() -> None:
    with stubs(2) as (dying, healthy), router([dying, healthy], policy="round-robin",
                                                            readmit_after=20) as r:  # fmt: skip
        dying.mode = "die_mid_stream"
        with httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=5) as answer:
            body = answer.read()  # a clean end: no protocol error on the client's side
        assert body.startswith(DEFAULT_CHUNKS[0] + DEFAULT_CHUNKS[1])
        error_event = body[len(DEFAULT_CHUNKS[0] + DEFAULT_CHUNKS[1]):]
        assert error_event.endswith(b"data: [DONE]\n\n")
        error = json.loads(error_event.split(b"\n\n")[0].removeprefix(b"data: "))["error"]
        assert (error["type"], error["code"], error["replica"]) == ("server_error", 502, url_of(dying))
        assert r.replicas()[url_of(dying)]["healthy"] is False
        for _ in range(3):  # the survivor takes everything meanwhile
            assert httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5).status_code == 200
        assert healthy.requests["/v1/completions"] == 3
        eventually(lambda: r.replicas()[url_of(dying)]["healthy"] is True, 5, "readmission")  # 20 passes of /health
        assert r.sample("moeslo_router_ejections_total", replica=url_of(dying)) == 1
        labels = {"replica": url_of(dying), "decision": "next_in_turn", "outcome": "upstream_failed_mid_stream"}
        eventually(lambda: r.sample("moeslo_router_requests_total", **labels) == 1, 5, "the failure counted")


def test_a_break_inside_an_event_ends_that_event_before_the_error_event() -> None:
    chunks = (DEFAULT_CHUNKS[0], b'data: {"id":"cmpl-stub","cho', *DEFAULT_CHUNKS[2:])  # the break comes after a half
    with stubs(1, stream_chunks=chunks) as (dying,), router([dying]) as r:
        dying.mode = "die_mid_stream"
        with httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=5) as answer:
            body = answer.read()
    events = [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]
    assert events[1] == b'{"id":"cmpl-stub","cho'  # the half event, on its own
    assert json.loads(events[2])["error"]["code"] == 502 and events[3] == b"[DONE]"


def test_a_break_after_done_is_a_whole_answer_and_ejects_nothing() -> None:
    # The replica's process goes after its [DONE], before the chunked terminator: the client has its whole answer.
    chunks = (DEFAULT_CHUNKS[0], b"data: [DONE]\n\n", b"never sent")
    with stubs(1, stream_chunks=chunks) as (replica,), router([replica]) as r:
        replica.mode = "die_mid_stream"
        with httpx.stream("POST", r.url + "/v1/completions", json=STREAM, timeout=5) as answer:
            body = answer.read()
        assert body == DEFAULT_CHUNKS[0] + b"data: [DONE]\n\n"
        labels = {"replica": url_of(replica), "decision": "lowest_predicted_ttft"}
        eventually(lambda: r.sample("moeslo_router_requests_total", **labels, outcome="ok") == 1, 5, "counted ok")
        assert r.sample("moeslo_router_requests_total", **labels, outcome="upstream_failed_mid_stream") == 0
        assert r.sample("moeslo_router_ejections_total", replica=url_of(replica)) == 0
        assert r.replicas()[url_of(replica)]["healthy"] is True


def test_a_replica_that_refuses_connections_is_skipped_without_the_client_noticing() -> None:
    with stubs(2) as (gone, alive), router([gone, alive], policy="round-robin") as r:
        port = gone.port
        gone.stop_in_thread()
        for _ in range(2):
            assert httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5).status_code == 200
        assert r.replicas()[url_of(gone)]["healthy"] is False
        gone.start_in_thread(port)
        eventually(lambda: r.replicas()[url_of(gone)]["healthy"] is True, 5, "readmission after restart")


@contextmanager
def unanswered_connects() -> Iterator[str]:
    """The URL of a listener that never accepts, its queue full: a connect hangs (a node gone, its SYNs dropped)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        fillers = [socket.socket() for _ in range(3)]
        try:
            for filler in fillers:
                filler.setblocking(False)
                filler.connect_ex(listener.getsockname())
            yield f"http://127.0.0.1:{listener.getsockname()[1]}"
        finally:
            for filler in fillers:
                filler.close()


def test_a_replica_whose_connect_times_out_is_skipped_without_the_client_noticing() -> None:
    with unanswered_connects() as gone, stubs(1) as (alive,), \
            router([gone, url_of(alive)], policy="round-robin", scrape_interval_s=60.0, connect_timeout_s=0.3) as r:
        for _ in range(2):
            assert httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5).status_code == 200
        assert r.replicas()[gone]["healthy"] is False
        assert alive.requests["/v1/completions"] == 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_replica_answering_503_is_ejected_and_the_next_choice_serves(stream: bool) -> None:
    # An engine whose core died answers 503 before doing any work; the scrape has not seen it yet (its
    # /metrics still answers), so the requests routed to it meanwhile go to the next choice.
    with stubs(2) as (dead, alive), router([dead, alive], policy="round-robin", scrape_interval_s=60.0) as r:
        dead.mode = "unavailable"
        for _ in range(4):
            answer = httpx.post(r.url + "/v1/completions", json={**PLAIN, "stream": stream}, timeout=5)
            assert answer.status_code == 200
        assert r.replicas()[url_of(dead)]["healthy"] is False
        assert alive.requests["/v1/completions"] == 4


def test_a_request_tried_on_a_second_replica_counts_once() -> None:
    with stubs(2) as (dead, alive), router([dead, alive], policy="round-robin", scrape_interval_s=60.0) as r:
        dead.mode = "unavailable"  # the first choice answers 503: the request goes to the next
        assert httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5).status_code == 200
        served = {"replica": url_of(alive), "decision": "next_in_turn", "outcome": "ok"}
        eventually(lambda: r.sample("moeslo_router_requests_total", **served) == 1, 5, "the request counted")
        counted = [s for m in r.registry.collect() if m.name == "moeslo_router_requests" for s in m.samples
                   if s.name.endswith("_total")]  # fmt: skip
        assert sum(s.value for s in counted) == 1, counted
        assert r.sample("moeslo_router_overhead_seconds_count") == 1
        assert r.sample("moeslo_router_ejections_total", replica=url_of(dead)) == 1  # where the failed try shows


def test_429_with_retry_after_when_every_replica_is_over_budget() -> None:
    busy = WAITING_TEXT.format(waiting=50)  # 50 x 256 assumed tokens / 4000 tok/s = 3.2 s predicted TTFT
    with stubs(2, metrics_text=busy) as upstreams, router(upstreams) as r:
        eventually(lambda: all(s["waiting"] == 50 for s in r.replicas().values()), 5, "the scrape")
        answer = httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5)
        assert answer.status_code == 429
        assert answer.headers["retry-after"] == "3"  # ceil(3.2 s - 0.5 s)
        error = answer.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", 429)
        assert error["retry_after_s"] == pytest.approx(2.7, abs=0.01)
        assert sum(s.requests["/v1/completions"] for s in upstreams) == 0
        labels = {"replica": "none", "decision": "all_over_budget", "outcome": "rejected"}
        eventually(lambda: r.sample("moeslo_router_requests_total", **labels) == 1, 5, "the refusal counted")


def test_whole_answer_requests_being_generated_do_not_hold_the_next_one_off() -> None:
    # Three 600-token prompts decoding for 2 s; the engine says none waits. Counted as unprefilled until they
    # finished, their 1,800 tokens put the next request over the 0.5 s objective: a 429 from an idle queue.
    running = [0]

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        running[0] += 1
        await asyncio.sleep(2.0)
        running[0] -= 1
        return web.json_response({"choices": [{"text": "done"}]})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=f"vllm:num_requests_waiting 0\nvllm:num_requests_running {running[0]}\n")

    def ask(index: int) -> int:
        body = {"prompt": f"{index:04d}" + "x" * 2400, "max_tokens": 200}  # 601 tokens, 4 characters each
        return httpx.post(r.url + "/v1/completions", json=body, timeout=10).status_code

    with serving(replica_app(generate, gets={"/metrics": metrics})) as replica, router([replica]) as r, \
            ThreadPoolExecutor(3) as pool:  # fmt: skip
        busy = [pool.submit(ask, i) for i in range(3)]
        eventually(lambda: running[0] == 3, 5, "three requests generating")
        time.sleep(0.3)  # scrapes after theirs
        assert ask(3) == 200
        assert (r.replicas()[replica]["waiting"], r.replicas()[replica]["pending_prefill_tokens"]) == (0, 0)
        assert [b.result() for b in busy] == [200] * 3


def test_queue_mode_holds_the_request_until_a_replica_fits() -> None:
    with stubs(1, metrics_text=WAITING_TEXT.format(waiting=50)) as (stub,), \
            router([stub], admission="queue", max_queue_s=5.0) as r:  # fmt: skip
        eventually(lambda: r.replicas()[url_of(stub)]["waiting"] == 50, 5, "the scrape")
        threading.Timer(0.3, lambda: setattr(stub, "metrics_text", WAITING_TEXT.format(waiting=0))).start()
        started = time.monotonic()
        answer = httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=10)
        assert answer.status_code == 200
        assert 0.25 < time.monotonic() - started < 4.0


def test_queue_mode_holds_no_request_that_waiting_cannot_bring_within_the_objective() -> None:
    # 2,000 prompt tokens at 2,000 tokens/s: 1 s even on an idle replica, so holding it only adds
    # the wait (the demo's throttled replicas held long prompts until the fault ended).
    long_prompt = {"prompt": [1] * 2000, "max_tokens": 1}
    with stubs(1, metrics_text=WAITING_TEXT.format(waiting=50)) as (stub,), \
            router([stub], admission="queue", max_queue_s=5.0, prefill_tokens_per_s=2000.0) as r:  # fmt: skip
        eventually(lambda: r.replicas()[url_of(stub)]["waiting"] == 50, 5, "the scrape")
        started = time.monotonic()
        answer = httpx.post(r.url + "/v1/completions", json=long_prompt, timeout=10)
        assert answer.status_code == 200
        assert time.monotonic() - started < 1.0
        assert stub.requests["/v1/completions"] == 1


async def _server_error(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"error": {"message": "the engine failed", "code": 500}}, status=500)


async def _html_error(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(status=500, text="<h1>it broke</h1>", content_type="text/html")  # the router's own 502


@pytest.mark.parametrize(("failing", "status"), [(_server_error, 500), (_html_error, 502)], ids=["json", "html"])
def test_a_replica_answering_every_request_with_a_server_error_is_ejected_after_five_in_a_row(failing: Handler,
                                                                                             status: int) -> None:
    # It fails at once, so it looks the least loaded of all; /health and /metrics still answer.
    with stubs(1) as (good,), serving(replica_app(failing)) as bad, \
            router([bad, url_of(good)], policy="round-robin", readmit_after=1000) as r:  # fmt: skip
        codes = [httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5).status_code for _ in range(14)]
        assert [c for c in codes if c != 200] == [status] * 5, codes  # then only the good replica's answers
        assert r.replicas()[bad]["healthy"] is False
        assert r.sample("moeslo_router_ejections_total", replica=bad) == 1
        assert good.requests["/v1/completions"] == 9


async def _stream_error(request: web.Request) -> web.StreamResponse:
    """As the engine and vLLM fail a streamed request after its headers: 200, an error event, then [DONE]."""
    await request.read()
    answer = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await answer.prepare(request)
    error = {"id": "cmpl-1", "error": {"message": "the engine could not complete request cmpl-1",
                                       "type": "server_error", "param": None, "code": 500}}  # fmt: skip
    await answer.write(b"data: " + json.dumps(error).encode() + b"\n\n")
    await answer.write(b"data: [DONE]\n\n")
    await answer.write_eof()
    return answer


def test_a_replica_failing_every_stream_inside_it_is_counted_so_and_ejected() -> None:
    """Counted ok, each such stream reset the server errors in a row: a replica failing every streamed request was
    never ejected, and looked the least loaded of all."""
    streamed = {**PLAIN, "stream": True}
    with stubs(1) as (good,), serving(replica_app(_stream_error)) as bad, \
            router([bad, url_of(good)], policy="round-robin", readmit_after=1000) as r:  # fmt: skip
        bodies = [httpx.post(r.url + "/v1/completions", json=streamed, timeout=5).text for _ in range(14)]
        assert sum('"error"' in body for body in bodies) == 5  # relayed as written, then only the good replica
        assert r.replicas()[bad]["healthy"] is False
        assert r.sample("moeslo_router_ejections_total", replica=bad) == 1
        assert r.sample("moeslo_router_requests_total", replica=bad, decision="next_in_turn",
                        outcome="upstream_status") == 5  # fmt: skip


async def _plain_unauthorized(request: web.Request) -> web.Response:
    await request.read()  # an auth sidecar or ingress in front of the engine answers in its own words
    return web.Response(status=401, text="Unauthorized", headers={"WWW-Authenticate": "Bearer"})


async def _garbled_json_too_large(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(status=413, text="{too large", content_type="application/json")


@pytest.mark.parametrize("failing", [_plain_unauthorized, _garbled_json_too_large], ids=["plain", "garbled_json"])
def test_a_replicas_client_error_is_relayed_as_it_wrote_it_and_never_ejects_it(failing: Handler) -> None:
    # A client error says the request was at fault, not the replica: one client must not eject it.
    with serving(replica_app(failing)) as replica, router([replica], readmit_after=1000) as r:
        expected = httpx.post(replica + "/v1/completions", json=PLAIN, timeout=5)
        answers = [httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5) for _ in range(7)]
        assert {(a.status_code, a.content) for a in answers} == {(expected.status_code, expected.content)}
        assert answers[0].headers.get("www-authenticate") == expected.headers.get("www-authenticate")
        assert r.replicas()[replica]["healthy"] is True
        assert r.sample("moeslo_router_ejections_total", replica=replica) == 0
        assert r.sample("moeslo_router_requests_total", replica=replica, decision="lowest_predicted_ttft",
                        outcome="upstream_status") == 7  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "status", "message"),
    [
        ("garbage_json", 502, "not the JSON it claims"),
        ("html_500", 502, "without a JSON error document"),
        ("truncated", 502, "broke the connection"),
        ("not_http", 502, "broke the connection"),
        ("hang", 504, "did not answer in time"),
    ],
)
def test_bad_upstream_answers_become_errors_and_the_router_carries_on(mode: str, status: int, message: str) -> None:
    with stubs(1) as (stub,), router([stub], upstream_timeout_s=0.5, readmit_after=1) as r:
        stub.mode = mode
        answer = httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5)
        assert answer.status_code == status
        error = answer.json()["error"]
        assert message in error["message"] and error["replica"] == url_of(stub)
        stub.mode = "ok"
        eventually(lambda: r.replicas()[url_of(stub)]["healthy"] is True, 5, "the replica back")
        assert httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5).status_code == 200


def test_bad_requests_and_unknown_routes_get_the_error_document() -> None:
    with stubs(1) as (stub,), router([stub]) as r:
        answer = httpx.post(r.url + "/v1/completions", content=b"{not json", timeout=5)
        assert answer.status_code == 400
        assert answer.json()["error"]["type"] == "invalid_request_error" and answer.json()["error"]["problems"]
        assert answer.json()["error"]["param"] is None  # OpenAI's field, null: the body as a whole is at fault
        deep = httpx.post(r.url + "/v1/completions", content=b"[" * 100_000 + b"]" * 100_000, timeout=5)
        assert deep.status_code == 400 and "nested too deeply" in deep.text  # it was a 500 (RecursionError)
        # Bodies the engine answers with a 400 reach it: the router's prefix hash must not fail on them first.
        relayed = [{"prompt": "\ud800" * 80, "max_tokens": 1},
                   {"prompt": [2**70, *range(40)], "max_tokens": 1},
                   {"messages": [{"role": "user", "content": "\ud800" * 80}], "max_tokens": 1}]  # fmt: skip
        for body in relayed:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            answer = httpx.post(r.url + path, content=json.dumps(body), timeout=5,
                                headers={"Content-Type": "application/json"})  # fmt: skip
            assert answer.status_code == 200, (body, answer.text)  # the stub answers everything
        wrong_method = httpx.get(r.url + "/v1/completions", timeout=5)  # a real route: 405 and Allow, as the engine
        assert (wrong_method.status_code, wrong_method.headers["Allow"]) == (405, "POST")
        assert wrong_method.json()["error"]["code"] == 405
        missing = httpx.get(r.url + "/v2/nothing", timeout=5)
        assert (missing.status_code, missing.json()["error"]["code"], missing.json()["error"]["param"]) == (404, 404,
                                                                                                          None)
        assert stub.requests["/v1/completions"] == 2 and stub.requests["/v1/chat/completions"] == 1
        # Each client request counts once: the two bodies refused here under no replica and no decision.
        assert r.sample("moeslo_router_requests_total", replica="none", decision="none",
                        outcome="invalid_request") == 2  # fmt: skip
        metrics = httpx.get(r.url + "/metrics", timeout=5).text
        assert "moeslo_router_requests_total" in metrics and "moeslo_router_replica_healthy" in metrics


def test_503_when_no_replica_can_take_the_request() -> None:
    with stubs(1) as (stub,), router([stub], readmit_after=1000) as r:
        stub.stop_in_thread()
        eventually(lambda: r.replicas()[url_of(stub)]["healthy"] is False, 5, "the scrape ejecting it")
        answer = httpx.post(r.url + "/v1/completions", json=PLAIN, timeout=5)
        assert answer.status_code == 503
        assert (answer.json()["error"]["type"], answer.json()["error"]["message"]) == ("service_unavailable_error",
                                                                                       "no healthy replica")
        assert answer.headers["retry-after"] == "1"
        assert httpx.get(r.url + "/health", timeout=5).status_code == 503
        assert httpx.get(r.url + "/v1/models", timeout=5).status_code == 503
        labels = {"replica": "none", "decision": "no_healthy_replica", "outcome": "unavailable"}
        eventually(lambda: r.sample("moeslo_router_requests_total", **labels) == 1, 5, "the refusal counted")


def test_the_cost_policy_sends_a_cached_prefix_back_to_the_replica_that_holds_it() -> None:
    shared = list(range(1000, 2008))  # 63 blocks of 16 tokens
    busy = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"stub\"} 8\n"
    with stubs(2) as pair, router(pair, policy="cost") as r:
        urls = [url_of(s) for s in pair]

        def served() -> dict[str, float]:
            return {u: r.sample("moeslo_router_requests_total", replica=u, decision="lowest_predicted_ttft",
                                outcome="ok") for u in urls}  # fmt: skip

        def sent_to(prompt: list[int]) -> str:
            before = served()
            answer = httpx.post(r.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=5)
            assert answer.status_code == 200
            eventually(lambda: sum(served().values()) == sum(before.values()) + 1, 5, "the request counted")
            return next(u for u, n in served().items() if n > before[u])

        holder = sent_to([*shared, 1, 2, 3, 4])
        other = next(u for u in urls if u != holder)
        pair[urls.index(holder)].metrics_text = busy  # the holder is now the busier replica
        eventually(lambda: r.replicas()[holder]["running"] == 8, 5, "the holder's batch scraped")
        assert sent_to(list(range(5000, 6012))) == other  # a cold prompt avoids the busier replica
        assert sent_to([*shared, 9, 9, 9, 9]) == holder  # its cached lead outweighs the batch
