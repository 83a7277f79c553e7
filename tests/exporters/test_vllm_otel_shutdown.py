"""A collector that accepts and never answers holds vLLM's exit at most a few seconds.

vLLM never shuts its stat loggers down, so the exporter's last flush ran in the OpenTelemetry SDK's
exit hook, which waits up to 30 s: vLLM took 10 to 25 s to exit. Runs in the vLLM venv.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.vllm_server import vllm_python
from tests.exporters.otlp_receiver import silent_collector as silent_endpoint

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
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
    with silent_endpoint() as url:
        yield url


def run_in_vllm(script: str, endpoint: str, interval_ms: int) -> tuple[dict[str, float], str]:
    """``script`` in the vLLM venv, exporting to ``endpoint``: the times it printed, and its stderr."""
    python = vllm_python()
    if python is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MOESLO_VLLM_OTEL": "1",
           "OTEL_METRIC_EXPORT_INTERVAL": str(interval_ms), "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}  # fmt: skip
    done = subprocess.run([str(python), "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.fail(done.stderr[-2000:])
    found = re.findall(r"^(shutdown_s|exit_s) ([\d.]+)$", done.stdout, re.M)
    return {name: float(value) for name, value in found}, done.stderr


def test_a_silent_collector_holds_shutdown_and_exit_at_most_a_few_seconds(silent_collector: str) -> None:
    times, stderr = run_in_vllm(SCRIPT, silent_collector, interval_ms=500)
    assert set(times) == {"shutdown_s", "exit_s"}, times
    # Each waits for its exporter a while (the collector might answer), then drops what it did not take.
    assert 1.0 <= times["shutdown_s"] <= A_FEW_S and times["exit_s"] <= A_FEW_S, times
    assert stderr.count("the collector did not take the last metrics within") == 2, stderr[-2000:]


DATA_PARALLEL_SCRIPT = """
import atexit, time, types
exit_started = []
atexit.register(lambda: print(f"exit_s {time.monotonic() - exit_started[0]:.2f}", flush=True))  # runs last
from exporters.vllm_otel import GenAiOtelStatLogger
config = types.SimpleNamespace(model_config=types.SimpleNamespace(served_model_name=["m"], model="m"))
engines = [GenAiOtelStatLogger(config, i) for i in range(4)]  # vLLM builds one logger per engine
for stat_logger in engines:
    stat_logger.sink.record_first_tokens([0.1])
exit_started.append(time.monotonic())
"""


def test_the_exit_bound_holds_for_every_engine_together(silent_collector: str) -> None:
    """Each engine's logger had its own 3 s exit hook, run in turn: four engines held vLLM's exit 12 s."""
    times, stderr = run_in_vllm(DATA_PARALLEL_SCRIPT, silent_collector, interval_ms=60_000)
    assert set(times) == {"exit_s"} and times["exit_s"] <= A_FEW_S, times
    assert stderr.count("the collector did not take the last metrics within") == 1, stderr[-2000:]
