"""``moeslo profile`` refuses a rate list it cannot read by the option's name, before it reaches the engine."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner


@pytest.mark.parametrize(
    ("rates", "says"),
    [
        ("a,b", "error: --rates: 'a' is not a finite number; --rates: 'b' is not a finite number"),
        ("1,inf", "error: --rates: 'inf' is not a finite number"),
    ],
)
def test_rates_that_are_not_numbers_are_refused_by_name(rates: str, says: str) -> None:
    """It said "could not convert string to float: 'a'", and took inf as a rate."""
    from cli.main import app

    result = CliRunner().invoke(app, ["profile", "--url", "http://127.0.0.1:9", "--rates", rates])
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split())
