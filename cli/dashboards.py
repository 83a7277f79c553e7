"""``moeslo dashboards generate|push``: Grafana dashboards as code."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import cli_errors, console, nonempty, positive, print_json

dashboards_app = typer.Typer(help="Grafana dashboards generated with grafana-foundation-sdk (Grafana 10.1).",
                             no_args_is_help=True)

PoliciesOption = Annotated[
    Path | None,
    typer.Option("--policies", help="YAML/JSON file of SLO policies; the first draws the SLO lines."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


@dashboards_app.command("generate")
def generate(
    out: Annotated[str, typer.Option("--out", callback=nonempty, help="Directory for the JSON files.")] = "dashboards",
    policies: PoliciesOption = None,
    engine: Annotated[str, typer.Option(help="Whose histogram buckets: moeslo, vllm (stock) or vllm-slo-buckets "
                                             "(vLLM with --custom-histogram-buckets).")] = "moeslo",
    json_output: JsonOption = False,
) -> None:
    """Write the SLO overview, engine, experts and controller dashboards as JSON."""
    from controller.policy_files import DEFAULT_POLICIES, load_policies
    from generators.buckets import engine_buckets
    from generators.dashboards import render_dashboard_files
    from generators.manifests.files import write_text_files

    with cli_errors():
        chosen = DEFAULT_POLICIES if policies is None else load_policies(policies)
        written = write_text_files(Path(out), render_dashboard_files(chosen, engine_buckets(engine)))
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
    source: Annotated[str, typer.Option("--dir", callback=nonempty, help="Directory of dashboard JSON files.")] = (
        "dashboards"
    ),
    folder: Annotated[str | None, typer.Option("--folder-uid", help="Put the dashboards in this folder.")] = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", callback=positive, help="Per-request timeout.")
    ] = 10.0,
    json_output: JsonOption = False,
) -> None:
    """Upload every dashboard JSON in --dir to Grafana (overwriting by uid)."""
    from generators.dashboards.push import push_dashboards, read_dashboards

    with cli_errors():
        documents = read_dashboards(Path(source))
        results = push_dashboards(documents, url=url, token=token, folder_uid=folder, timeout_s=timeout_s)
    if json_output:
        print_json([{"uid": r.uid, "title": r.title, "status": r.status, "version": r.version, "url": r.url}
                    for r in results])
    else:
        for result in results:
            console.print(f"{result.status} {result.uid} v{result.version} {result.url}")
