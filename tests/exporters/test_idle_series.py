"""An engine that started and has served nothing yet already has every series the metrics-absent tickets look for:
those tickets say the engine is down, not scraped or renamed, never that it is idle."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from contracts.ttft_objective import TtftAllowance
from controller.policy import Policy
from exporters.app import ServeOptions, build_stack
from exporters.ttft_normalized import NormalizedTtftObserver
from generators.alerts.rules import build_rule_groups

ALLOWANCE = TtftAllowance(1000, 0.05)
_SELECTOR = re.compile(r"absent\(([^{]+)\{(.*?)\}\)")
_MATCHER = re.compile(r'(\w+)(=~|=)"((?:[^"\\]|\\.)*)"')


def _policies(model: str) -> list[Policy]:
    """A flat TTFT objective (vLLM's own histogram) and one with a long-prompt allowance (the normalized one)."""
    allowance = {"reference_prompt_tokens": ALLOWANCE.reference_prompt_tokens,
                 "per_1k_prompt_tokens_s": ALLOWANCE.per_1k_prompt_tokens_s}  # fmt: skip
    return [
        Policy.model_validate({"name": "flat", "target": {"kind": "model", "model": model}}),
        Policy.model_validate({"name": "long", "target": {"kind": "model", "model": model},
                               "objectives": {"ttft": {"threshold_s": 0.5, "target": 0.99, **allowance}}}),
    ]


def _absent_selectors(policies: list[Policy], alerts: tuple[str, ...]) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """Each ``absent(metric{...})`` of the named alerts, as the metric and its matchers."""
    selectors = []
    for group in build_rule_groups(policies):
        for rule in group.rules:
            if getattr(rule, "alert", None) in alerts:
                for metric, matchers in _SELECTOR.findall(rule.expr):
                    selectors.append((metric, _MATCHER.findall(matchers)))
    assert selectors
    return selectors


def _matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, literal in matchers:
        value = literal.encode().decode("unicode_escape")  # the PromQL string literal's escapes
        if op == "=" and labels.get(name) != value:
            return False
        if op == "=~" and re.fullmatch(value, labels.get(name, "")) is None:
            return False
    return True


def _missing(body: bytes, selectors: list[tuple[str, list[tuple[str, str, str]]]]) -> list[str]:
    samples = [s for family in text_string_to_metric_families(body.decode()) for s in family.samples]
    return [f"{metric}{matchers}" for metric, matchers in selectors
            if not any(s.name == metric and _matches(s.labels, matchers) for s in samples)]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("ep", [1, 2])
def test_the_embedded_engine_idle_has_every_series_the_absent_tickets_look_for(tiny_checkpoint: Path,
                                                                                ep: int) -> None:  # fmt: skip
    """Its balance gauges are NaN until the first routed step (the warm-up's routing is forgotten), as on vLLM."""
    stack = build_stack(ServeOptions(checkpoint=tiny_checkpoint, model_name="tiny-moe", kv_cache_mb=1.0, ep=ep,
                                     ttft_allowances=(ALLOWANCE,)))  # fmt: skip
    try:
        assert stack.prometheus is not None
        body = stack.prometheus.render()
    finally:
        stack.engine.shutdown()
    alerts = ("MoesloTTFTMetricAbsent", "MoesloITLMetricAbsent", "MoesloExpertMetricsAbsent")
    assert _missing(body, _absent_selectors(_policies("tiny-moe"), alerts)) == []
    values = {(s.name, s.labels.get("layer"), s.labels.get("rank")): s.value
              for family in text_string_to_metric_families(body.decode()) for s in family.samples}  # fmt: skip
    assert values[("moe_layer_imbalance_cv", "1", None)] != values[("moe_layer_imbalance_cv", "1", None)]  # NaN
    assert values[("moe_rank_tokens_total", None, str(ep - 1))] == 0


def test_the_vllm_normalized_ttft_idle_has_the_series_the_absent_ticket_looks_for() -> None:
    """The stat logger's engine has its labelled histogram before a request finishes (vLLM's own TTFT
    histogram has its series from start)."""
    registry = CollectorRegistry()
    observer = NormalizedTtftObserver(registry, allowances=(ALLOWANCE,))
    observer.add_engine("m", "1")
    body = generate_latest(registry)
    selectors = [s for s in _absent_selectors(_policies("m"), ("MoesloTTFTMetricAbsent",))
                 if s[0].startswith("moeslo_ttft_normalized_seconds")]  # fmt: skip
    assert len(selectors) == 2  # _count and the threshold's bucket
    assert _missing(body, selectors) == []
    assert registry.get_sample_value("moeslo_ttft_normalized_seconds_count", {
        "model_name": "m", "engine": "1", "reference_prompt_tokens": "1000", "per_1k_prompt_tokens_s": "0.05"}) == 0
