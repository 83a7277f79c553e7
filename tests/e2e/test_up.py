"""`moeslo up --duration 60` runs to the end, exits 0 and prints its summary (as CI runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_up_runs_the_whole_loop_and_summarizes(tmp_path: Path) -> None:
    out = tmp_path / "up"
    result = subprocess.run(
        [sys.executable, "-c", "from cli.main import app; app()", "up", "--duration", "60", "--out", str(out),
         "--no-live", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=420, check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary == json.loads((out / "summary.json").read_text())
    assert summary["requests"] > 0 and summary["ok"] > 0, summary["events"]
    assert summary["failed"] == 0, summary
    assert summary["ttft_p99_s"] is not None and summary["itl_p99_s"] is not None
    # The controller started the first replica itself, and rebalanced the skewed experts live (``decisions``
    # counts only what it carried out; a failed scale-up or rebalance is in ``decisions_not_applied``).
    assert any(k.startswith("scale_up") for k in summary["decisions"]), summary["decisions"]
    assert summary["imbalance_cv_max_first"] > 0.15
    assert summary["decisions"].get("rebalance:rebalance", 0) >= 1, summary["decisions"]
    assert any("rebalance:rebalance applied" in line for line in summary["events"]), summary["events"]
    assert (out / "moeslo-up.png").stat().st_size > 10_000
    assert any("status page: http://127.0.0.1:" in line for line in summary["events"]), summary["events"]
    # The load went through the entry router, which read its replicas from the controller.
    assert any("router: http://127.0.0.1:" in line and "takes requests" in line for line in summary["events"])
    routed = summary["router_requests"]
    assert sum(n for key, n in routed.items() if key.endswith(" ok")) == summary["ok"], routed
