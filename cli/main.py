"""Entry point of the ``moeslo`` command: builds ``app`` from the sub-apps and commands each module exports.

Command modules never import this one, so ``python -m cli.main`` and the
``moeslo`` entry point build the same single app.  Heavy imports (torch,
statsmodels) happen inside the commands, so ``--help`` is fast.
"""

from __future__ import annotations

import typer

from cli.alerts import alerts_app
from cli.bench import bench_app
from cli.controller import controller_app, policy_app
from cli.dashboards import dashboards_app
from cli.deploy import deploy_app
from cli.forecast import forecast_app
from cli.model import model_app
from cli.profile import profile
from cli.rebalance import rebalance
from cli.replay import replay
from cli.route import route
from cli.serve import serve
from cli.up import up

app = typer.Typer(
    name="moeslo",
    help="Observability and SLO control plane for Mixture-of-Experts LLM inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(bench_app, name="bench")
app.add_typer(alerts_app, name="alerts")
app.add_typer(controller_app, name="controller")
app.add_typer(policy_app, name="policy")
app.add_typer(dashboards_app, name="dashboards")
app.add_typer(deploy_app, name="deploy")
app.add_typer(forecast_app, name="forecast")
app.add_typer(model_app, name="model")
app.command("profile")(profile)
app.command("rebalance")(rebalance)
app.command("replay")(replay)
app.command("route")(route)
app.command("serve")(serve)
app.command("up")(up)

if __name__ == "__main__":
    app()
