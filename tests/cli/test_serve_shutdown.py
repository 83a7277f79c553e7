"""``moeslo serve --shutdown-timeout``: how long a SIGTERM lets the requests in flight finish (vLLM's flag), and
what those still running then get: an error, not a cut connection."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from harness.processes import free_port, moeslo_command, stop_process

MAX_TOKENS = 400


def _serve(checkpoint: Path, port: int, shutdown_timeout: int) -> subprocess.Popen[bytes]:
    argv = moeslo_command("serve", "--checkpoint", str(checkpoint), "--port", str(port), "--model-name", "tiny-moe",
                          "--shutdown-timeout", str(shutdown_timeout))  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return process
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    stop_process(process, 10)
    pytest.fail(f"moeslo serve on port {port} did not become healthy")


def _stream_through_sigterm(process: subprocess.Popen[bytes], port: int) -> tuple[list[dict], str | None]:
    """The chunks of a streamed completion during which ``process`` gets SIGTERM, and how the stream broke."""
    body = {"model": "tiny-moe", "prompt": "hello", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    chunks: list[dict] = []
    try:
        with httpx.Client(timeout=60) as client, client.stream(
            "POST", f"http://127.0.0.1:{port}/v1/completions", json=body
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[len("data: ") :]))
                    if len(chunks) == 1:
                        process.send_signal(signal.SIGTERM)
    except httpx.HTTPError as exc:
        return chunks, type(exc).__name__
    return chunks, None


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("shutdown_timeout", [0, 30])
def test_a_sigterm_lets_requests_in_flight_finish_within_the_shutdown_timeout(
    tiny_checkpoint: Path, shutdown_timeout: int
) -> None:
    port = free_port()
    process = _serve(tiny_checkpoint, port, shutdown_timeout)
    try:
        chunks, broke = _stream_through_sigterm(process, port)
        assert process.wait(timeout=60) is not None
    finally:
        stop_process(process, 10)
    completed = bool(chunks) and (chunks[-1].get("usage") or {}).get("completion_tokens") == MAX_TOKENS
    assert broke is None, chunks[-1:]  # the stream ends as a stream does, never cut
    if shutdown_timeout:
        assert completed, chunks[-1:]
    else:  # 0: aborted at once, as vLLM's 0, and the client told why
        assert not completed and len(chunks) < MAX_TOKENS
        assert chunks[-1]["error"]["code"] == 503, chunks[-1:]


def _catches_sigterm(pid: int) -> bool:
    caught = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.integration
@pytest.mark.slow
def test_a_sigterm_while_the_model_loads_ends_the_server(tiny_checkpoint: Path) -> None:
    """A container's PID 1 ignores a signal it has no handler for: before uvicorn's, SIGTERM while the engine core
    loaded did nothing there, and a pod removed then waited out its grace period.  The handler is in from the
    start (checked while the core loads, before the port opens), and the server ends on it, core included."""
    port = free_port()
    argv = moeslo_command("serve", "--checkpoint", str(tiny_checkpoint), "--port", str(port))
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not psutil.Process(process.pid).children() and time.monotonic() < deadline:
            time.sleep(0.01)  # the engine core starts: the model loads from here until the port opens
        cores = psutil.Process(process.pid).children()
        assert cores and not _listening(port), "the core did not start, or the server was up before it was seen"
        assert _catches_sigterm(process.pid)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 128 + signal.SIGTERM
        _gone, alive = psutil.wait_procs(cores, timeout=10)
        assert not alive
    finally:
        stop_process(process, 10)
