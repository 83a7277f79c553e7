"""``--port 0``: each server says the port it listens on (the system's pick), and listens there."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from harness.processes import moeslo_command, stop_process


def test_an_address_port_zero_cannot_be_bound_on_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["controller", "serve", "--db", str(tmp_path / "c.db"), "--host", "203.0.113.1",
                                      "--port", "0"])  # an address this machine does not have
    assert result.exit_code == 2 and "cannot listen on 203.0.113.1:0" in result.output


def _said_port(argv: list[str], cwd: Path, timeout_s: float = 60.0) -> tuple[subprocess.Popen[str], int]:
    """Start ``argv``; the port in the first line it prints that names an ``http://host:port`` address."""
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found: list[int] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if match := re.search(r"http://127\.0\.0\.1:(\d+)", line):
                found.append(int(match.group(1)))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not found:
        stop_process(process, 10)
        pytest.fail(f"{argv} named no address within {timeout_s:g} s")
    return process, found[0]


def _health(port: int, timeout_s: float = 30.0) -> int:
    """The status ``/health`` answers on ``port`` (0: nothing answered)."""
    with httpx.Client(timeout=2.0, transport=httpx.HTTPTransport(retries=0)) as client:
        for _ in range(int(timeout_s * 4)):
            try:
                return client.get(f"http://127.0.0.1:{port}/health").status_code
            except httpx.TransportError:
                threading.Event().wait(0.25)
    return 0


@pytest.mark.parametrize(
    "args",
    [["route", "--replicas", "http://127.0.0.1:9", "--port", "0"],
     ["controller", "serve", "--db", "{tmp}/c.db", "--port", "0"]],
    ids=["route", "controller"],
)
def test_a_server_on_port_zero_names_the_port_it_listens_on(tmp_path: Path, args: list[str]) -> None:
    """Each said ``http://127.0.0.1:0`` and listened on a port it never named."""
    process, port = _said_port(moeslo_command(*(a.format(tmp=tmp_path) for a in args)), tmp_path)
    try:
        assert port != 0
        assert _health(port) in (200, 503)  # the router without a replica up is unhealthy, and says so
    finally:
        stop_process(process, 10)


def test_serve_on_port_zero_names_and_exports_the_port_it_listens_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """``moeslo serve --port 0`` said port 0, and its OpenTelemetry ``server.port`` was 0."""
    import uvicorn

    import exporters.app

    seen: dict[str, Any] = {}

    def build_stack(options: Any) -> Any:
        seen["options"] = options
        blocks = SimpleNamespace(num_blocks=4, block_size=16)
        return SimpleNamespace(app=object(), engine=SimpleNamespace(blocks=blocks, pid=1, max_model_len=64,
                                                                    context_note=None))

    def run(server: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
        assert sockets is not None
        seen["bound"], seen["port"] = sockets[0].getsockname()[1], server.config.port
        server.started = True
        sockets[0].close()

    monkeypatch.setattr(exporters.app, "build_stack", build_stack)
    monkeypatch.setattr(uvicorn.Server, "run", run)
    result = CliRunner().invoke(app, ["serve", "--checkpoint", ".", "--port", "0"])
    assert result.exit_code == 0, result.output
    bound = seen["bound"]
    assert bound != 0 and seen["port"] == bound and seen["options"].port == bound
    assert f"on http://127.0.0.1:{bound} " in result.output


def test_a_prefill_budget_below_the_batch_limit_is_refused_as_vllm_refuses_it() -> None:
    """Each running sequence takes a token of every step's budget: 32 tokens ran 32 sequences, never 128."""
    result = CliRunner().invoke(app, ["serve", "--checkpoint", ".", "--port", "0", "--max-num-batched-tokens", "32"])
    assert result.exit_code == 2
    assert "max_num_batched_tokens (32) must be at least max_num_seqs (128)" in " ".join(result.output.split())
