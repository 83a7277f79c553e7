"""Entry point of the ``moeslo`` command.

Each command group lives in its own module and registers itself here.  Heavy
imports (torch, statsmodels) happen inside the commands, so ``--help`` is fast.
"""

from __future__ import annotations

import typer

from cli.common import bench_app

app = typer.Typer(
    name="moeslo",
    help="Observability and SLO control plane for Mixture-of-Experts LLM inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(bench_app, name="bench")

# Command modules register themselves on `app` / `bench_app` when imported.
from cli import alerts as _alerts  # noqa: E402,F401
from cli import controller as _controller  # noqa: E402,F401
from cli import controller_bench as _controller_bench  # noqa: E402,F401
from cli import dashboards as _dashboards  # noqa: E402,F401
from cli import deploy as _deploy  # noqa: E402,F401
from cli import engine_bench as _engine_bench  # noqa: E402,F401
from cli import forecast as _forecast  # noqa: E402,F401
from cli import model as _model  # noqa: E402,F401
from cli import profile as _profile  # noqa: E402,F401
from cli import rebalance as _rebalance  # noqa: E402,F401
from cli import replay as _replay  # noqa: E402,F401
from cli import serve as _serve  # noqa: E402,F401
from cli import up as _up  # noqa: E402,F401
from cli import vllm_bench as _vllm_bench  # noqa: E402,F401

if __name__ == "__main__":
    app()
