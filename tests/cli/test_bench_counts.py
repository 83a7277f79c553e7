"""``moeslo bench`` refuses a count below one before any work starts (a checkpoint written, a model loaded)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["serve", "--rounds", "0"], "--rounds"),
        (["serve", "--max-in-flight", "0"], "--max-in-flight"),
        (["serve", "--render-layers", "0"], "--render-layers"),
        (["engine", "--repeats", "0"], "--repeats"),
        (["engine", "--prompt-len", "0"], "--prompt-len"),
        (["engine", "--new-tokens", "0"], "--new-tokens"),
        (["engine", "--batches", "1,0"], "--batches"),
        (["engine", "--batches", ","], "--batches"),
    ],
)
def test_counts_below_one_are_refused_first(monkeypatch: pytest.MonkeyPatch, args: list[str], says: str) -> None:
    """``--rounds 0`` wrote a checkpoint and failed on an empty max(); ``--repeats 0`` loaded both models first."""
    import engine.checkpoint
    from cli.main import app

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark started")

    monkeypatch.setattr(engine.checkpoint, "init_random_checkpoint", started)
    result = CliRunner().invoke(app, ["bench", *args])
    assert result.exit_code == 2, result.output
    assert says in result.output
