"""A bad OpenTelemetry setting turns moeslo's vLLM OTel logger off with one line; vLLM keeps starting.

vLLM builds its stat loggers without a guard: an exception from the logger's constructor stopped
vLLM's start (``OTEL_METRIC_EXPORT_INTERVAL=0`` after the model had loaded). Runs in the vLLM venv.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.vllm_server import vllm_python

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
BUILD = """
import types
from exporters.vllm_otel import GenAiOtelStatLogger
config = types.SimpleNamespace(model_config=types.SimpleNamespace(served_model_name=["m"], model="m"))
print("sink:", GenAiOtelStatLogger(config).sink)
"""


def _build_logger(**settings: str) -> subprocess.CompletedProcess[str]:
    """Build the logger in the vLLM venv with these OTel settings (the plugin switched on)."""
    python = vllm_python()
    if python is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    env = {**os.environ, "MOESLO_VLLM_OTEL": "1", **settings}
    return subprocess.run([str(python), "-c", BUILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180, check=False)  # fmt: skip


def test_a_bad_otel_setting_turns_the_logger_off_without_stopping_vllm() -> None:
    done = _build_logger(OTEL_METRIC_EXPORT_INTERVAL="0")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sink: None" in done.stdout
    assert "moeslo OTel stat logger off: interval value 0.0 is invalid" in done.stderr
    assert "OTEL_METRIC_EXPORT_INTERVAL" in done.stderr


def test_metrics_exporter_none_turns_the_logger_off() -> None:
    """``OTEL_METRICS_EXPORTER=none`` (the standard switch) builds no OTLP exporter: nothing is sent anywhere."""
    done = _build_logger(OTEL_METRICS_EXPORTER="none")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sink: None" in done.stdout
