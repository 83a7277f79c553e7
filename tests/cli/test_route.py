"""``moeslo route`` refuses what it cannot do before it binds a port."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], "exactly one of --replicas and --controller"),
        (["--replicas", "http://a:1", "--controller", "http://c:1"], "exactly one of"),
        (["--controller", "c:1"], "not an http(s) URL"),
        (["--replicas", "http://a:1", "--policy", "random"], "'random' is not one of"),
        (["--replicas", "a:1"], "not an http(s) URL"),
    ],
)
def test_route_refuses_bad_options(argv: list[str], expected: str) -> None:
    result = CliRunner().invoke(app, ["route", *argv])
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.split())


def test_route_reads_its_replicas_and_policy_from_the_environment() -> None:
    """deploy/base sets MOESLO_ROUTER_REPLICAS and MOESLO_ROUTER_POLICY from the router's ConfigMap."""
    env = {"MOESLO_ROUTER_REPLICAS": "ftp://engine:8000", "MOESLO_ROUTER_POLICY": "random"}
    result = CliRunner().invoke(app, ["route"], env=env)
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert "'ftp://engine:8000' is not an http(s) URL" in output and "'random' is not one of" in output
