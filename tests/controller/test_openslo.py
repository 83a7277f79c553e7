"""OpenSLO import and export (pure): which model a new policy watches, names, targets."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from contracts.errors import ValidationError
from controller.openslo import apply_imported, parse_openslo


def _slo(service: str = "chat-frontend", model_matcher: str = 'model_name="Qwen/Qwen3-30B-A3B",',
         annotations: dict[str, str] | None = None, name: str = "chat-ttft", **objective: Any) -> dict[str, Any]:
    """A hand-written TTFT SLO, as a team writing OpenSLO (not moeslo's export) would."""
    metric = "vllm:time_to_first_token_seconds"
    return {
        "apiVersion": "openslo/v1",
        "kind": "SLO",
        "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
        "spec": {
            "service": service,
            "indicator": {"metadata": {"name": "ttft"}, "spec": {"ratioMetric": {
                "counter": True,
                "good": {"metricSource": {"type": "Prometheus", "spec": {
                    "query": f'sum(rate({metric}_bucket{{{model_matcher}le="0.5"}}[5m]))'}}},
                "total": {"metricSource": {"type": "Prometheus", "spec": {
                    "query": f"sum(rate({metric}_count{{{model_matcher.rstrip(',')}}}[5m]))"}}},
            }}},
            "timeWindow": [{"duration": "30d", "isRolling": True}],
            "budgetingMethod": "Occurrences",
            "objectives": [objective or {"target": 0.99}],
        },
    }


def _import(*docs: dict[str, Any]) -> dict[str, Any]:
    return {name: apply_imported(slos, None) for name, slos in parse_openslo(yaml.safe_dump_all(docs)).items()}


def test_a_new_policy_watches_the_model_its_queries_count_not_the_service() -> None:
    """The service names what users call (``chat-frontend``); the SLIs count ``model_name``: a policy on the
    service's name watched a model no engine serves."""
    (policy,) = _import(_slo()).values()
    assert policy.name == "chat-frontend"
    assert policy.target.model_dump() == {"kind": "model", "model": "Qwen/Qwen3-30B-A3B"}


def test_the_model_annotation_wins_and_escapes_are_read_back() -> None:
    (policy,) = _import(_slo(annotations={"moeslo.io/model": "served-name"})).values()
    assert policy.model_name == "served-name"
    (escaped,) = _import(_slo(model_matcher='model_name="a\\"b\\\\c",')).values()
    assert escaped.model_name == 'a"b\\c'


def test_a_new_policy_without_a_model_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match=r"cannot tell which model a new policy watches.*moeslo\.io/model"):
        _import(_slo(model_matcher=""))
    with pytest.raises(ValidationError, match="the queries name several models"):
        _import(_slo(model_matcher='model_name="a",model_name="b",'))


def test_two_slos_of_one_name_are_refused() -> None:
    itl = _slo(name="chat-ttft")
    for part in ("good", "total"):
        source = itl["spec"]["indicator"]["spec"]["ratioMetric"][part]["metricSource"]["spec"]
        source["query"] = source["query"].replace("time_to_first_token", "inter_token_latency").replace("0.5", "0.02")
    with pytest.raises(ValidationError) as caught:
        parse_openslo(yaml.safe_dump_all([_slo(), itl]))
    assert caught.value.problems == ("document 2: metadata.name 'chat-ttft' is used by document 1 too",)
    itl["metadata"]["name"] = "chat-itl"
    assert set(parse_openslo(yaml.safe_dump_all([_slo(), itl]))["chat-frontend"].objectives) == {"ttft", "itl"}
