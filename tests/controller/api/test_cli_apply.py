"""``moeslo policy apply`` against the app served in this process: what ``policy get`` prints applies back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from controller.api import create_app
from controller.config import ControllerSettings
from controller.store import Store
from tests.controller.api.page.browser import serving

TOKEN = "apply-token"
POLICY = "name: chat\ntarget: {kind: model, model: Qwen/Qwen3-30B-A3B}\nmode: advisory\n"


@pytest.fixture()
def url(tmp_path: Path) -> Iterator[str]:
    settings = ControllerSettings(db=str(tmp_path / "c.db"), api_token=TOKEN)
    with serving(create_app(settings, Store(settings.db_url))) as base:
        yield base


def _moeslo(*argv: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(argv))
    return result.exit_code, result.output


@pytest.mark.parametrize("as_json", [False, True], ids=["yaml", "json"])
def test_an_openslo_export_applies_back(tmp_path: Path, url: str, as_json: bool) -> None:
    """``policy get --openslo --json`` prints one JSON list of documents, which apply took for policies."""
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    assert _moeslo("policy", "apply", "-f", str(policy_file), "--url", url, "--token", TOKEN)[0] == 0
    code, exported = _moeslo("policy", "get", "chat", "--url", url, "--openslo", *(["--json"] if as_json else []))
    assert code == 0, exported
    export_file = tmp_path / ("chat.json" if as_json else "chat.yaml")
    export_file.write_text(exported.replace("0.99", "0.995"))
    # Onto the policy it came from (the SLO part changes), and onto a controller that lacks it (created).
    for _ in ("update", "create"):
        code, output = _moeslo("policy", "apply", "-f", str(export_file), "--url", url, "--token", TOKEN, "--json")
        assert code == 0, output
        assert [item["name"] for item in json.loads(output)] == ["chat"]
        code, got = _moeslo("policy", "get", "chat", "--url", url, "--json")
        policy = json.loads(got)["policy"]
        assert policy["objectives"]["ttft"]["target"] == 0.995 and policy["objectives"]["itl"]["target"] == 0.995
        assert policy["target"]["model"] == "Qwen/Qwen3-30B-A3B"
        assert _moeslo("policy", "delete", "chat", "--url", url, "--token", TOKEN)[0] == 0


def test_a_file_with_two_policies_of_one_name_applies_none(tmp_path: Path, url: str) -> None:
    """The second ``chat`` replaced the first without a word (and left version 2 behind)."""
    policy_file = tmp_path / "twice.yaml"
    policy_file.write_text(f"{POLICY}---\n{POLICY.replace('advisory', 'enforce')}")
    code, output = _moeslo("policy", "apply", "-f", str(policy_file), "--url", url, "--token", TOKEN)
    assert code == 2 and "policy 'chat' is defined twice" in " ".join(output.split())
    assert _moeslo("policy", "get", "chat", "--url", url)[0] == 2  # nothing written


def test_a_url_with_a_trailing_slash_reaches_the_controller(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--url http://host:port/`` asked for ``//v1/policies`` and said the policies were "not found"."""
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    slashed = f"{url}/"
    code, output = _moeslo("policy", "apply", "-f", str(policy_file), "--url", slashed, "--token", TOKEN)
    assert code == 0 and "policy chat at version 1" in output, output
    code, output = _moeslo("policy", "list", "--url", f"{url}//", "--json")
    assert code == 0 and [item["name"] for item in json.loads(output)] == ["chat"], output
    monkeypatch.setenv("MOESLO_CONTROLLER_URL", slashed)  # the variable as the flag
    code, output = _moeslo("policy", "get", "chat", "--json")
    assert code == 0 and json.loads(output)["version"] == 1, output
    code, output = _moeslo("policy", "delete", "chat", "--token", TOKEN)
    assert code == 0 and "policy chat deleted" in output, output
