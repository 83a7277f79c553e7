"""A collector that accepts and never answers holds vLLM's exit at most a few seconds.

vLLM never shuts its stat loggers down, so the exporter's last flush ran in the OpenTelemetry SDK's
exit hook, which waits up to 30 s: vLLM took 10 to 25 s to exit. Runs in the vLLM venv.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.vllm_server import vllm_python

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
PORTS = range(18200, 18300)
A_FEW_S = 5.0
SCRIPT = """
import atexit, time, types
exit_started = []
atexit.register(lambda: print(f"exit_s {time.monotonic() - exit_started[0]:.2f}", flush=True))  # runs last
from exporters.vllm_otel import GenAiOtelStatLogger
config = types.SimpleNamespace(model_config=types.SimpleNamespace(served_model_name=["m"], model="m"))
told, left = GenAiOtelStatLogger(config, 0), GenAiOtelStatLogger(config, 1)
for stat_logger in (told, left):
    stat_logger.sink.record_first_tokens([0.1, 0.2])
time.sleep(1.0)  # a periodic export is in flight, waiting on the collector
started = time.monotonic()
told.shutdown()
print(f"shutdown_s {time.monotonic() - started:.2f}", flush=True)
exit_started.append(time.monotonic())  # the other logger's exporter stops at exit
"""


@pytest.fixture
def silent_collector() -> Iterator[str]:
    """An OTLP endpoint on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    for port in PORTS:
        try:
            server.bind(("127.0.0.1", port))
            break
        except OSError:
            continue
    else:
        pytest.skip(f"no free port in {PORTS}")
    server.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        for conn in held:
            conn.close()


def test_a_silent_collector_holds_shutdown_and_exit_at_most_a_few_seconds(silent_collector: str) -> None:
    python = vllm_python()
    if python is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MOESLO_VLLM_OTEL": "1", "OTEL_METRIC_EXPORT_INTERVAL": "500",
           "OTEL_EXPORTER_OTLP_ENDPOINT": silent_collector}  # fmt: skip
    done = subprocess.run([str(python), "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.findall(r"^(shutdown_s|exit_s) ([\d.]+)$", done.stdout, re.M)
    times = {name: float(value) for name, value in found}
    assert set(times) == {"shutdown_s", "exit_s"}, done.stdout
    # Each waits for its exporter a while (the collector might answer), then drops what it did not take.
    assert 1.0 <= times["shutdown_s"] <= A_FEW_S and times["exit_s"] <= A_FEW_S, times
    assert done.stderr.count("the collector did not take the last metrics within") == 2, done.stderr[-2000:]
