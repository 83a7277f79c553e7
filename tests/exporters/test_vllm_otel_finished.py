"""vLLM's finished-request stats in the engine's terms: requests aborted before they were scheduled, or before
their first token, carry vLLM's unset timestamps (0) into their intervals.  Runs in the vLLM venv."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.vllm_server import vllm_python

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
# vLLM's own arithmetic (v1/metrics/stats.py): queued = scheduled_ts - queued_ts, prefill = first_token_ts -
# scheduled_ts, decode = last_token_ts - first_token_ts, with every unset timestamp 0.
SCRIPT = """
import json, types
from exporters.vllm_otel import finished_from_vllm
def fin(queued_ts, scheduled_ts, first_token_ts, last_token_ts, e2e):
    return types.SimpleNamespace(request_id="r", finish_reason="ABORT", num_prompt_tokens=10,
        num_generation_tokens=0, e2e_latency=e2e, queued_time=scheduled_ts - queued_ts,
        prefill_time=first_token_ts - scheduled_ts, decode_time=last_token_ts - first_token_ts,
        mean_time_per_output_token=0)
cases = [fin(5000.0, 0.0, 0.0, 0.0, 2.5), fin(5000.0, 5001.0, 0.0, 0.0, 3.0), fin(5000.0, 5000.5, 5000.7, 5001.7, 1.8)]
print(json.dumps([[s.queue_s, s.prefill_s, s.decode_s] for s in map(finished_from_vllm, cases)]))
"""


def test_requests_aborted_before_schedule_or_first_token_get_no_negative_intervals() -> None:
    python = vllm_python()
    if python is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    done = subprocess.run([str(python), "-c", SCRIPT], cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    never_scheduled, no_first_token, served = json.loads(done.stdout.strip().splitlines()[-1])
    assert never_scheduled == [2.5, 0.0, 0.0]  # waited its whole life
    assert no_first_token == [1.0, 0.0, 0.0]
    assert served == pytest.approx([0.5, 0.2, 1.0])
