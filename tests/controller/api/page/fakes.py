"""A fake Prometheus (range queries) and Alertmanager behind one httpx mock transport, and a runtime view."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import httpx

from controller.policy import Policy
from controller.runtime import PolicyRuntime

LAYERS = 4


@dataclass
class Upstream:
    """Answers ``/api/v1/query_range`` from fixed ratios and ``/api/v2/alerts`` from a list."""

    ttft_good: float = 0.97
    """Share of requests under the TTFT threshold (bucket le=0.5 over the count)."""
    itl_good: float = 0.995
    load_rps: float = 6.5
    alerts: list[dict[str, Any]] = field(default_factory=list)
    prometheus_down: bool = False
    alertmanager_down: bool = False
    queries: list[str] = field(default_factory=list)
    trickle: bool = False
    """Both servers answer 200 and then one byte a second, for a minute (each read within any timeout)."""
    requests_rps: dict[str, float] = field(default_factory=dict)
    """Instant queries of a request rate: requests/s by window (``"2h"``); other windows answer ``load_rps``."""
    unserved_rps: float = 0.0
    since_s: float = 0.0
    """Range queries have samples from this time on (a fleet that started then)."""
    delay_s: float = 0.0
    """How long every answer takes (a slow Prometheus or Alertmanager)."""
    """Requests/s ended before a first token (deadline, error), added to a rate that counts them."""

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle_async)

    async def handle_async(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(self.delay_s)
        if self.trickle:
            return httpx.Response(200, stream=_Trickle())
        return self.handle(request)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/api/v1/"):
            if self.prometheus_down:
                raise httpx.ConnectError("connection refused", request=request)
            return self._instant(request) if request.url.path == "/api/v1/query" else self._range(request)
        if request.url.path == "/api/v2/alerts":
            if self.alertmanager_down:
                raise httpx.ConnectError("connection refused", request=request)
            return httpx.Response(200, json=self.alerts)
        return httpx.Response(404, json={"status": "error", "error": "not found"})

    def _instant(self, request: httpx.Request) -> httpx.Response:
        """A request rate over the query's window for every model the query names."""
        query = parse_qs(request.content.decode())["query"][0]
        self.queries.append(query)
        window = re.findall(r"\[(\w+)\]", query)[-1]
        names = re.search(r'model_name=~?"([^"]*)"', query)
        models = names.group(1).replace("\\", "").split("|") if names else []
        rate = self.requests_rps.get(window, self.load_rps)
        rate += self.unserved_rps if "without_first_token" in query else 0.0
        result = [{"metric": {"model_name": m}, "value": [0, str(rate)]} for m in models]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    def _range(self, request: httpx.Request) -> httpx.Response:
        form = {k: v[0] for k, v in parse_qs(request.content.decode()).items()}
        query = form["query"]
        self.queries.append(query)
        start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
        times = [t for t in (start + i * step for i in range(int((end - start) // step) + 1)) if t >= self.since_s]

        def series(labels: dict[str, str], value: float) -> dict[str, Any]:
            return {"metric": labels, "values": [[t, str(value)] for t in times]}

        good = self.ttft_good if "time_to_first_token" in query else self.itl_good
        if "_bucket" in query:
            edge = "0.5" if "time_to_first_token" in query else "0.02"
            result = [series({"le": "0.1"}, 50.0 * good), series({"le": edge}, 100.0 * good),
                      series({"le": "+Inf"}, 100.0)]
        elif "_count" in query:
            result = [series({}, 100.0)]
        elif "request_success" in query:
            result = [series({}, self.load_rps)]
        elif "moe_layer_imbalance_cv" in query:
            result = [series({"layer": str(layer)}, 0.05 * (layer + 1)) for layer in range(LAYERS)]
        else:
            result = []
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": result}})


class _Trickle(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(60):
            yield b" "
            await asyncio.sleep(1.0)


def alert(policy: str, *, name: str = "MoesloTTFTBudgetBurn", severity: str = "page", summary: str = "burning") -> (
        dict[str, Any]):
    return {
        "labels": {"alertname": name, "policy": policy, "slo": "ttft", "severity": severity},
        "annotations": {"summary": summary},
        "startsAt": "2026-01-01T00:00:00Z",
        "status": {"state": "active"},
    }


class View:
    """The service's read surface with fixed runtimes."""

    def __init__(self, runtimes: dict[str, PolicyRuntime] | None = None) -> None:
        self.runtimes = runtimes or {}
        self.last_tick_at = datetime.now(UTC)
        self.leader = True

    @property
    def is_leader(self) -> bool:
        return self.leader

    def runtime(self, name: str) -> PolicyRuntime | None:
        return self.runtimes.get(name)

    def check_target(self, policy: Policy) -> list[str]:
        return []


def burning_runtime(*, stale: bool = False) -> PolicyRuntime:
    """A policy whose TTFT pages: 1h and 5m both burn above 14.4."""
    return PolicyRuntime(
        current_replicas=2, desired_replicas=4, stale=stale, observed_at=datetime.now(UTC),
        sli={"ttft_good_ratio": 0.8123, "itl_good_ratio": 0.9991, "ttft_p99_seconds": 0.91, "itl_p99_seconds": 0.017},
        error_budget_remaining={"ttft": -0.734, "itl": 0.4567},
        burn_rates={"ttft": {"5m": 18.77, "30m": 16.0, "1h": 15.2, "2h": 9.0, "6h": 5.0, "1d": 2.0, "3d": 0.8},
                    "itl": {"5m": 0.09, "1h": 0.1}},
        errors=["prometheus: slow <b>answer</b>"] if stale else [],
        seen={"request_rate_rps": 6.25, "queue_depth": 3.0},
        forecast={"model": "ets", "horizon_s": 120, "request_rate_rps": 7.5, "request_rate_lower_rps": 6.0,
                  "request_rate_upper_rps": 9.0, "sized_request_rate_rps": 9.0, "wape": 0.12, "coverage": 0.8,
                  "reliable": True, "in_use": True},
        decision={"action": "scale_up", "reasons": ["scale_up", "forecast"], "detail": "scale up 2 -> 4"},
    )
