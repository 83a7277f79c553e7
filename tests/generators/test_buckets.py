"""Engines' bucket edges: every generator refuses an SLO threshold that is no edge of its target engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.catalogue import (
    ITL_BUCKETS_S,
    ITL_HISTOGRAM,
    TTFT_BUCKETS_S,
    TTFT_NORMALIZED_HISTOGRAM,
    VLLM_ITL_BUCKETS_S,
    vllm_buckets_by_metric,
    vllm_custom_buckets_json,
    vllm_slo_bucket_args,
)
from contracts.errors import ValidationError
from contracts.slo_defaults import ITL_THRESHOLD_S
from controller.policy import LatencyObjective, ModelTarget, Objectives, Policy
from generators.alerts import AlertOptions, build_rule_groups
from generators.buckets import ENGINES, check_thresholds, engine_buckets, vllm_engine
from generators.dashboards import render_dashboard_files


def _policy(itl: float = ITL_THRESHOLD_S, name: str = "p") -> Policy:
    return Policy(name=name, target=ModelTarget(model="m"),
                  objectives=Objectives(itl=LatencyObjective(threshold_s=itl, target=0.99)))


def test_stock_vllm_refuses_20ms_itl_naming_the_threshold_and_the_nearest_edges() -> None:
    with pytest.raises(ValidationError) as info:
        check_thresholds([_policy()], "vllm")
    (problem,) = info.value.problems
    assert "objectives.itl.threshold_s = 0.02 is not a bucket edge of vllm:inter_token_latency_seconds (vllm)" \
        in problem
    assert "the nearest edges are 0.01 and 0.025" in problem
    assert "--custom-histogram-buckets" in problem


def test_an_engine_with_the_slo_edges_accepts_20ms_itl() -> None:
    check_thresholds([_policy()], "moeslo")
    check_thresholds([_policy()], "vllm-slo-buckets")
    assert 0.02 in ENGINES["vllm-slo-buckets"].edges[ITL_HISTOGRAM]
    assert 0.02 not in ENGINES["vllm"].edges[ITL_HISTOGRAM]


def test_a_threshold_above_every_edge_names_the_largest() -> None:
    with pytest.raises(ValidationError, match=r"the nearest edges are 80.0\. "):
        check_thresholds([_policy(itl=100.0)], "vllm")


def test_the_flag_vllm_gets_is_the_catalogue_edges() -> None:
    flag, value = vllm_slo_bucket_args()
    assert flag == "--custom-histogram-buckets"
    assert json.loads(value) == {"time_to_first_token": list(TTFT_BUCKETS_S),
                                 "inter_token_latency": list(ITL_BUCKETS_S)}
    assert " " not in value  # one word in a container's args
    assert vllm_engine(json.loads(value)) is ENGINES["vllm-slo-buckets"]
    assert vllm_engine(None) is ENGINES["vllm"]
    other = vllm_engine({"inter_token_latency": [0.01, 0.03]})
    assert other.name == "vllm (custom buckets)" and other.edges[ITL_HISTOGRAM] == (0.01, 0.03)
    assert vllm_buckets_by_metric({"request_latency": [1.0]})[ITL_HISTOGRAM] == VLLM_ITL_BUCKETS_S
    assert vllm_custom_buckets_json({"inter_token_latency": (0.5,)}) == '{"inter_token_latency":[0.5]}'


def test_the_normalized_ttft_histogram_is_checked_against_its_own_edges_on_every_engine() -> None:
    """A vLLM with custom time_to_first_token buckets had its normalized TTFT threshold checked against those:
    0.5 s with an allowance was refused (0.3 s would have been taken, where the plugin writes no 0.3 bucket)."""
    custom = vllm_engine({"time_to_first_token": [0.1, 0.3, 1.0, 5.0], "inter_token_latency": [0.01, 0.02, 0.05]})
    ttft = {"threshold_s": 0.5, "target": 0.99, "per_1k_prompt_tokens_s": 0.05}
    allowance = Policy.model_validate({"name": "a", "target": {"kind": "model", "model": "m"},
                                       "objectives": {"ttft": ttft}})  # fmt: skip
    check_thresholds([allowance], custom)
    flat = allowance.model_copy(update={"objectives": _policy().objectives})
    with pytest.raises(ValidationError, match=r"0\.5 is not a bucket edge of vllm:time_to_first_token_seconds "
                                              r"\(vllm \(custom buckets\)\); the nearest edges are 0\.3 and 1\.0"):
        check_thresholds([flat], custom)
    for engine in (*ENGINES.values(), custom):
        assert engine.edges[TTFT_NORMALIZED_HISTOGRAM] == TTFT_BUCKETS_S, engine.name


def test_alerts_and_dashboards_check_the_same_edges() -> None:
    policy = _policy()
    for engine in ("vllm", ENGINES["vllm"]):
        with pytest.raises(ValidationError, match="not a bucket edge"):
            build_rule_groups([policy], AlertOptions(engine=engine))  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="not a bucket edge"):
            render_dashboard_files([policy], engine)  # type: ignore[arg-type]
    (group,) = build_rule_groups([policy], AlertOptions(engine="vllm-slo-buckets"))
    assert any('le="0.02"' in rule.to_dict().get("expr", "") for rule in group.rules)
    assert render_dashboard_files([policy], "vllm-slo-buckets")


def test_unknown_engine_is_refused() -> None:
    with pytest.raises(ValidationError, match="engine must be one of moeslo, vllm, vllm-slo-buckets"):
        engine_buckets("sglang")


def _flat(text: str) -> str:
    """Console output without the terminal's line wrapping."""
    return " ".join(text.split())


def test_cli_generators_take_the_engine(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    refused = runner.invoke(app, ["alerts", "generate", "--out", str(tmp_path / "a"), "--engine", "vllm"])
    assert refused.exit_code == 2 and "the nearest edges are 0.01 and 0.025" in _flat(refused.output)
    accepted = runner.invoke(app, ["alerts", "generate", "--out", str(tmp_path / "a"), "--engine", "vllm-slo-buckets"])
    assert accepted.exit_code == 0, accepted.output
    refused = runner.invoke(app, ["dashboards", "generate", "--out", str(tmp_path / "d"), "--engine", "vllm"])
    assert refused.exit_code == 2 and "not a bucket edge" in _flat(refused.output)
    accepted = runner.invoke(app, ["dashboards", "generate", "--out", str(tmp_path / "d"),
                                   "--engine", "vllm-slo-buckets"])
    assert accepted.exit_code == 0, accepted.output
    unknown = runner.invoke(app, ["alerts", "generate", "--out", str(tmp_path / "a"), "--engine", "sglang"])
    assert unknown.exit_code == 2 and "engine must be one of" in _flat(unknown.output)
