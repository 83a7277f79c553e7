"""``moeslo route``: the entry router in front of a set of replicas (engines or vLLM servers)."""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.common import cli_errors, console, log_level, positive
from cli.listen import listener_for, listening_port
from contracts.slo_defaults import TTFT_REFERENCE_PROMPT_TOKENS
from contracts.urls import http_url, redacted_url

if TYPE_CHECKING:
    from aiohttp import web

POLICIES = "cost|prefix|least-loaded|round-robin"


def run_on_socket(app: web.Application, listener: socket.socket, **options: Any) -> None:
    """:func:`router.app.run` on a socket bound already (its host and port would have aiohttp bind another)."""
    from aiohttp import web

    web.run_app(app, sock=listener, handler_cancellation=True, print=None, **options)


# long: a typer command is its option list; the work is in router.app.
def route(
    replicas: Annotated[
        str | None,
        typer.Option(envvar="MOESLO_ROUTER_REPLICAS", help="Replica base URLs, comma-separated (http://host:port,...)."),
    ] = None,
    controller: Annotated[
        str | None,
        typer.Option(envvar="MOESLO_ROUTER_CONTROLLER",
                     help="Controller URL to read the replica set from (it follows the replicas the controller "
                          "adds and removes)."),
    ] = None,
    controller_policy: Annotated[
        str | None,
        typer.Option(envvar="MOESLO_ROUTER_CONTROLLER_POLICY",
                     help="With --controller: the policy whose replicas to route to (default: its only one)."),
    ] = None,
    policy: Annotated[str, typer.Option(envvar="MOESLO_ROUTER_POLICY", help=f"Routing policy: {POLICIES}.")] = "cost",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8080,
    admission: Annotated[
        str, typer.Option(help="Every replica over the TTFT objective: reject (429 + Retry-After) or queue.")
    ] = "reject",
    ttft_objective_s: Annotated[float, typer.Option(help="TTFT objective admission and the cost policy use.")] = 0.5,
    ttft_per_1k_prompt_tokens_s: Annotated[
        float, typer.Option(min=0.0, help="The policy's TTFT allowance per 1K prompt tokens past the reference "
                                          "length (0: the flat objective).")
    ] = 0.0,
    ttft_reference_prompt_tokens: Annotated[
        int, typer.Option(min=0, help="Prompt length the TTFT objective is stated at.")
    ] = TTFT_REFERENCE_PROMPT_TOKENS,
    prefill_tokens_per_s: Annotated[
        float, typer.Option(callback=positive, help="Prompt tokens per second of each replica.")
    ] = 4000.0,
    itl_base_s: Annotated[float, typer.Option(help="ITL of a replica with an empty batch (cost policy).")] = 0.01,
    itl_per_seq_s: Annotated[
        float | None, typer.Option(help="ITL each running sequence adds (default: a step doubling at 128).")
    ] = None,
    cached_token_cost: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Prefill a cached prompt token still costs, relative to an "
                                                   "uncached one (a replica profile's cached_token_cost).")
    ] = 0.0,
    prefix_cache_tokens: Annotated[
        int, typer.Option(help="Prompt tokens each replica's prefix cache is assumed to hold (cost policy).")
    ] = 262_144,
    scrape_interval_s: Annotated[float, typer.Option(help="Read each replica's /metrics this often.")] = 0.5,
    max_queue_s: Annotated[float, typer.Option(help="Queue mode: longest hold before the 429.")] = 30.0,
    max_queued: Annotated[int, typer.Option(min=1, help="Queue mode: most requests held at once (then 429).")] = 1024,
    log_level: Annotated[
        str, typer.Option(callback=log_level, help="Log level (debug, info, warning, error).")
    ] = "warning",
) -> None:
    """Route OpenAI completions to the replica where each is predicted to be served soonest."""
    if (replicas is None) == (controller is None):
        raise typer.BadParameter("give exactly one of --replicas and --controller")
    with cli_errors():
        from contracts.ttft_objective import TtftAllowance
        from router.app import create_app, run
        from router.config import RouterConfig
        from router.types import CostModel

        config = RouterConfig(
            replicas=tuple(url.strip().rstrip("/") for url in (replicas or "").split(",") if url.strip()),
            controller_url=controller.rstrip("/") if controller else None,
            controller_policy=controller_policy or None,  # an empty ConfigMap value: the controller's only policy
            policy=policy, admission=admission,  # type: ignore[arg-type]  # RouterConfig validates it
            cost=CostModel(ttft_objective_s=ttft_objective_s, decode_step_s=itl_base_s, itl_per_seq_s=itl_per_seq_s,
                           cached_token_cost=cached_token_cost,
                           ttft_allowance=TtftAllowance(ttft_reference_prompt_tokens, ttft_per_1k_prompt_tokens_s)),
            prefill_tokens_per_s=prefill_tokens_per_s, max_queued=max_queued,
            scrape_interval_s=scrape_interval_s, max_queue_s=max_queue_s, prefix_cache_tokens=prefix_cache_tokens,
        )
        upstream = ", ".join(config.replicas) or f"the replicas {redacted_url(controller or '')} lists"
        listener = listener_for(host, port)
        console.print(f"routing ({policy}) on {http_url(host, listening_port(listener, port))} to {upstream}")
        logging.basicConfig(level=log_level.upper())
        if listener is None:
            run(create_app(config), host=host, port=port, shutdown_timeout=5)
        else:  # --port 0: on the socket bound to the port named above (host and port would bind one more)
            run_on_socket(create_app(config), listener, shutdown_timeout=5)
