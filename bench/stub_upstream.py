"""A stub OpenAI-style upstream on 127.0.0.1 (raw asyncio HTTP/1.1): the router's benchmark and tests aim at it.

Cheap on purpose (no framework), so a benchmark measures the proxy, not the
stub.  ``mode`` picks the behaviour of ``POST /v1/completions`` and
``/v1/chat/completions`` and may change while it runs:

* ``ok``: a JSON completion, or (``"stream": true``) ``stream_chunks`` as SSE, chunked, each after
  ``chunk_delay_s``;
* ``die_mid_stream``: streams send the headers and the first two chunks, then the connection drops;
* ``garbage_json``: 200, ``application/json``, a body that is not JSON;
* ``truncated``: a Content-Length the body never reaches, then the connection drops;
* ``not_http``: a line that is not HTTP, then the connection drops;
* ``html_500``: a 500 with an HTML body;
* ``unavailable``: a 503 with an OpenAI-style error (an engine whose core died answers so);
* ``hang``: reads the request and never answers (a client that goes away counts in ``peer_closed``).

``GET /metrics`` serves ``metrics_text`` (after ``metrics_delay_s``); ``/health`` ``health_status`` (200; a replica
whose engine died answers 503 while its API process lives on); ``/v1/models`` a one-model list.
``peer_closed`` counts requests whose client went away before the end (slow streams, ``hang``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections import Counter
from http import HTTPStatus
from typing import Any

COMPLETION = json.dumps({
    "id": "cmpl-stub", "object": "text_completion", "created": 0, "model": "stub",
    "choices": [{"index": 0, "text": " ok", "logprobs": None, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
}).encode()  # fmt: skip
HTML = b"<h1>it broke</h1>\n"
UNAVAILABLE = json.dumps({"error": {"message": "the engine core process exited with status -9",
                                    "type": "service_unavailable_error", "param": None, "code": 503}}).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": "stub", "object": "model", "owned_by": "moeslo"}]}).encode()
DEFAULT_CHUNKS = (
    *(f'data: {{"id":"cmpl-stub","choices":[{{"index":0,"text":"t{i}","finish_reason":null}}]}}\n\n'.encode()
      for i in range(8)),
    b"data: [DONE]\n\n",
)  # fmt: skip


def _head(status: str, content_type: str, length: int | None) -> bytes:
    size = f"content-length: {length}\r\n" if length is not None else "transfer-encoding: chunked\r\n"
    return f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n{size}\r\n".encode()


class StubUpstream:
    def __init__(self, *, mode: str = "ok", metrics_text: str = "", stream_chunks: tuple[bytes, ...] = DEFAULT_CHUNKS,
                 chunk_delay_s: float = 0.0, metrics_delay_s: float = 0.0,
                 health_status: int = 200) -> None:  # fmt: skip
        self.mode = mode
        self.health_status = health_status
        self.metrics_delay_s = metrics_delay_s
        self.metrics_text = metrics_text
        self.stream_chunks = stream_chunks
        self.chunk_delay_s = chunk_delay_s
        self.requests: Counter[str] = Counter()
        self.peer_closed = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._closing = False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:  # accepted just before the stop, handled just after: it must not outlive the loop
            writer.transport.abort()
            return
        self._writers.add(writer)
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                method, path, _ = line.decode().split(" ", 2)
                length = 0
                stream = False
                while (header := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                if body and b'"stream": true' in body.replace(b'"stream":true', b'"stream": true'):
                    stream = True
                self.requests[path] += 1
                if not await self._answer(method, path, stream, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            if task is not None:
                self._handlers.discard(task)
            self._writers.discard(writer)
            with contextlib.suppress(ConnectionError, RuntimeError):
                writer.close()

    async def _answer(self, method: str, path: str, stream: bool, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:  # fmt: skip
        """Write the answer; False when the connection is to be dropped."""
        if method == "GET" and path in ("/metrics", "/health", "/v1/models"):
            if path == "/metrics" and self.metrics_delay_s:
                await asyncio.sleep(self.metrics_delay_s)
            body = {"/metrics": self.metrics_text.encode(), "/health": b'{"status":"ok"}', "/v1/models": MODELS}[path]
            code = self.health_status if path == "/health" else 200
            status = f"{code} {HTTPStatus(code).phrase}"
            writer.write(_head(status, "text/plain" if path == "/metrics" else "application/json", len(body)) + body)
            await writer.drain()
            return True
        if path not in ("/v1/completions", "/v1/chat/completions"):
            body = b'{"error":{"message":"not found","type":"NotFoundError","code":404}}'
            writer.write(_head("404 Not Found", "application/json", len(body)) + body)
            await writer.drain()
            return True
        return await self._completion(stream, reader, writer)

    async def _completion(self, stream: bool, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        mode = self.mode
        if mode == "hang":
            await reader.read()  # until the client goes away
            self.peer_closed += 1
            return False
        if mode in ("ok", "die_mid_stream") and stream:
            return await self._stream(reader, writer, die=mode == "die_mid_stream")
        canned = {
            "ok": _head("200 OK", "application/json", len(COMPLETION)) + COMPLETION,
            "die_mid_stream": _head("200 OK", "application/json", len(COMPLETION)) + COMPLETION,
            "garbage_json": _head("200 OK", "application/json", 9) + b"not json{",
            "truncated": _head("200 OK", "application/json", 100) + b'{"id": "cm',
            "not_http": b"HELLO THERE\r\n",
            "html_500": _head("500 Internal Server Error", "text/html", len(HTML)) + HTML,
            "unavailable": _head("503 Service Unavailable", "application/json", len(UNAVAILABLE)) + UNAVAILABLE,
        }[mode]
        writer.write(canned)
        await writer.drain()
        return mode in ("ok", "die_mid_stream", "garbage_json", "html_500", "unavailable")

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, die: bool) -> bool:
        writer.write(_head("200 OK", "text/event-stream", None))
        for index, chunk in enumerate(self.stream_chunks):
            if die and index == 2:
                writer.transport.abort()
                return False
            if self.chunk_delay_s:
                try:  # the wait doubles as a watch on the client: EOF means it went away
                    if await asyncio.wait_for(reader.read(1), self.chunk_delay_s) == b"":
                        self.peer_closed += 1
                        return False
                except TimeoutError:
                    pass
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    # ------------------------------------------------------------------ running it

    async def start(self, port: int = 0) -> int:
        self._closing = False
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self._server = await asyncio.start_server(self._handle, sock=sock, backlog=1024)
        self.port = sock.getsockname()[1]
        return self.port

    def start_in_thread(self, port: int = 0) -> int:
        """Serve from a daemon thread with its own loop; returns the port."""
        ready = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.start(port))
            ready.set()
            loop.run_forever()

        threading.Thread(target=run, name="stub-upstream", daemon=True).start()
        if not ready.wait(10):
            raise RuntimeError("the stub upstream did not start")
        return self.port

    def stop_in_thread(self) -> None:
        """Close the listening socket and every connection (as a replica that dies does)."""
        loop = self._loop
        if loop is None or self._server is None:
            return
        server = self._server

        async def close() -> None:
            self._closing = True
            server.close()
            await asyncio.sleep(0.05)  # connections accepted before the close run their handlers, which see _closing
            for writer in list(self._writers):
                writer.transport.abort()
            # Handlers still waiting (a slow /metrics, a hanging completion) end with the loop, not after it.
            for handler in list(self._handlers):
                handler.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._loop = self._server = None


def main() -> None:
    """``python -m bench.stub_upstream PORT``: serve in the foreground (the benchmark's own process)."""
    import sys

    async def serve() -> None:
        stub = StubUpstream()
        await stub.start(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
        print(stub.port, flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()


__all__ = ["COMPLETION", "DEFAULT_CHUNKS", "StubUpstream"]
