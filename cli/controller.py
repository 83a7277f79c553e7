"""``moeslo controller serve`` and ``moeslo policy apply/get/list/delete`` (REST clients)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import bench_app, cli_errors, console, print_json
from cli.main import app
from contracts.errors import ConflictError, DataError, MoesloError, NotFoundError, UnavailableError, ValidationError

controller_app = typer.Typer(help="The SLO controller service (REST API + tick loop).", no_args_is_help=True)
policy_app = typer.Typer(help="SLO policies on a running controller (over its REST API).", no_args_is_help=True)
app.add_typer(controller_app, name="controller")
app.add_typer(policy_app, name="policy")

DEFAULT_URL = "http://127.0.0.1:8090"
UrlOption = Annotated[
    str, typer.Option("--url", envvar="MOESLO_CONTROLLER_URL", help="The controller's base URL.")
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
    port: Annotated[int | None, typer.Option("--port", help="Port to listen on.")] = None,
    actuator: Annotated[str | None, typer.Option("--actuator", help="dryrun, local or kubernetes.")] = None,
    tick_interval_s: Annotated[float | None, typer.Option("--tick-interval-s", help="Seconds between ticks.")] = None,
) -> None:
    """Serve the REST API and run the tick loop until interrupted."""
    with cli_errors():
        import uvicorn
        from prometheus_client import CollectorRegistry

        from controller.api import create_app
        from controller.config import load_settings
        from controller.service import build_service
        from controller.store import Store

        settings = load_settings(
            config,
            db=db,
            prometheus_url=prometheus,
            host=host,
            port=port,
            actuator=actuator,
            tick_interval_s=tick_interval_s,
        )
        store = Store(settings.db_url)
        registry = CollectorRegistry()
        service = build_service(settings, store, registry)
        hooks = (service.start, service.stop)
        api = create_app(settings, store, registry=registry, service=service, lifespan_hooks=hooks)
        source = settings.prometheus_url or "direct scrape"
        console.print(
            f"controller on http://{settings.host}:{settings.port} (db {store.engine.url.render_as_string()}, "
            f"SLIs from {source}, actuator {settings.actuator})"
        )
        try:
            uvicorn.run(api, host=settings.host, port=settings.port, log_level="warning")
        finally:
            store.close()


def _request(method: str, url: str, token: str | None, **kwargs: Any) -> Any:
    """One API call; problem documents become moeslo errors with the server's message."""
    import httpx

    headers = dict(kwargs.pop("headers", {}))
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        response = httpx.request(method, url, headers=headers, timeout=30.0, **kwargs)
    except httpx.HTTPError as exc:
        raise UnavailableError(f"controller at {url}: {exc}") from exc
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        status = response.status_code
        error: type[MoesloError] = MoesloError
        if status == 404:
            raise NotFoundError("resource", url.rsplit("/", 1)[-1])
        if status in (409, 412):
            error = ConflictError
        elif status in (400, 422):
            error = ValidationError
        elif status >= 500:
            error = UnavailableError
        raise error(f"HTTP {status}: {detail}")
    return response


def _documents(path: Path) -> list[Any]:
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror}", path=str(path)) from exc
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise DataError(f"invalid YAML: {exc}", path=str(path), line=None if mark is None else mark.line + 1) from exc


@policy_app.command("apply")
def apply(
    file: Annotated[Path, typer.Option("-f", "--file", help="YAML/JSON: policies, or OpenSLO v1 SLO documents.")],
    url: UrlOption = DEFAULT_URL,
    token: TokenOption = None,
    json_out: JsonOption = False,
) -> None:
    """Create or replace the policies in FILE (OpenSLO documents update the SLO part)."""
    with cli_errors():
        docs = _documents(file)
        if not docs:
            raise DataError("no documents", path=str(file))
        results: list[Any] = []
        if all(isinstance(d, dict) and str(d.get("apiVersion", "")).startswith("openslo/") for d in docs):
            response = _request(
                "POST",
                f"{url}/v1/openslo",
                token,
                content=file.read_bytes(),
                headers={"Content-Type": "application/yaml"},
            )
            results = response.json()["items"]
        else:
            for doc in docs:
                if not isinstance(doc, dict) or "name" not in doc:
                    raise DataError("every policy document needs a name", path=str(file))
                results.append(_request("PUT", f"{url}/v1/policies/{doc['name']}", token, json=doc).json())
        if json_out:
            print_json(results)
        else:
            for item in results:
                console.print(f"policy {item['name']} at version {item['version']}")


@policy_app.command("get")
def get(
    name: Annotated[str, typer.Argument(help="Policy name.")],
    url: UrlOption = DEFAULT_URL,
    openslo: Annotated[bool, typer.Option("--openslo", help="Print the SLO part as OpenSLO v1 YAML.")] = False,
    json_out: JsonOption = False,
) -> None:
    """Show one policy."""
    with cli_errors():
        if openslo:
            typer.echo(_request("GET", f"{url}/v1/policies/{name}/openslo", None).text, nl=False)
            return
        body = _request("GET", f"{url}/v1/policies/{name}", None).json()
        if json_out:
            print_json(body)
        else:
            import yaml

            typer.echo(f"# version {body['version']}, updated {body['updated_at']}")
            typer.echo(yaml.safe_dump(body["policy"], sort_keys=False), nl=False)


@policy_app.command("list")
def list_(url: UrlOption = DEFAULT_URL, json_out: JsonOption = False) -> None:
    """List policies with their mode and replica bounds."""
    with cli_errors():
        items = _request("GET", f"{url}/v1/policies", None).json()["items"]
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
    with cli_errors():
        _request("DELETE", f"{url}/v1/policies/{name}", token)
        if json_out:
            print_json({"deleted": name})
        else:
            console.print(f"policy {name} deleted")



@bench_app.command("controller-service")
def bench_controller_service(
    policies: Annotated[int, typer.Option(min=1, help="SLO policies.")] = 100,
    replicas: Annotated[int, typer.Option(min=1, help="Replicas over all policies.")] = 1000,
    ticks: Annotated[int, typer.Option(min=1, help="Timed ticks (after the warm-up).")] = 100,
    warmup_ticks: Annotated[int, typer.Option(min=0, help="Untimed ticks first.")] = 10,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic fleet.")] = 0,
    goal_ms: Annotated[float, typer.Option(min=0.0, help="Goal for the p99 of one service tick.")] = 100.0,
    json_out: JsonOption = False,
) -> None:
    """One service tick (store, source, actuator, core, decision log, metrics) against the core alone."""
    from rich.progress import Progress

    from bench.controller_service import ServiceBenchConfig, run_service_bench

    try:
        cfg = ServiceBenchConfig(
            policies=policies, replicas=replicas, ticks=ticks, warmup_ticks=warmup_ticks, seed=seed, goal_ms=goal_ms
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("service ticks", total=cfg.warmup_ticks + cfg.ticks)
        figures = run_service_bench(cfg, progress=lambda done, _total: bar.update(task, completed=done))
    if json_out:
        print_json(figures)
        return
    results = figures["results"]
    assert isinstance(results, list)
    for entry in [figures["baseline"], *results]:
        assert isinstance(entry, dict)
        console.print(
            f"{entry['name']}: median {entry['median_ms']:.2f} ms, p99 {entry['p99_ms']:.2f} ms "
            f"(cpu median {entry['cpu_median_ms']:.2f} ms)"
        )
