"""The status pages in a real browser (Debian's chromium, headless, driven by Playwright).

A real controller service (the production core, a scripted source, the dry-run actuator) ticks
for half an hour of simulated time, then uvicorn serves its API and pages.  The browser checks
that pages load with no console error, that what the charts draw matches the API's JSON (read
back from the drawn SVG geometry), that a decision made during the test appears when the page
refreshes itself, and keeps a screenshot of each page under ``test-artifacts/status-page/``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from controller.actuators import DryRunActuator
from controller.api import create_app
from controller.builder import CoreOptions, build_decision_core
from controller.config import ControllerSettings
from controller.policy import Policy
from controller.service import ControllerService
from controller.store import Store
from controller.telemetry import ControllerMetrics
from controller.types import PolicyObservation, SliSnapshot
from tests.controller.api.page.browser import artifacts_dir, browser, chromium_path, serving
from tests.controller.api.page.fakes import Upstream, alert

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TICK_S = 15.0
WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d")


@dataclass
class Script:
    """What the scripted source reports per policy: load, queue and the TTFT good ratio."""

    rate: dict[str, float] = field(default_factory=lambda: {"steady": 4.0, "burning": 6.0})
    queue: dict[str, float] = field(default_factory=lambda: {"steady": 0.0, "burning": 0.0})
    ttft_good: dict[str, float] = field(default_factory=lambda: {"steady": 0.999, "burning": 0.78})

    async def observe(self, policies: Sequence[Policy], now_s: float) -> dict[str, PolicyObservation]:
        out = {}
        for policy in policies:
            rate, good = self.rate.get(policy.name, 1.0), self.ttft_good.get(policy.name, 0.999)
            ratios = {w: good if w in ("5m", "30m", "1h") else 0.995 for w in WINDOWS}
            sli = SliSnapshot(observed_at_s=now_s, requests_in_window=rate * 300, ttft_good_ratio=good,
                              itl_good_ratio=0.999, ttft_p99_s=0.3, itl_p99_s=0.015,
                              ttft_good_ratio_by_window=ratios, itl_good_ratio_by_window=dict.fromkeys(WINDOWS, 0.999))
            out[policy.name] = PolicyObservation(
                policy=policy.name, observed_at_s=now_s, queue_depth=self.queue.get(policy.name, 0.0),
                running_requests=4.0, kv_cache_usage=0.3, request_rate_rps=rate, prompt_tokens_per_s=rate * 500,
                output_tokens_per_s=rate * 100, sli=sli)
        return out

    async def aclose(self) -> None:
        return None


@dataclass
class Live:
    service: ControllerService
    store: Store
    script: Script
    clock: dict[str, float]
    base_url: str = ""

    def tick(self) -> None:
        """One service tick, in a thread of its own (Playwright's sync API owns this one's event loop)."""
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, self.service.tick()).result(timeout=60)
        self.clock["wall"] += TICK_S
        self.clock["mono"] += TICK_S


def _policy(name: str, description: str = "") -> Policy:
    return Policy.model_validate({"name": name, "description": description,
                                  "target": {"kind": "deployment", "namespace": "ns", "name": f"model-{name}"},
                                  "scaling": {"min_replicas": 1, "max_replicas": 12, "max_step": 4}})


def _live(tmp_path: Path, ticks: int) -> Live:
    store = Store(f"sqlite+pysqlite:///{tmp_path / 'c.db'}")
    for policy in (_policy("steady", "Chat <b>traffic</b> & friends"), _policy("burning"), _policy("fresh")):
        store.create_policy(policy)
    clock = {"wall": (datetime.now(UTC) - timedelta(seconds=ticks * TICK_S)).timestamp(), "mono": 1000.0}
    script = Script(rate={"steady": 4.0, "burning": 6.0}, queue={"steady": 0.0, "burning": 0.0})
    service = ControllerService(
        store=store, source=script, actuator=DryRunActuator(),
        core=build_decision_core(CoreOptions(tick_interval_s=TICK_S)),
        metrics=ControllerMetrics(CollectorRegistry()), tick_interval_s=TICK_S, stale_after_s=60.0,
        clock=lambda: clock["mono"], wall_clock=lambda: datetime.fromtimestamp(clock["wall"], UTC),
    )
    live = Live(service, store, script, clock)
    for k in range(ticks):
        script.rate["steady"] = 4.0 + 2.0 * (k / ticks)
        live.tick()
    return live


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    chromium_path()  # skip before building anything
    tmp = tmp_path_factory.mktemp("browser")
    state = _live(tmp, ticks=120)
    state.service.store.list_policies()  # the "fresh" policy is evaluated too; it just has little history
    settings = ControllerSettings(db=str(tmp / "c.db"), tick_interval_s=TICK_S)
    with serving(create_app(settings, state.store, service=state.service)) as url:
        state.base_url = url
        yield state
    state.store.close()


def _open(browser_: Any, url: str) -> tuple[Any, list[str]]:
    page = browser_.new_page(viewport={"width": 1440, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning")
            else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
    page.goto(url)
    return page, problems


DRAWN = """([chart, series]) => {
  const svg = document.querySelector(`svg[data-chart="${chart}"]`);
  const path = svg.querySelector(`[data-series="${series}"]`);
  const end = path.getPointAtLength(path.getTotalLength());
  const [x, y, w, h] = svg.dataset.plot.split(",").map(Number);
  const [y0, y1, t0, t1] = [svg.dataset.y0, svg.dataset.y1, svg.dataset.t0, svg.dataset.t1].map(Number);
  return {value: y0 + (1 - (end.y - y) / h) * (y1 - y0), t: t0 + (end.x - x) / w * (t1 - t0),
          n: Number(path.dataset.n), valueTol: (y1 - y0) / h, tTol: (t1 - t0) / w};
}"""


def _decisions(base_url: str, policy: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = httpx.get(f"{base_url}/v1/decisions", params={"policy": policy, "limit": 500},
                                            timeout=10).json()["items"]
    return items


def test_overview_matches_the_status_api_and_puts_the_burning_policy_first(live: Live) -> None:
    with browser() as chromium:
        page, problems = _open(chromium, f"{live.base_url}/ui/")
        page.screenshot(path=str(artifacts_dir() / "overview.png"), full_page=True)
        rows = page.eval_on_selector_all("tr[data-policy]", "rows => rows.map(r => [r.dataset.policy, "
                                                            "r.dataset.level])")
        cells = page.eval_on_selector_all(
            "tr[data-policy] [data-field]",
            "cells => cells.map(c => [c.closest('tr').dataset.policy, c.dataset.field, c.dataset.value])")
    assert problems == []
    assert rows[0] == ["burning", "PAGE"] and {name for name, _ in rows} == {"burning", "steady", "fresh"}
    status = {p["name"]: p for p in httpx.get(f"{live.base_url}/v1/status", timeout=10).json()["policies"]}
    checked = 0
    for policy, name, value in cells:
        if name.startswith("error_budget_remaining."):
            assert float(value) == status[policy]["error_budget_remaining"][name.split(".")[1]]
            checked += 1
        elif name in ("current_replicas", "desired_replicas") and value:
            assert int(value) == status[policy][name]
            checked += 1
    assert checked >= 8


def test_policy_charts_draw_what_the_api_says(live: Live) -> None:
    decisions = _decisions(live.base_url, "burning")
    newest = decisions[0]
    with browser() as chromium:
        page, problems = _open(chromium, f"{live.base_url}/ui/policies/burning?refresh=0")
        page.screenshot(path=str(artifacts_dir() / "policy-burning.png"), full_page=True)
        load = page.evaluate(DRAWN, ["load", "actual"])
        replicas = page.evaluate(DRAWN, ["replicas", "current"])
        ttft = page.evaluate(DRAWN, ["good_ratio", "ttft"])
        marks = page.eval_on_selector_all('svg[data-chart="replicas"] g.marker title', "ts => ts.length")
        for name in ("steady", "fresh"):
            other, more = _open(chromium, f"{live.base_url}/ui/policies/{name}?refresh=0")
            other.screenshot(path=str(artifacts_dir() / f"policy-{name}.png"), full_page=True)
            problems += more
    assert problems == []
    at = datetime.fromisoformat(newest["at"]).timestamp()
    assert load["n"] == len([d for d in decisions if d["inputs"].get("request_rate_rps") is not None])
    assert load["value"] == pytest.approx(newest["inputs"]["request_rate_rps"], abs=load["valueTol"])
    assert load["t"] == pytest.approx(at, abs=load["tTol"])
    assert replicas["value"] == pytest.approx(newest["current_replicas"], abs=replicas["valueTol"])
    assert ttft["value"] == pytest.approx(newest["inputs"]["ttft_good_ratio"], abs=ttft["valueTol"])
    scaled = [d for d in decisions if d["action"] in ("scale_up", "scale_down")]
    assert marks == len(scaled) + 1  # each scaling decision, and the policy's version 1


def test_a_decision_made_now_appears_when_the_page_refreshes(live: Live) -> None:
    with browser() as chromium:
        page, problems = _open(chromium, f"{live.base_url}/ui/policies/burning?refresh=2")
        before = page.eval_on_selector_all("tr[data-decision]", "rows => rows.map(r => r.dataset.decision)")
        live.script.rate["burning"], live.script.queue["burning"] = 40.0, 400.0
        live.tick()
        newest = _decisions(live.base_url, "burning")[0]
        assert newest["action"] == "scale_up", newest
        assert str(newest["id"]) not in before
        page.wait_for_selector(f'tr[data-decision="{newest["id"]}"]', timeout=20_000)
        page.screenshot(path=str(artifacts_dir() / "policy-burning-after-decision.png"), full_page=True)
        text = page.inner_text(f'tr[data-decision="{newest["id"]}"]')
    assert problems == []
    assert "scale_up" in text and newest["detail"].split(":")[0] in text


def test_prometheus_and_alertmanager_down_and_up(live: Live, tmp_path: Path) -> None:
    upstream = Upstream(alerts=[alert("burning", summary="TTFT budget burning fast")])
    settings = ControllerSettings(db=str(tmp_path / "unused.db"), tick_interval_s=TICK_S,
                                  prometheus_url="http://prometheus.test:9090",
                                  alertmanager_url="http://alertmanager.test:9093")
    app = create_app(settings, live.store, service=live.service, page_transport=upstream.transport())
    with serving(app) as url, browser() as chromium:
        page, problems = _open(chromium, f"{url}/ui/policies/burning?refresh=0")
        page.screenshot(path=str(artifacts_dir() / "policy-prometheus.png"), full_page=True)
        heat_rows = page.get_attribute('svg[data-chart="imbalance"]', "data-rows")
        ttft = page.evaluate(DRAWN, ["good_ratio", "ttft"])
        alerts = page.inner_text("table[data-alerts]")
        overview, more = _open(chromium, f"{url}/ui/")
        alert_count = overview.inner_text('tr[data-policy="burning"] [data-field="alerts"]')
        upstream.prometheus_down = upstream.alertmanager_down = True
        page.reload()
        page.screenshot(path=str(artifacts_dir() / "policy-prometheus-down.png"), full_page=True)
        banners = page.eval_on_selector_all("[data-banner]", "bs => bs.map(b => b.dataset.banner)")
        source = page.get_attribute('[data-panel="good_ratio"] [data-source]', "data-source")
    assert problems == [] and more == []
    assert heat_rows == "4" and ttft["value"] == pytest.approx(upstream.ttft_good, abs=ttft["valueTol"])
    assert "TTFT budget burning fast" in alerts and alert_count == "1"
    assert banners == ["prometheus", "alertmanager"] and source is not None and source.startswith("decision log")
