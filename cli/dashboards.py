"""``moeslo dashboards generate|push``: Grafana dashboards as code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import cli_errors, console, print_json
from cli.main import app
from contracts.errors import DataError
from generators.manifests.files import write_text_files

dashboards_app = typer.Typer(help="Grafana dashboards generated with grafana-foundation-sdk (Grafana 10.1).",
                             no_args_is_help=True)
app.add_typer(dashboards_app, name="dashboards")

PoliciesOption = Annotated[
    Path | None,
    typer.Option("--policies", help="YAML/JSON file of SLO policies; the first draws the SLO lines."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


@dashboards_app.command("generate")
def generate(
    out: Annotated[Path, typer.Option("--out", help="Directory for the JSON files.")] = Path("dashboards"),
    policies: PoliciesOption = None,
    json_output: JsonOption = False,
) -> None:
    """Write the SLO overview, engine, experts and controller dashboards as JSON."""
    from controller.policy_files import DEFAULT_POLICIES, load_policies
    from generators.dashboards import render_dashboard_files

    with cli_errors():
        chosen = DEFAULT_POLICIES if policies is None else load_policies(policies)
        written = write_text_files(out, render_dashboard_files(chosen))
    if json_output:
        print_json({"written": [str(path) for path in written]})
    else:
        for path in written:
            console.print(f"wrote {path}")


@dashboards_app.command("push")
def push(
    url: Annotated[str, typer.Option("--url", envvar="GRAFANA_URL", help="Grafana base URL.")],
    token: Annotated[str | None, typer.Option("--token", envvar="GRAFANA_TOKEN",
                                              help="Service-account token.")] = None,
    source: Annotated[Path, typer.Option("--dir", help="Directory of dashboard JSON files.")] = Path("dashboards"),
    folder: Annotated[str | None, typer.Option("--folder-uid", help="Put the dashboards in this folder.")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="Per-request timeout.")] = 10.0,
    json_output: JsonOption = False,
) -> None:
    """Upload every dashboard JSON in --dir to Grafana (overwriting by uid)."""
    from generators.dashboards.push import push_dashboards

    with cli_errors():
        documents = read_dashboards(source)
        results = push_dashboards(documents, url=url, token=token, folder_uid=folder, timeout_s=timeout_s)
    if json_output:
        print_json([{"uid": r.uid, "title": r.title, "status": r.status, "version": r.version, "url": r.url}
                    for r in results])
    else:
        for result in results:
            console.print(f"{result.status} {result.uid} v{result.version} {result.url}")


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
