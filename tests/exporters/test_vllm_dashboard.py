"""vLLM's own example Grafana dashboard, unchanged, against our engine: a real Prometheus scrapes the engine
and every PromQL expression of every panel must return data.

The dashboard is vLLM's ``examples/observability/prometheus_grafana/grafana.json`` (Apache-2.0; checked at
vLLM commit 4b5c627c23e6690b8987100d1cbf78e34ac14bf9: 12 panels, 27 expressions), read from
the shared data folder (``vllm-dashboard/grafana.json``); the test skips where it or the ``prometheus``
binary is absent.  Grafana's variables get what Grafana would give them here: ``$model_name`` our model,
``$__rate_interval`` and friends a window that covers the whole run.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.server import ServerThread
from exporters.app import ServeOptions, build_stack
from harness.monitoring import prometheus_command, scrape_config
from harness.processes import free_port, log_tail, start_process, stop_process
from tests.conftest import shared_data

pytestmark = pytest.mark.integration

MODEL = "tiny-moe"
WINDOW = "1m"
"""Every range variable: longer than the run, so a rate sees all of it."""
VARIABLES = {"model_name": MODEL, "__rate_interval": WINDOW, "__interval": WINDOW, "__range": WINDOW,
             "__range_s": "60", "__interval_ms": "60000"}


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(panel title, its PromQL expressions with Grafana's variables filled in), panels in rows included."""
    panels = list(dashboard.get("panels", []))
    for row in list(panels):
        panels += row.get("panels", [])
    found = []
    for panel in panels:
        exprs = [t["expr"] for t in panel.get("targets", []) if t.get("expr") and not t.get("hide")]
        if exprs:
            found.append((panel["title"], [substitute(e) for e in exprs]))
    return found


def substitute(expr: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in VARIABLES:
            raise AssertionError(f"unknown Grafana variable ${name} in {expr!r}")
        return VARIABLES[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", value, expr)


def test_substitute_fills_grafana_variables() -> None:
    got = substitute('rate(x{model_name="$model_name"}[$__rate_interval]) / ${model_name}')
    assert got == f'rate(x{{model_name="{MODEL}"}}[{WINDOW}]) / {MODEL}'
    with pytest.raises(AssertionError, match="unknown"):
        substitute("x[$nope]")


def _query(prom: httpx.Client, promql: str) -> list[dict[str, Any]]:
    resp = prom.get("/api/v1/query", params={"query": promql})
    resp.raise_for_status()
    return resp.json()["data"]["result"]  # type: ignore[no-any-return]


def _has_data(result: list[dict[str, Any]]) -> bool:
    """At least one series with a number (a histogram quantile of nothing is NaN)."""
    return any(not math.isnan(float(series["value"][1])) for series in result)


def _wait_for_scrape(prom: httpx.Client, promql: str, proc: Any, log_path: Path, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log_tail(log_path)
        try:
            if _query(prom, promql):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"Prometheus never returned {promql}")


def test_every_panel_of_vllms_dashboard_returns_data(tiny_checkpoint: Path, tmp_path: Path) -> None:
    panels = dashboard_queries(json.loads(shared_data("vllm-dashboard", "grafana.json").read_text()))
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus binary not installed (apt-get install prometheus)")
    port, prom_port = free_port(), free_port()
    stack = build_stack(ServeOptions(checkpoint=tiny_checkpoint, model_name=MODEL, kv_cache_mb=1.0))
    server = ServerThread(stack.app, port=port).start()
    log_path = tmp_path / "prometheus.log"
    config = scrape_config({"moeslo-engine": [f"127.0.0.1:{port}"]}, interval_s=1.0)
    proc = start_process(prometheus_command(binary, tmp_path, port=prom_port, config=config), log_path=log_path)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as engine, \
                httpx.Client(base_url=f"http://127.0.0.1:{prom_port}", timeout=5) as prom:

            def send(n: int) -> None:
                for i in range(n):
                    body = {"prompt": f"dashboard {i} " * (i + 1), "max_tokens": 3 + i, "ignore_eos": True}
                    assert engine.post("/v1/completions", json=body).status_code == 200

            # Requests before and after a scrape, so every counter's series exists and then grows (a rate sees it).
            send(2)
            _wait_for_scrape(prom, f'vllm:request_success_total{{model_name="{MODEL}"}}', proc, log_path)
            send(4)
            time.sleep(2.5)  # two more scrapes
            empty = {title: [e for e in exprs if not _has_data(_query(prom, e))] for title, exprs in panels}
    finally:
        stop_process(proc, 10.0)
        server.stop()
    missing = {title: exprs for title, exprs in empty.items() if exprs}
    print(f"vLLM dashboard: {len(panels) - len(missing)} of {len(panels)} panels return data")
    assert len(panels) >= 12 and not missing, missing
