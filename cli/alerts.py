"""``moeslo alerts generate``: Prometheus rules and Alertmanager config from SLO policies."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import cli_errors, console, nonempty, print_json
from cli.deploy import RunbookUrlOption

alerts_app = typer.Typer(help="Prometheus alert rules and Alertmanager routing generated from SLO policies.",
                         no_args_is_help=True)


@alerts_app.callback()
def _group() -> None:
    """Prometheus alert rules and Alertmanager routing generated from SLO policies."""


PoliciesOption = Annotated[
    Path | None,
    typer.Option("--policies", help="YAML/JSON file of SLO policies (default: the mission's default policy)."),
]


@alerts_app.command("generate")
def generate(
    out: Annotated[str, typer.Option("--out", callback=nonempty, help="Directory to write the files into.")] = "alerts",
    policies: PoliciesOption = None,
    page_webhook: Annotated[str | None, typer.Option(help="Webhook URL of the paging receiver.")] = None,
    ticket_webhook: Annotated[str | None, typer.Option(help="Webhook URL of the ticket receiver.")] = None,
    engine: Annotated[str, typer.Option(help="Whose histogram buckets: moeslo (ITL has 0.02), vllm (stock: no "
                                             "0.02) or vllm-slo-buckets (vLLM with --custom-histogram-buckets).")
                      ] = "moeslo",
    runbook_url: RunbookUrlOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print what was written as JSON.")] = False,
) -> None:
    """Write moeslo-rules.yaml and alertmanager.yaml for the given policies."""
    from controller.policy_files import DEFAULT_POLICIES, load_policies
    from generators.alerts import AlertOptions, ReceiverOptions, render_alert_files
    from generators.buckets import engine_buckets
    from generators.manifests.files import write_text_files

    with cli_errors():
        engine_described = engine_buckets(engine)
        chosen = DEFAULT_POLICIES if policies is None else load_policies(policies)
        defaults = ReceiverOptions()
        receivers = ReceiverOptions(
            page_webhook_url=page_webhook or defaults.page_webhook_url,
            ticket_webhook_url=ticket_webhook or defaults.ticket_webhook_url,
        )
        options = AlertOptions(engine=engine_described, runbook_url=runbook_url)
        files = render_alert_files(chosen, options=options, receivers=receivers)
        written = write_text_files(Path(out), files)
    if json_output:
        print_json({"written": [str(path) for path in written], "policies": [p.name for p in chosen]})
    else:
        for path in written:
            console.print(f"wrote {path}")
