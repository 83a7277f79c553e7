"""``moeslo controller serve`` and ``moeslo policy apply``: flags reach the settings, an empty file is refused."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize("content", ["policies: []\n", "[]\n", ""], ids=["empty-list", "bare-list", "empty-file"])
def test_a_file_without_policies_is_refused(tmp_path: Path, content: str) -> None:
    """It applied nothing and said nothing (exit 0), where alerts and dashboards refuse the same file."""
    from typer.testing import CliRunner

    from cli.main import app

    empty = tmp_path / "p.yaml"
    empty.write_text(content)
    refused = CliRunner().invoke(app, ["policy", "apply", "-f", str(empty), "--url", "http://127.0.0.1:9"])
    assert refused.exit_code == 2 and refused.output == f"error: {empty}: no policies in the file\n"
