"""The generated Alertmanager routing on a real Alertmanager: pages page, tickets ticket, pages inhibit tickets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from generators.alerts import ReceiverOptions, build_alertmanager_config, dump_yaml
from tests.e2e.servers import alertmanager, webhook_receiver

pytestmark = pytest.mark.integration


def _alert(name: str, **labels: str) -> dict[str, object]:
    now = datetime.now(UTC)
    return {
        "labels": {"alertname": name, **labels},
        "annotations": {"summary": name},
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(minutes=10)).isoformat(),
    }


def test_page_routes_to_paging_and_inhibits_the_ticket_of_the_same_slo(tmp_path: Path) -> None:
    with webhook_receiver() as hooks:
        config = build_alertmanager_config(ReceiverOptions(
            page_webhook_url=f"{hooks.url}/page", ticket_webhook_url=f"{hooks.url}/ticket",
            group_wait="1s", group_interval="1s",
        ))
        with alertmanager(tmp_path, dump_yaml(config)) as am:
            alerts = [
                _alert("MoesloTTFTErrorBudgetBurn", severity="page", policy="p", slo="ttft", long_window="1h"),
                _alert("MoesloTTFTErrorBudgetBurn", severity="ticket", policy="p", slo="ttft", long_window="1d"),
                _alert("MoesloITLErrorBudgetBurn", severity="ticket", policy="p", slo="itl", long_window="1d"),
            ]
            httpx.post(f"{am}/api/v2/alerts", json=alerts, timeout=5).raise_for_status()

            pages = hooks.wait_for("/page", lambda a: a["labels"]["slo"] == "ttft", timeout_s=30)
            tickets = hooks.wait_for("/ticket", lambda a: a["labels"]["slo"] == "itl", timeout_s=30)
            assert [a["labels"]["severity"] for a in pages] == ["page"]
            assert [a["labels"]["alertname"] for a in tickets] == ["MoesloITLErrorBudgetBurn"]

            state = httpx.get(f"{am}/api/v2/alerts", timeout=5).json()
            inhibited = [a for a in state if a["status"]["inhibitedBy"]]
            assert [(a["labels"]["slo"], a["labels"]["severity"]) for a in inhibited] == [("ttft", "ticket")]
            # The inhibited ticket never reached the ticket receiver.
            assert not [a for a in hooks.alerts("/ticket") if a["labels"]["slo"] == "ttft"]
