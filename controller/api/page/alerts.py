"""Alerts firing, from Alertmanager's API (``GET /api/v2/alerts``), for the status page.

The generated rules label every alert with ``policy`` and ``slo`` (see ``generators/alerts``),
so one request serves the overview (counted per policy) and a policy page (filtered).
Silenced and inhibited alerts are left out: the page shows what pages people now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from contracts.errors import UnavailableError
from contracts.urls import redacted_url
from controller.errors import malformed_answer

__all__ = ["FiringAlert", "firing_alerts"]


@dataclass(frozen=True, slots=True)
class FiringAlert:
    name: str
    policy: str | None
    slo: str | None
    severity: str | None
    summary: str
    starts_at: datetime | None
    labels: dict[str, str]

    @classmethod
    def of(cls, item: dict[str, Any]) -> FiringAlert:
        labels = {str(k): str(v) for k, v in (item.get("labels") or {}).items()}
        notes = item.get("annotations") or {}
        started = item.get("startsAt")
        try:
            starts_at = datetime.fromisoformat(str(started).replace("Z", "+00:00")) if started else None
        except ValueError:
            starts_at = None
        return cls(
            name=labels.get("alertname", "?"),
            policy=labels.get("policy"),
            slo=labels.get("slo"),
            severity=labels.get("severity"),
            summary=str(notes.get("summary") or notes.get("description") or ""),
            starts_at=starts_at,
            labels=labels,
        )


async def firing_alerts(client: httpx.AsyncClient, base_url: str) -> list[FiringAlert]:
    """Active, unsilenced, uninhibited alerts; any failure, an answer of the wrong shape included, is an
    :class:`UnavailableError` (a banner on the page, never an error page)."""
    url = f"{base_url.rstrip('/')}/api/v2/alerts"
    where = f"alertmanager {redacted_url(base_url)}"  # the page shows it: never its user:password@
    params = {"active": "true", "silenced": "false", "inhibited": "false"}
    try:
        response = await client.get(url, params=params)
    except httpx.HTTPError as exc:
        raise UnavailableError(f"{where}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise UnavailableError(f"{where}: HTTP {response.status_code}")
    try:
        body = response.json()
    except ValueError as exc:
        raise UnavailableError(f"{where}: the answer is not JSON") from exc
    if not isinstance(body, list):
        raise UnavailableError(f"{where}: expected a list of alerts")
    with malformed_answer(where):
        alerts = [FiringAlert.of(item) for item in body if isinstance(item, dict)]
        return sorted(alerts, key=lambda a: (a.severity != "page", a.policy or "", a.name))
