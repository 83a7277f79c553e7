"""How one streamed request is read: error events, usage-only chunks, a stream cut inside an event."""

from __future__ import annotations

import asyncio
import json

import httpx

from harness.loadgen import LoadRequest, RequestRecord, send_request, summarize

TOKEN = b'data: {"choices":[{"index":0,"text":"t","finish_reason":null}]}\n\n'
LAST = b'data: {"choices":[{"index":0,"text":"t","finish_reason":"length"}]}\n\n'
DONE = b"data: [DONE]\n\n"


def _read(body: bytes) -> RequestRecord:
    transport = httpx.MockTransport(lambda _request: httpx.Response(200, content=body))

    async def go() -> RequestRecord:
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            request = LoadRequest(arrival_s=0.0, prompt_tokens=4, max_tokens=8)
            return await send_request(client, request, [1, 2, 3, 4], 0.0, None, 0.0)

    return asyncio.run(go())


def _error(error: object) -> bytes:
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


def test_a_usage_only_chunk_is_no_token() -> None:
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}\n\n'
    record = _read(TOKEN + usage + LAST + DONE)
    assert record.ok and record.output_tokens == 2 and len(record.itls_s) == 1
    assert record.finish_reason == "length"


def test_a_stream_cut_inside_an_event_keeps_the_routers_error() -> None:
    half = b'data: {"choices":[{"ind\n\n'  # what the router sends before its error event when a replica breaks
    record = _read(TOKEN + half + _error({"message": "replica http://a broke", "code": 502}) + DONE)
    assert not record.ok and record.error == "replica http://a broke" and record.output_tokens == 1


def test_an_event_that_does_not_parse_fails_the_request() -> None:
    record = _read(TOKEN + b"data: {not json\n\n" + LAST + DONE)
    assert not record.ok and record.error is not None and record.error.startswith("malformed event")


def test_an_error_given_as_a_string_is_kept() -> None:
    record = _read(TOKEN + _error("the engine died") + DONE)
    assert not record.ok and record.error == "the engine died"


def test_a_failed_request_is_not_within_the_objectives_whatever_its_latencies() -> None:
    failed = RequestRecord(arrival_s=0.0, prompt_tokens=4, max_tokens=8, status=200, ttft_s=0.05,
                           itls_s=[0.01, 0.01], output_tokens=3, error="the engine could not complete the request")
    served = RequestRecord(arrival_s=0.0, prompt_tokens=4, max_tokens=8, status=200, ttft_s=0.05,
                           itls_s=[0.01, 0.01], output_tokens=3)  # fmt: skip
    assert summarize([failed, served], wall_s=1.0)["within_objectives"] == 0.5
