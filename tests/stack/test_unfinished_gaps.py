"""A request still streaming when the load ends keeps the token gaps it streamed, in the record and the shares."""

from __future__ import annotations

import asyncio
import contextlib
import json

from harness.loadgen import LoadRequest
from stack.load import UNFINISHED_ERROR, drive
from stack.report import summarize
from stack.state import StackOptions, StackState

STREAMED = 6
GAP_S = 0.05


async def _stalls_after_streaming(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An engine that streams six tokens 50 ms apart (each gap over the 20 ms objective), then stalls (a fault)."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for _ in range(STREAMED):
        event = ("data: " + json.dumps({"choices": [{"text": "x", "finish_reason": None}]}) + "\n\n").encode()
        writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        await writer.drain()
        await asyncio.sleep(GAP_S)
    await asyncio.sleep(60)


def test_a_request_in_flight_at_the_end_keeps_the_gaps_it_streamed() -> None:
    """The unfinished record was a new one, without the five slow gaps the stream had shown: the gap shares left
    out the slowest streams, those stuck in the fault, and read better than the controller's ITL SLI."""

    async def scenario() -> StackState:
        server = await asyncio.start_server(_stalls_after_streaming, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        state = StackState(options=StackOptions(duration_s=1.0, inject_slowdown=False))
        state.load_started_s = state.elapsed()
        driving = asyncio.create_task(drive(state, [LoadRequest(arrival_s=0.0, prompt_tokens=4, max_tokens=32)],
                                            100, url))  # fmt: skip
        await asyncio.sleep(STREAMED * GAP_S + 0.5)  # the load ends: the drain ran out, Ctrl-C, SIGTERM
        driving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driving
        server.close()
        return state

    state = asyncio.run(scenario())
    (record,) = state.records
    assert record.error == UNFINISHED_ERROR
    assert record.ttft_s is not None and len(record.itls_s) == STREAMED - 1
    summary = summarize(state)
    assert summary["itl_good_ratio"] == 0.0 and summary["ttft_good_ratio"] == 0.0
