"""``moeslo controller serve``: its flags reach the controller's settings."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _without_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOESLO_DEBUG", raising=False)


def test_the_shutdown_grace_is_a_flag_and_reaches_the_settings() -> None:
    from typer.testing import CliRunner

    from cli.main import app

    shown = CliRunner().invoke(app, ["controller", "serve", "--help"])
    assert shown.exit_code == 0 and "--shutdown-grace-s" in shown.output
    # Past the setting's bound: refused by the settings, which name it (so the flag reached them).
    refused = CliRunner().invoke(app, ["controller", "serve", "--shutdown-grace-s", "5000", "--port", "0"])
    out = " ".join(refused.output.split())
    assert refused.exit_code != 0 and "shutdown_grace_s" in out and "Traceback" not in out
