"""The alert generator, pure: windows and factors, bucket-edge refusal, drift of committed files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError as PydanticValidationError

from contracts.errors import DataError, ValidationError
from controller.policy import (
    FASTEST_ALERT_BUDGET_FRACTION,
    FASTEST_ALERT_WINDOW_S,
    MIN_WINDOW_S,
    LatencyObjective,
    LocalTarget,
    Objectives,
    Policy,
)
from controller.policy_files import DEFAULT_POLICIES, load_policies, parse_policies
from controller.slo import standard_burn_rate_windows
from generators.alerts import AlertOptions, build_rule_groups, render_alert_files
from generators.alerts.model import AlertingRule, RecordingRule

ROOT = Path(__file__).resolve().parents[3]


def _policy(name: str = "p", *, window: str = "30d", ttft: float = 0.5, itl: float = 0.02,
            target: float = 0.99) -> Policy:
    return Policy(
        name=name,
        target=LocalTarget(model="m"),
        window=window,
        objectives=Objectives(
            ttft=LatencyObjective(threshold_s=ttft, target=target),
            itl=LatencyObjective(threshold_s=itl, target=target),
        ),
    )


def _unchecked(name: str = "p", *, window: str = "30d", target: float = 0.99) -> Policy:
    """A policy with a window and targets the policy model would refuse (copied past its validation)."""
    objectives = Objectives(ttft=LatencyObjective(threshold_s=0.5, target=target),
                            itl=LatencyObjective(threshold_s=0.02, target=target))  # fmt: skip
    return _policy(name).model_copy(update={"window": window, "objectives": objectives})


def _burn_alerts(policy: Policy, slo: str = "ttft") -> list[AlertingRule]:
    (group,) = build_rule_groups([policy])
    return [a for a in group.alerts if a.labels["slo"] == slo and "long_window" in a.labels]


def test_thirty_day_window_gives_the_workbook_pairs_and_factors() -> None:
    alerts = _burn_alerts(_policy())
    got = {(a.labels["long_window"], a.labels["short_window"], a.labels["severity"], a.labels["burn_rate_threshold"])
           for a in alerts}
    assert got == {("1h", "5m", "page", "14.4"), ("6h", "30m", "page", "6"),
                   ("1d", "2h", "ticket", "3"), ("3d", "6h", "ticket", "1")}
    assert all(a.for_ for a in alerts)


def test_factors_follow_the_compliance_window() -> None:
    # 7 days: 2 % of the budget in 1 h is 0.02 * 168 = 3.36x, not 14.4x.
    # 1d/2h (0.7x) would fire while the SLO is met: it is left out.  3d/6h (0.23x) is held at 1x, so a burn that
    # would spend the budget within the week still tickets.
    alerts = _burn_alerts(_policy(window="7d"))
    by_long = {a.labels["long_window"]: a.labels["burn_rate_threshold"] for a in alerts}
    assert by_long == {"1h": "3.36", "6h": "1.4", "3d": "1"}
    assert "/ 0.01) > 3.36" in next(a.expr for a in alerts if a.labels["long_window"] == "1h")
    assert all(float(a.labels["burn_rate_threshold"]) >= 1 for a in _burn_alerts(_policy(window="10d")))


def test_window_too_short_for_any_burn_alert_is_refused() -> None:
    with pytest.raises(ValidationError) as info:
        build_rule_groups([_unchecked("short", window="1d"), _policy("ok", window="7d")])
    (problem,) = info.value.problems
    assert "policy 'short': compliance window 1d is too short for burn-rate alerts" in problem
    assert "1h/5m at 0.48x" in problem and "at least 50h" in problem


def test_rules_file_says_which_pairs_were_left_out() -> None:
    text = render_alert_files([_policy("week", window="7d"), _policy("month")])["moeslo-rules.yaml"]
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert any("a burn rate <= 1" in line for line in header)
    assert "# Policy week (7d window): left out 1d/2h (0.7x)." in header
    assert not any("Policy month" in line for line in header)


def test_recording_rules_read_the_bucket_at_the_threshold_for_every_window() -> None:
    (group,) = build_rule_groups([_policy(ttft=0.25)])
    records = [r for r in group.rules if isinstance(r, RecordingRule)]
    good_ttft = [r for r in records if r.record.startswith("moeslo:slo_good_events") and r.labels["slo"] == "ttft"]
    assert [r.record.rsplit("rate", 1)[1] for r in good_ttft] == ["5m", "30m", "1h", "2h", "6h", "1d", "3d"]
    assert all('le="0.25"' in r.expr and 'model_name="m"' in r.expr for r in good_ttft)
    good_itl = [r for r in records if r.record.startswith("moeslo:slo_good_events") and r.labels["slo"] == "itl"]
    assert all('le="0.02"' in r.expr for r in good_itl)


def test_every_burn_alert_carries_the_low_traffic_guard() -> None:
    """A request count over the pair's own short window: 20 in 5 minutes for a page, 20 in 6 hours for a ticket."""
    (group,) = build_rule_groups([_policy()])
    burn = [a for a in group.alerts if "long_window" in a.labels]
    assert len(burn) == 8
    seconds = {"5m": 300, "30m": 1800, "2h": 7200, "6h": 21600}
    for alert in burn:
        short = alert.labels["short_window"]
        assert f'moeslo:slo_total_events:rate{short}{{policy="p",slo="ttft"}} * {seconds[short]} >= 20' in alert.expr
    (fewer,) = build_rule_groups([_policy()], AlertOptions(min_requests=5))
    assert all(a.expr.endswith(">= 5") for a in fewer.alerts if "long_window" in a.labels)


def test_a_stalled_engine_pages_from_the_engines_own_series() -> None:
    """A request that never gets a first token is in no TTFT count: the stall page reads the in-flight gauges."""
    (group,) = build_rule_groups([_policy(ttft=0.25)])
    (stall,) = [a for a in group.alerts if a.alert == "MoesloEngineStalled"]
    assert stall.labels == {"severity": "page", "policy": "p", "slo": "ttft"} and stall.for_ == "3m"
    assert '{__name__=~"vllm:num_requests_running|vllm:num_requests_waiting",model_name="m"}) > 0' in stall.expr
    assert 'increase(vllm:time_to_first_token_seconds_count{model_name="m"}[5m])) == 0' in stall.expr
    assert 'increase(vllm:inter_token_latency_seconds_count{model_name="m"}[5m])) == 0' in stall.expr


def test_the_absent_tickets_watch_the_bucket_at_each_threshold() -> None:
    (group,) = build_rule_groups([_policy(ttft=1.0)])
    exprs = {a.alert: a.expr for a in group.alerts if a.alert.endswith("Absent")}
    ttft, itl = exprs["MoesloTTFTMetricAbsent"], exprs["MoesloITLMetricAbsent"]
    assert 'absent(vllm:time_to_first_token_seconds_bucket{model_name="m",le=~"1|1\\\\.0"})' in ttft
    assert 'absent(vllm:inter_token_latency_seconds_bucket{model_name="m",le=~"0\\\\.02"})' in itl
    assert exprs["MoesloExpertMetricsAbsent"] == 'absent(moe_layer_imbalance_cv{model_name="m"})'


def test_threshold_off_a_bucket_edge_is_refused_with_every_problem() -> None:
    with pytest.raises(ValidationError) as info:
        build_rule_groups([_policy("a", ttft=0.32), _policy("b", itl=0.03)])
    problems = info.value.problems
    assert len(problems) == 2
    assert "policy 'a': objectives.ttft.threshold_s = 0.32 is not a bucket edge of vllm:time_to_first_token_seconds" \
        in problems[0]
    assert "0.3, 0.35" in problems[0]
    assert "policy 'b': objectives.itl.threshold_s = 0.03" in problems[1]
    assert "0.025, 0.05" in problems[1]


def test_duplicate_policy_names_are_refused() -> None:
    with pytest.raises(ValidationError, match="'p' appears more than once"):
        build_rule_groups([_policy(), _policy()])


def test_a_burn_rate_the_target_cannot_reach_is_refused() -> None:
    # Target 0.9: budget 10 %, so the most any window can burn is 10x < 14.4x.
    with pytest.raises(ValidationError, match=r"needs burn rate 14.4, but with target 0.9 the most it can reach is 10"):
        build_rule_groups([_unchecked(target=0.9)])
    # A longer window only raises the factor: the way out is a shorter one (7 days: 3.36x, within 10x).
    with pytest.raises(ValidationError, match=r"raise the target or shorten the window"):
        build_rule_groups([_unchecked(target=0.9)])
    assert _burn_alerts(_unchecked(window="7d", target=0.9))


@pytest.mark.parametrize("window", ["1h", "24h", "49h", "179999s", "50h", "7d", "20d", "500h", "501h", "30d", "366d"])
@pytest.mark.parametrize("target", [0.5, 0.9, 0.93, 0.930556, 0.99, 0.999])
def test_the_policy_model_accepts_exactly_the_windows_and_targets_the_generator_turns_into_rules(
    window: str, target: float
) -> None:
    spec = {"name": "p", "target": {"kind": "local", "model": "m"}, "window": window,
            "objectives": {"ttft": {"threshold_s": 0.5, "target": target},
                           "itl": {"threshold_s": 0.02, "target": target}}}  # fmt: skip
    try:
        Policy.model_validate(spec)
    except PydanticValidationError as exc:
        model_refuses = [".".join(map(str, e["loc"])) for e in exc.errors()] == ["window"]
        assert model_refuses, exc.errors()
    else:
        model_refuses = False
    try:
        build_rule_groups([_unchecked(window=window, target=target)])
    except ValidationError:
        generator_refuses = True
    else:
        generator_refuses = False
    assert model_refuses == generator_refuses


def test_the_shortest_window_is_where_the_fastest_alert_reaches_one() -> None:
    assert MIN_WINDOW_S == 50 * 3600
    fastest = standard_burn_rate_windows(MIN_WINDOW_S)[0]
    assert (fastest.long_window_s, fastest.budget_fraction) == (FASTEST_ALERT_WINDOW_S, FASTEST_ALERT_BUDGET_FRACTION)
    assert fastest.burn_rate == pytest.approx(1.0)
    assert standard_burn_rate_windows(MIN_WINDOW_S - 1) == ()
    # The fastest pair has the highest factor at every window: it alone bounds the targets.
    for days in (3, 7, 30, 366):
        windows = standard_burn_rate_windows(days * 86400)
        assert max(windows, key=lambda w: w.burn_rate) == windows[0]


def test_imbalance_alert_waits_for_the_rebalancer() -> None:
    """``for:`` is at least twice the policy's sustain_s, so the rebalancer acts before a ticket."""

    def imbalance_for(sustain_s: int, options: AlertOptions | None = None) -> tuple[str, str]:
        base = _policy()
        objectives = base.objectives.model_copy(
            update={"imbalance": base.objectives.imbalance.model_copy(update={"sustain_s": sustain_s})}
        )
        (group,) = build_rule_groups([base.model_copy(update={"objectives": objectives})], options)
        (alert,) = [a for a in group.alerts if a.alert == "MoesloExpertImbalance"]
        return alert.for_, alert.annotations["description"]

    assert imbalance_for(300)[0] == "10m"  # the default sustain: 2 x 5m = the 10m floor
    for_, description = imbalance_for(1800)
    assert for_ == "1h"
    assert "> 0.15 for 1h;" in description
    assert imbalance_for(0)[0] == "10m"
    assert imbalance_for(600, AlertOptions(imbalance_for="30m"))[0] == "30m"


def test_override_for_applies_to_every_alert() -> None:
    (group,) = build_rule_groups([_policy()], AlertOptions(for_override="0s"))
    assert {a.for_ for a in group.alerts} == {"0s"}


def test_committed_alert_files_match_the_generator() -> None:
    for name, text in render_alert_files(DEFAULT_POLICIES).items():
        committed = ROOT / "alerts" / name
        assert committed.read_text(encoding="utf-8") == text, f"{committed} drifted: run `moeslo alerts generate`"


def test_policies_file_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "policies.yaml"
    path.write_text(yaml.safe_dump({"policies": [{"name": "x", "target": {"kind": "model", "model": "qwen"}}]}))
    (policy,) = load_policies(path)
    assert policy.model_name == "qwen"
    with pytest.raises(ValidationError) as info:
        parse_policies([{"name": "Bad Name", "target": {"kind": "model", "model": "q"}}, {"target": {}}])
    assert any(p.startswith("policies[0].name") for p in info.value.problems)
    assert any(p.startswith("policies[1].name") for p in info.value.problems)
    (tmp_path / "broken.yaml").write_text("policies: [\n")
    with pytest.raises(DataError, match=r"broken.yaml:\d+: invalid YAML"):
        load_policies(tmp_path / "broken.yaml")


def test_whole_number_thresholds_match_both_le_spellings() -> None:
    (group,) = build_rule_groups([_policy(ttft=1.0)])
    good = next(r for r in group.rules if isinstance(r, RecordingRule) and r.record.endswith("good_events:rate5m"))
    assert 'le=~"1|1\\\\.0"' in good.expr


def test_vllm_buckets_refuse_the_20ms_itl_edge_only_moeslo_has() -> None:
    message = r"0.02 is not a bucket edge of vllm:inter_token_latency_seconds \(vllm\)"
    with pytest.raises(ValidationError, match=message):
        build_rule_groups([_policy()], AlertOptions(engine="vllm"))
    (group,) = build_rule_groups([_policy(itl=0.025)], AlertOptions(engine="vllm"))
    assert any('le="0.025"' in r.expr for r in group.rules if isinstance(r, RecordingRule))


def test_cli_generate_writes_both_files_and_refuses_bad_policies(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    result = CliRunner().invoke(app, ["alerts", "generate", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alertmanager.yaml", "moeslo-rules.yaml"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntarget: {kind: model, model: m}\nobjectives: {ttft: {threshold_s: 0.32, target: 0.99}}\n")
    refused = CliRunner().invoke(app, ["alerts", "generate", "--out", str(tmp_path / "o"), "--policies", str(bad)])
    assert refused.exit_code == 2
    assert "not a bucket edge" in refused.output
