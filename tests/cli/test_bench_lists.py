"""``moeslo bench`` refuses a list it cannot read by the option's name, before any work starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["engine", "--batches", "1,x"], "error: --batches: 'x' is not an integer"),
        (["replay", "--week", "", "--traces", "conv", "--errors=-0.2,nan"],
         "error: --errors: 'nan' is not a finite number"),
        (["replay", "--week", "", "--traces", "conv", "--startups", "60,soon"],
         "error: --startups: 'soon' is not a finite number"),
    ],
)
def test_lists_that_are_not_numbers_are_refused_by_name(args: list[str], says: str) -> None:
    """They said "invalid literal for int() with base 10: 'x'", and took nan as a capacity error."""
    from cli.main import app

    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split())
