"""``moeslo controller serve`` and ``moeslo policy apply/get/list/delete`` (REST clients)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import cli_errors, console, print_json
from cli.listen import listener_for, listening_port, run_uvicorn
from contracts.errors import DataError, MoesloError
from contracts.urls import http_url, redacted_url

controller_app = typer.Typer(help="The SLO controller service (REST API + tick loop).", no_args_is_help=True)
policy_app = typer.Typer(help="SLO policies on a running controller (over its REST API).", no_args_is_help=True)

DEFAULT_URL = "http://127.0.0.1:8090"


def _base_url(url: str) -> str:
    """``http://host:8090/`` is the controller ``http://host:8090``: ``.../`` + ``/v1/policies`` found nothing."""
    return url.rstrip("/")


UrlOption = Annotated[
    str,
    typer.Option("--url", envvar="MOESLO_CONTROLLER_URL", callback=_base_url, help="The controller's base URL."),
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="MOESLO_CONTROLLER_TOKEN", help="Bearer token for writes."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@controller_app.command("serve")
def serve(
    config: Annotated[Path | None, typer.Option("--config", help="YAML settings file.")] = None,
    db: Annotated[str | None, typer.Option("--db", help="SQLite file or SQLAlchemy URL.")] = None,
    prometheus: Annotated[
        str | None, typer.Option("--prometheus", help="Prometheus base URL (default: scrape engines).")
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="Address to listen on.")] = None,
    port: Annotated[int | None, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = None,
    actuator: Annotated[str | None, typer.Option("--actuator", help="dryrun, local or kubernetes.")] = None,
    tick_interval_s: Annotated[float | None, typer.Option("--tick-interval-s", help="Seconds between ticks.")] = None,
    alertmanager: Annotated[
        str | None, typer.Option("--alertmanager", help="Alertmanager base URL (the status page lists its alerts).")
    ] = None,
    shutdown_grace_s: Annotated[
        float | None,
        typer.Option("--shutdown-grace-s", min=0, help="Seconds a shutdown (SIGTERM) lets the actions in flight "
                     "finish; those still running then are logged 'interrupted' (default: the setting, 15)."),
    ] = None,
) -> None:
    """Serve the REST API and run the tick loop until interrupted."""
    with cli_errors():
        from prometheus_client import CollectorRegistry

        from controller.api import create_app
        from controller.config import load_settings
        from controller.rebalance.allocator import keep_freed_memory
        from controller.service import build_service
        from controller.store import Store
        from controller.tasks import favour_the_event_loop

        settings = load_settings(
            config,
            db=db,
            prometheus_url=prometheus,
            host=host,
            port=port,
            actuator=actuator,
            tick_interval_s=tick_interval_s,
            alertmanager_url=alertmanager,
            shutdown_grace_s=shutdown_grace_s,
        )
        listener = listener_for(settings.host, settings.port)
        port = listening_port(listener, settings.port)  # --port 0: the one the system picked
        keep_freed_memory()  # the rebalancer's planning rounds (controller/rebalance/allocator.py)
        favour_the_event_loop()  # API reads and scrapes answer while a tick computes in its worker thread
        store = Store(settings.db_url)
        registry = CollectorRegistry()
        service = build_service(settings, store, registry)
        hooks = (service.start, service.stop)
        api = create_app(settings, store, registry=registry, service=service, lifespan_hooks=hooks)
        source = redacted_url(settings.prometheus_url) if settings.prometheus_url else "direct scrape"
        console.print(
            f"controller on {http_url(settings.host, port)} (db {store.engine.url.render_as_string()}, "
            f"SLIs from {source}, actuator {settings.actuator})"
        )
        console.print(f"status page: {http_url(settings.host, port)}/ui/")
        try:
            run_uvicorn(api, host=settings.host, port=port, listener=listener, log_level="warning")
        finally:
            store.close()


@policy_app.command("apply")
def apply(
    file: Annotated[Path, typer.Option("-f", "--file", help="YAML/JSON: policies, or OpenSLO v1 SLO documents.")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    json_out: JsonOption = False,
) -> None:
    """Create or replace the policies in FILE (OpenSLO documents update the SLO part)."""
    from controller.api_client import answer, request
    from controller.policy_files import read_documents

    with cli_errors():
        docs = read_documents(file)
        if not docs:
            raise DataError("no policies in the file", path=str(file))
        results: list[Any] = []
        # `policy get --openslo --json` prints the documents as one JSON list (the import reads that too).
        slos = docs[0] if len(docs) == 1 and isinstance(docs[0], list) and docs[0] else docs
        if all(isinstance(d, dict) and str(d.get("apiVersion", "")).startswith("openslo/") for d in slos):
            response = request(
                "POST",
                f"{url}/v1/openslo",
                token,
                content=file.read_bytes(),
                headers={"Content-Type": "application/yaml"},
            )
            results = answer(response, "items")["items"]
        else:
            results = _put_policies(docs[0] if len(docs) == 1 else docs, file, url, token)
        if json_out:
            print_json(results)
        else:
            for item in results:
                console.print(f"policy {item['name']} at version {item['version']}")


def _put_policies(document: Any, file: Path, url: str, token: str | None) -> list[Any]:
    """PUT each policy of a file, every one checked first: a file with a bad policy writes none.

    One policy per document, a list of them, or a mapping with a ``policies`` list (as load_policies reads).
    A policy the controller itself refuses (its target, say) stops the rest; the error names it and the
    ones already applied."""
    from controller.api_client import answer, request
    from controller.policy_files import parse_policies, policy_items

    items = policy_items(document, source=str(file))
    if not items:  # `policies: []` or `[]`: nothing to apply is a mistake, as alerts and dashboards say
        raise DataError("no policies in the file", path=str(file))
    if not all(isinstance(doc, dict) and "name" in doc for doc in items):
        raise DataError("every policy document needs a name", path=str(file))
    parse_policies(items, source=str(file))  # every problem of every policy at once
    results: list[Any] = []
    for doc in items:
        try:
            put = request("PUT", _policy_url(url, str(doc["name"])), token, json=doc)
            results.append(answer(put, "name", "version"))
        except MoesloError as exc:
            applied = ", ".join(f"{r['name']} (version {r['version']})" for r in results) or "none"
            exc.args = (f"policy {doc['name']!r} not applied, nor those after it: {exc}; applied before it: "
                        f"{applied}",)  # fmt: skip
            raise
    return results


def _policy_url(url: str, name: str) -> str:
    """The policy's resource, its name escaped whole: ``a#b`` or ``x/../a`` must not reach policy ``a``."""
    from urllib.parse import quote

    return f"{url}/v1/policies/{quote(name, safe='')}"


@policy_app.command("get")
def get(
    name: Annotated[str, typer.Argument(help="Policy name.")],
    url: UrlOption = DEFAULT_URL,
    openslo: Annotated[bool, typer.Option("--openslo", help="Print the SLO part as OpenSLO v1 YAML.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Show one policy."""
    from controller.api_client import answer, request

    with cli_errors():
        if openslo:
            text = request("GET", f"{_policy_url(url, name)}/openslo", None).text
            if json_out:
                import yaml

                print_json([doc for doc in yaml.safe_load_all(text) if doc is not None])
            else:
                typer.echo(text, nl=False)
            return
        body = answer(request("GET", _policy_url(url, name), None), "version", "policy")
        if json_out:
            print_json(body)
        else:
            import yaml

            typer.echo(f"# version {body['version']}, updated {body['updated_at']}")
            typer.echo(yaml.safe_dump(body["policy"], sort_keys=False), nl=False)


@policy_app.command("list")
def list_(url: UrlOption = DEFAULT_URL, json_out: JsonOption = False) -> None:
    """List policies with their mode and replica bounds."""
    from controller.api_client import answer, request

    with cli_errors():
        items = answer(request("GET", f"{url}/v1/policies", None), "items")["items"]
        if json_out:
            print_json(items)
            return
        from rich.table import Table

        table = Table("name", "version", "mode", "target", "replicas")
        for item in items:
            policy = item["policy"]
            target = policy["target"]
            table.add_row(
                item["name"],
                str(item["version"]),
                policy["mode"],
                f"{target['kind']}:{target.get('name') or target.get('model')}",
                f"{policy['scaling']['min_replicas']}..{policy['scaling']['max_replicas']}",
            )
        console.print(table)


@policy_app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="Policy name.")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    json_out: JsonOption = False,
) -> None:
    """Delete a policy (its history and decisions stay)."""
    from controller.api_client import request

    with cli_errors():
        request("DELETE", _policy_url(url, name), token)
        if json_out:
            print_json({"deleted": name})
        else:
            console.print(f"policy {name} deleted")
