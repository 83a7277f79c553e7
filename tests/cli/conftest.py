"""Fixtures of the command-line tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def never_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """``moeslo up`` must not start its stack: what the test runs is refused first."""
    import stack

    def run_stack(*args: object, **kwargs: object) -> None:
        raise AssertionError("the stack started")

    monkeypatch.setattr(stack, "run_stack", run_stack)
