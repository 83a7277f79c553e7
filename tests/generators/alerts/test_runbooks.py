"""Every alert links to its own section of the runbooks when given the runbooks page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli.main import app
from contracts.errors import ValidationError
from controller.policy_files import DEFAULT_POLICIES
from generators.alerts import AlertOptions, build_rule_groups
from generators.alerts.runbooks import heading_anchor, runbook_anchor, with_runbook_urls
from generators.manifests import deploy_files, load_overlays

ROOT = Path(__file__).resolve().parents[3]
PAGE = "https://wiki.example.com/ops/moeslo/runbooks.md"


def _runbook_sections() -> set[str]:
    text = (ROOT / "docs" / "runbooks.md").read_text(encoding="utf-8")
    return {heading_anchor(h) for h in re.findall(r"^## (.+)$", text, flags=re.MULTILINE)}


def test_heading_anchors_are_spelt_as_markdown_renderers_spell_them() -> None:
    assert heading_anchor("MoesloExpertImbalance") == "moesloexpertimbalance"
    assert heading_anchor("A, B (c)") == "a-b-c"
    assert runbook_anchor("MoesloITLMetricAbsent") == (
        "moeslottftmetricabsent-moesloitlmetricabsent-moesloexpertmetricsabsent")


def test_every_generated_alert_links_to_a_section_the_runbooks_have() -> None:
    (group,) = build_rule_groups(DEFAULT_POLICIES, AlertOptions(runbook_url=PAGE))
    sections = _runbook_sections()
    names = set()
    for alert in group.alerts:
        page, _, anchor = alert.annotations["runbook_url"].partition("#")
        assert page == PAGE and anchor in sections, (alert.alert, anchor, sections)
        names.add(alert.alert)
    assert len(names) == 10  # two burn rates, the stall, unhealthy, restarts, imbalance, forecast, three absent


def test_without_a_page_no_alert_has_a_runbook_url_and_recording_rules_never_do() -> None:
    (plain,) = build_rule_groups(DEFAULT_POLICIES)
    assert all("runbook_url" not in alert.annotations for alert in plain.alerts)
    (linked,) = with_runbook_urls((plain,), PAGE)
    assert len(linked.rules) == len(plain.rules) and len(linked.alerts) == len(plain.alerts)
    assert [r for r in linked.rules if r not in linked.alerts] == [r for r in plain.rules if r not in plain.alerts]


@pytest.mark.parametrize(("url", "message"), [
    ("wiki/runbooks.md", "expected an absolute http(s) URL"),
    ("ftp://wiki.example.com/runbooks", "expected an absolute http(s) URL"),
    ("https:///runbooks", "expected an absolute http(s) URL"),
    (f"{PAGE}#top", "has a fragment"),
    (f"{PAGE}#", "has a fragment"),
])  # fmt: skip
def test_a_runbook_url_that_cannot_take_a_section_is_refused(url: str, message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        build_rule_groups(DEFAULT_POLICIES, AlertOptions(runbook_url=url))


def test_the_cli_generators_take_the_runbooks_page(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["alerts", "generate", "--out", str(tmp_path / "a"), "--runbook-url", PAGE])
    assert result.exit_code == 0, result.output
    rules = yaml.safe_load((tmp_path / "a" / "moeslo-rules.yaml").read_text(encoding="utf-8"))
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert alerts and all(r["annotations"]["runbook_url"].startswith(PAGE + "#") for r in alerts)
    refused = runner.invoke(app, ["alerts", "generate", "--out", str(tmp_path / "b"), "--runbook-url", "runbooks"])
    assert refused.exit_code == 2 and "expected an absolute http(s) URL" in refused.output
    assert not (tmp_path / "b").exists()


def test_deploy_render_puts_the_links_in_every_prometheus_rule() -> None:
    files = deploy_files(DEFAULT_POLICIES, load_overlays(ROOT / "deploy"), runbook_url=PAGE)
    rule_files = [text for path, text in files.items() if "prometheusrule" in path]
    assert len(rule_files) >= 2  # the base's and each overlay's patch
    for text in rule_files:
        rule = yaml.safe_load(text)
        alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
        assert alerts and all(r["annotations"]["runbook_url"].startswith(PAGE + "#") for r in alerts)
