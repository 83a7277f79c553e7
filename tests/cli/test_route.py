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
        (["--controller", "http://c:1"], "does not list replica URLs"),
        (["--replicas", "http://a:1", "--policy", "random"], "'random' is not one of"),
        (["--replicas", "a:1"], "not an http(s) URL"),
    ],
)
def test_route_refuses_bad_options(argv: list[str], expected: str) -> None:
    result = CliRunner().invoke(app, ["route", *argv])
    assert result.exit_code == 2, result.output
    assert expected in " ".join(result.output.split())
