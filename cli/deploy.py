"""``moeslo deploy render|build``: the kustomize tree under deploy/."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import cli_errors, console, nonempty, print_json

deploy_app = typer.Typer(help="Kubernetes manifests (kustomize): regenerate the generated parts, render overlays.",
                         no_args_is_help=True)

DirOption = Annotated[str, typer.Option("--dir", callback=nonempty, help="The deploy/ directory.")]
RunbookUrlOption = Annotated[
    str | None,
    typer.Option("--runbook-url", help="URL of the runbooks page (docs/runbooks.md as you publish it): every "
                                       "alert gets a runbook_url annotation linking to its section."),
]


@deploy_app.command("render")
def render(deploy_dir: DirOption = "deploy", runbook_url: RunbookUrlOption = None,
           json_output: Annotated[bool, typer.Option("--json", help="Print what was written.")] = False) -> None:
    """Regenerate deploy/*/generated/ from the default policies and each overlay's policies.yaml.

    Each policy's thresholds must be bucket edges of its target's engine, as the
    overlay's workload starts it (vLLM: its --custom-histogram-buckets).
    """
    from controller.policy_files import DEFAULT_POLICIES
    from generators.manifests import deploy_files, load_overlays
    from generators.manifests.files import write_text_files

    with cli_errors():
        overlays = load_overlays(Path(deploy_dir))
        written = write_text_files(Path(deploy_dir), deploy_files(DEFAULT_POLICIES, overlays, runbook_url=runbook_url))
    if json_output:
        print_json({"written": [str(path) for path in written], "overlays": sorted(overlays)})
    else:
        for path in written:
            console.print(f"wrote {path}")


@deploy_app.command("build")
def build(
    overlay: Annotated[str, typer.Argument(help="Overlay name (vllm-gpu, vllm-multinode, embedded-cpu) or 'base'.")],
    deploy_dir: DirOption = "deploy",
) -> None:
    """Print the manifests of an overlay as kustomize would (without the kustomize binary)."""
    from generators.alerts import dump_yaml_documents
    from generators.manifests import build as kustomize_build

    with cli_errors():
        directory = Path(deploy_dir, "base") if overlay == "base" else Path(deploy_dir, "overlays", overlay)
        typer.echo(dump_yaml_documents(kustomize_build(directory)), nl=False)
