"""``moeslo dashboards push`` through grafana-client against a stand-in Grafana HTTP API on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from contracts.errors import UnavailableError, ValidationError
from controller.policy_files import DEFAULT_POLICIES
from generators.dashboards import build_dashboards
from generators.dashboards.push import push_dashboards
from harness.processes import free_port
from tests.generators.dashboards.grafana_standin import grafana_standin

pytest.importorskip("grafana_client", reason="the optional grafana extra is not installed")

ROOT = Path(__file__).resolve().parents[3]


def test_push_uploads_every_dashboard_into_a_new_folder_and_overwrites_on_repeat() -> None:
    documents = build_dashboards(DEFAULT_POLICIES)
    with grafana_standin() as grafana:
        results = push_dashboards(documents, url=grafana.url, token=grafana.token, folder_uid="moeslo")
        assert grafana.folders == {"moeslo": "moeslo"}
        assert {r.uid for r in results} == {d["uid"] for d in documents.values()}
        assert {r.status for r in results} == {"success"} and {r.version for r in results} == {1}
        for document in documents.values():
            stored = grafana.dashboards[document["uid"]]
            assert stored == {**document, "id": None}
            assert grafana.placed_in[document["uid"]] == "moeslo"
        again = push_dashboards(documents, url=grafana.url, token=grafana.token, folder_uid="moeslo")
        assert {r.version for r in again} == {2}
        assert ("POST", "/api/folders") in grafana.requests
        assert grafana.requests.count(("POST", "/api/folders")) == 1


def test_push_with_a_bad_token_is_refused_and_a_dead_url_is_unavailable() -> None:
    documents = build_dashboards(DEFAULT_POLICIES)
    with grafana_standin() as grafana:
        with pytest.raises(ValidationError, match="refused"):
            push_dashboards(documents, url=grafana.url, token="wrong")
        assert grafana.dashboards == {}
    with pytest.raises(UnavailableError, match="cannot reach Grafana"):
        push_dashboards(documents, url=f"http://127.0.0.1:{free_port()}", token="t", timeout_s=2)
    for not_a_url in ("notaurl", "ftp://127.0.0.1/", "http://"):
        with pytest.raises(ValidationError, match="is not an http\\(s\\) URL \\(Grafana's base URL"):
            push_dashboards(documents, url=not_a_url, token="t")


def test_cli_push_reads_the_committed_files(tmp_path: Path) -> None:
    with grafana_standin() as grafana:
        result = CliRunner().invoke(app, [
            "dashboards", "push", "--url", grafana.url, "--token", grafana.token,
            "--dir", str(ROOT / "dashboards"), "--json"])
        assert result.exit_code == 0, result.output
        pushed = json.loads(result.stdout)
        assert sorted(p["uid"] for p in pushed) == sorted(grafana.dashboards)
        assert len(pushed) == 4
        bad = CliRunner().invoke(app, ["dashboards", "push", "--url", grafana.url, "--token", "nope",
                                                  "--dir", str(ROOT / "dashboards")])
        assert bad.exit_code == 2
        empty = CliRunner().invoke(app, ["dashboards", "push", "--url", grafana.url, "--dir", str(tmp_path)])
        assert empty.exit_code == 2
