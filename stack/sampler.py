"""Each look at the running stack: client latencies, expert imbalance, the controller's forecast and
decisions, alerts firing and pages delivered."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np

from harness.webhook import WebhookReceiver
from stack.report import recent_requests
from stack.state import Sample, StackState

__all__ = ["Sampler", "decided_at_s", "read_router_requests"]

RECENT_S = 30.0
"""Client-side latency percentiles cover the requests that finished in the last 30 s."""
RATE_WINDOW_S = 10.0
DECISIONS_PAGE = 200
"""Decisions read a request (the controller's decision log pages at most 500)."""
GUARD_REASONS = ("host_budget", "scale_ineffective", "at_max", "forecast_unreliable")


def _engine_imbalance(load: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Per-layer CV and its sampling-noise floor from an engine's ``/v1/expert-load``."""
    from contracts.imbalance import sampling_noise_cv

    cv = [float(x) for x in load["imbalance_cv"]]
    rank_tokens = np.asarray(load["rank_tokens"], dtype=np.float64)
    noise = sampling_noise_cv(rank_tokens.sum(axis=1), rank_tokens.shape[1], rank_tokens)
    return cv, [float(x) for x in noise]


def decided_at_s(state: StackState, decision: dict[str, Any], seen_s: float) -> float:
    """A decision's time in stack seconds, from its own ``at`` (the controller's wall clock; UTC when it names no
    zone), else ``seen_s``: the look that sees it may come a sample period later, or, for the scale-up from zero
    made during start-up, only when the load begins."""
    try:
        at = datetime.fromisoformat(str(decision["at"]))
    except (KeyError, ValueError):
        return seen_s
    return state.from_wall((at if at.tzinfo is not None else at.replace(tzinfo=UTC)).timestamp())


class Sampler:
    """Polls the engines, the controller, Alertmanager and the pager every ``interval_s``."""

    def __init__(
        self, state: StackState, policy: str, pager: WebhookReceiver | None, probe: Callable[[], list[str]]
    ) -> None:
        self.state = state
        self.policy = policy
        self.pager = pager
        self.probe = probe
        self._last_hold: str | None = None

    async def loop(self, stop: asyncio.Event, on_update: Callable[[StackState], None]) -> None:
        async with httpx.AsyncClient(timeout=3.0) as client:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    await self.sample(client)
                on_update(self.state)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.state.options.sample_interval_s)

    async def sample(self, client: httpx.AsyncClient) -> None:
        state = self.state
        await asyncio.to_thread(self.probe)
        cvs, noises = await self._imbalance(client)
        status = await self._controller(client)
        await self._router(client)
        alerts = await self._alerts(client)
        self.read_pages()
        now = state.elapsed()
        recent, met_fault = recent_requests(state, now, RECENT_S)
        ttfts = [r.ttft_s for r in recent if r.ttft_s is not None]
        itls = [x for r in recent for x in r.itls_s]
        ok = sum(r.ok for r in state.records)
        sent = bisect.bisect_right(state.planned_arrivals_s, now) - bisect.bisect_right(
            state.planned_arrivals_s, now - RATE_WINDOW_S
        )
        state.samples.append(Sample(
            t_s=now,
            ttft_p99_s=float(np.percentile(ttfts, 99)) if ttfts else None,
            itl_p99_s=float(np.percentile(itls, 99)) if itls else None,
            requests_ok=ok, requests_failed=len(state.records) - ok,
            imbalance_cv=np.max(np.array(cvs), axis=0).tolist() if cvs else [],
            noise_cv=np.max(np.array(noises), axis=0).tolist() if noises else [],
            current_replicas=status.get("current_replicas"), desired_replicas=status.get("desired_replicas"),
            ready_engines=len(state.engines), alerts=alerts, arrival_rps=sent / RATE_WINDOW_S,
            forecast=status.get("forecast"), fault_requests=met_fault,
        ))

    async def _imbalance(self, client: httpx.AsyncClient) -> tuple[list[list[float]], list[list[float]]]:
        cvs: list[list[float]] = []
        noises: list[list[float]] = []
        for url in self.state.engines:
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError, TypeError):
                load = (await client.get(f"{url}/v1/expert-load")).json()
                if load.get("steps_in_window"):
                    cv, noise = _engine_imbalance(load)
                    cvs.append(cv)
                    noises.append(noise)
        return cvs, noises

    async def _controller(self, client: httpx.AsyncClient) -> dict[str, Any]:
        state = self.state
        status: dict[str, Any] = {}
        try:
            status = (await client.get(f"{state.controller_url}/v1/status/{self.policy}")).json()
        except (httpx.HTTPError, ValueError):
            state.controller_unanswered += 1  # counted in the summary: a dead loop does not read as a quiet one
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            for decision in await self._new_decisions(client):
                self.see_decision(decision)
        return status

    async def _new_decisions(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        """Every decision since the last look, oldest first: pages (newest first) are read back to one already seen.

        One page of 50 missed the scale-up from zero once start-up logged 50 decisions before the first look."""
        seen = self.state.seen_decisions
        fresh: list[dict[str, Any]] = []
        params: dict[str, Any] = {"policy": self.policy, "limit": DECISIONS_PAGE}
        while True:
            page = (await client.get(f"{self.state.controller_url}/v1/decisions", params=params)).json()
            items = page.get("items", [])
            fresh.extend(d for d in items if str(d.get("id")) not in seen)
            cursor = page.get("next_cursor")
            if cursor is None or any(str(d.get("id")) in seen for d in items) or cursor == params.get("cursor"):
                return fresh[::-1]
            params["cursor"] = cursor

    def see_decision(self, decision: dict[str, Any]) -> None:
        """Record a decision the first time it is seen, at its own time (``at_s``), with an event when it is news."""
        state = self.state
        key = str(decision.get("id"))
        if key in state.seen_decisions:
            return
        state.seen_decisions.add(key)
        decision["seen_at_s"] = seen_s = state.elapsed()
        decision["at_s"] = at_s = decided_at_s(state, decision, seen_s)
        state.decisions.append(decision)
        action = decision.get("action")
        if action in ("rebalance", "verify_rebalance"):
            state.event(f"{action}:{decision.get('reason')} {decision.get('outcome')}: {decision.get('detail')}", at_s)
            return
        reasons = (decision.get("inputs") or {}).get("reasons", [])[1:]
        if action == "hold":
            # A hold is worth an event when a guardrail stops a wanted change, once per guardrail.
            guard = next((r for r in reasons if r in GUARD_REASONS), None)
            if guard is None or guard == self._last_hold:
                return
            self._last_hold = guard
        else:
            self._last_hold = None
        state.event(f"{action}:{decision.get('reason')} ({', '.join(reasons) or '-'}) "
                    f"{decision.get('current_replicas')} -> {decision.get('desired_replicas')}, "
                    f"{decision.get('outcome')}", at_s)

    async def _router(self, client: httpx.AsyncClient) -> None:
        """An event when the entry router starts or stops sending requests to a replica."""
        state = self.state
        if state.router_url is None:
            return
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError, TypeError):
            replicas = (await client.get(f"{state.router_url}/router/replicas")).json()["replicas"]
            routed = {r["name"] for r in replicas if r["healthy"]}
            for name in sorted(routed - state.routed):
                state.event(f"router: {name} takes requests (listed by the controller, health checks passed)")
            for name in sorted(state.routed - routed):
                state.event(f"router: {name} no longer takes requests")
            state.routed = routed

    async def _alerts(self, client: httpx.AsyncClient) -> list[str]:
        if self.state.alertmanager_url is None:
            return []
        with contextlib.suppress(httpx.HTTPError, ValueError):
            active = (await client.get(f"{self.state.alertmanager_url}/api/v2/alerts")).json()
            return sorted({a["labels"].get("alertname", "?") for a in active})
        return []

    def read_pages(self) -> None:
        """The webhook's new posts (pages and tickets), each at the time it came in, not at this look."""
        state = self.state
        if self.pager is None:
            return
        for path, note, received_s in self.pager.timed_posts[len(state.pages):]:
            note["receiver"] = path.strip("/")
            note["delivered_at_s"] = received_s - state.started_s
            state.pages.append(note)
            names = ", ".join(sorted({a["labels"].get("alertname", "?") for a in note.get("alerts", [])}))
            state.event(f"{path.strip('/')} delivered ({note.get('status')}): {names}", note["delivered_at_s"])


def read_router_requests(state: StackState) -> None:
    """The router's request counts by replica, decision and outcome, for the summary."""
    from prometheus_client.parser import text_string_to_metric_families

    if state.router_url is None:
        return
    with contextlib.suppress(httpx.HTTPError, ValueError):
        text = httpx.get(f"{state.router_url}/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            if family.name != "moeslo_router_requests":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.value:
                    key = " ".join(sample.labels[k] for k in ("replica", "decision", "outcome"))
                    state.router_requests[key] = int(sample.value)
