"""Upload dashboards to Grafana's HTTP API with grafana-client (the optional ``grafana`` extra).

grafana-client talks HTTP through niquests, whose ``urllib3-future`` would
replace ``urllib3`` for the whole environment (kubernetes uses urllib3).  The
README's install line keeps the two apart (``URLLIB3_NO_OVERRIDE=1``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.errors import DataError, UnavailableError, ValidationError
from contracts.urls import http_url_problem

INSTALL_HINT = (
    "dashboards push needs grafana-client: "
    "URLLIB3_NO_OVERRIDE=1 pip install 'moeslo[grafana]' --no-binary urllib3-future"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class PushResult:
    uid: str
    title: str
    status: str
    version: int | None
    url: str | None


def push_dashboards(
    documents: Mapping[str, Mapping[str, Any]],
    *,
    url: str,
    token: str | None,
    folder_uid: str | None = None,
    folder_title: str = "moeslo",
    timeout_s: float = 10.0,
) -> list[PushResult]:
    """Create or overwrite each dashboard (by uid); create the folder first when it is missing."""
    try:
        from grafana_client.api import GrafanaApi
        from grafana_client.client import GrafanaClientError, GrafanaException
    except ImportError as exc:
        raise UnavailableError(INSTALL_HINT) from exc

    problem = http_url_problem("url", url)
    if problem is not None:
        raise ValidationError(f"{problem} (Grafana's base URL, such as http://grafana:3000)")
    api = GrafanaApi.from_url(url, credential=token, timeout=timeout_s)
    try:
        if folder_uid is not None:
            _ensure_folder(api, folder_uid, folder_title, GrafanaClientError)
        results: list[PushResult] = []
        for document in documents.values():
            payload: dict[str, Any] = {
                "dashboard": {**document, "id": None},
                "overwrite": True,
                "message": "moeslo dashboards push",
            }
            if folder_uid is not None:
                payload["folderUid"] = folder_uid
            answer = api.dashboard.update_dashboard(payload)
            results.append(PushResult(
                uid=str(answer.get("uid", document.get("uid"))),
                title=str(document.get("title")),
                status=str(answer.get("status", "")),
                version=answer.get("version"),
                url=answer.get("url"),
            ))
        return results
    except GrafanaClientError as exc:
        # 4xx: a bad token or a dashboard Grafana refuses; retrying will not help.
        raise ValidationError(f"Grafana at {url} refused the request: {exc}") from exc
    except GrafanaException as exc:
        raise UnavailableError(f"Grafana at {url} failed: {exc}") from exc
    except OSError as exc:
        raise UnavailableError(f"cannot reach Grafana at {url}: {exc}") from exc
    except Exception as exc:
        # niquests' connection errors do not derive from OSError.
        if type(exc).__module__.startswith(("niquests", "urllib3")):
            raise UnavailableError(f"cannot reach Grafana at {url}: {exc}") from exc
        raise


def _ensure_folder(api: Any, folder_uid: str, title: str, client_error: type[Exception]) -> None:
    try:
        api.folder.get_folder(folder_uid)
    except client_error as exc:
        if getattr(exc, "status_code", None) != 404:
            raise
        api.folder.create_folder(title, uid=folder_uid)


def read_dashboards(source: Path) -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON for every ``*.json`` in ``source``."""
    paths = sorted(source.glob("*.json"))
    if not paths:
        raise DataError("no dashboard JSON files found", path=str(source))
    documents: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"invalid JSON: {exc.msg}", path=str(path), line=exc.lineno) from exc
        if not isinstance(document, dict) or "uid" not in document:
            raise DataError("not a Grafana dashboard (no uid)", path=str(path))
        documents[path.name] = document
    return documents


__all__ = ["INSTALL_HINT", "PushResult", "push_dashboards", "read_dashboards"]
