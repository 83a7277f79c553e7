"""The boundary dataclasses: frozen, keyword-only, reason codes as plain strings."""

from __future__ import annotations

import dataclasses
import json
from types import ModuleType

import pytest

from controller import advisors as advisors_module
from controller import core as core_module
from controller import slo
from controller import types as types_module
from controller.advisors import ReactiveAdvisor, ReactiveConfig
from controller.types import (
    ACTIONS,
    Advice,
    Decision,
    Effects,
    PolicyObservation,
    Reason,
    ScalingAdvisor,
    SliSnapshot,
    TickInput,
)


def decision(policy: str, action: str = "hold", apply: bool = False) -> Decision:
    return Decision(
        policy=policy,
        action=action,  # type: ignore[arg-type]
        current_replicas=3,
        desired_replicas=5 if action == "scale_up" else 3,
        reasons=(action,),
        detail="",
        inputs={"queue_depth": 2.0},
        decided_at_s=10.0,
        apply=apply,
    )


@pytest.mark.parametrize("cls", [SliSnapshot, PolicyObservation, TickInput, Advice, Decision, Effects])
def test_boundary_types_are_frozen_and_keyword_only(cls: type) -> None:
    params = dataclasses.fields(cls)
    assert all(f.kw_only for f in params), cls
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_frozen_means_frozen() -> None:
    obs = PolicyObservation(policy="p", observed_at_s=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        obs.current_replicas = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        PolicyObservation("p", 1.0)  # type: ignore[call-arg]


def test_missing_values_default_to_none_not_zero() -> None:
    obs = PolicyObservation(policy="p", observed_at_s=1.0)
    for name in ("current_replicas", "ready_replicas", "queue_depth", "running_requests", "kv_cache_usage"):
        assert getattr(obs, name) is None, name
    assert obs.sli is None
    assert obs.errors == ()


def test_reason_codes_are_the_documented_strings() -> None:
    for code in (
        "scale_up",
        "scale_down",
        "hold",
        "insufficient_data",
        "stale_data",
        "cooldown",
        "at_max",
        "at_min",
        "max_step",
        "mode_advisory",
        "mode_off",
        "slo_burn",
        "queue_depth",
    ):
        assert Reason(code) == code
    assert set(ACTIONS) <= {str(r) for r in Reason}
    assert json.dumps([Reason.COOLDOWN]) == '["cooldown"]'


def test_units_are_in_the_names() -> None:
    """Every time-like field says its unit."""
    time_like = {"at", "now", "horizon", "age", "interval", "tick"}
    seen = set()
    for cls in (SliSnapshot, PolicyObservation, TickInput, Advice, Decision, Effects):
        for f in dataclasses.fields(cls):
            if time_like & set(f.name.split("_")) or f.name.startswith("window"):
                assert f.name.endswith("_s"), f"{cls.__name__}.{f.name} has no unit"
                seen.add(f.name)
    assert {"observed_at_s", "now_s", "decided_at_s", "next_tick_s", "forecast_horizon_s"} <= seen


def test_sli_imbalance_max() -> None:
    assert SliSnapshot(observed_at_s=0.0).imbalance_cv_max is None
    assert SliSnapshot(observed_at_s=0.0, imbalance_cv_per_layer=(0.1, 0.3, 0.2)).imbalance_cv_max == 0.3


def test_decision_delta_and_effects_lookup() -> None:
    up = decision("a", "scale_up", apply=True)
    assert up.delta_replicas == 2
    assert dataclasses.replace(up, desired_replicas=None).delta_replicas == 0
    effects = Effects(decisions=(up, decision("b")), next_tick_s=25.0, diagnostics={})
    assert effects.for_policy("b").action == "hold"
    assert effects.to_apply == (up,)
    with pytest.raises(KeyError):
        effects.for_policy("zzz")


def test_decision_serializes_to_json() -> None:
    payload = json.dumps(dataclasses.asdict(decision("a", "scale_up")))
    assert json.loads(payload)["inputs"] == {"queue_depth": 2.0}


def test_reactive_advisor_satisfies_the_protocol() -> None:
    assert isinstance(ReactiveAdvisor(), ScalingAdvisor)
    assert not isinstance(object(), ScalingAdvisor)


@pytest.mark.parametrize("module", [slo, types_module, core_module, advisors_module])
def test_public_surfaces_are_sorted_and_complete(module: ModuleType) -> None:
    def isort_key(name: str) -> tuple[int, str]:  # ruff's RUF022 order: CONSTANTS, Classes, functions
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert module.__all__ == sorted(module.__all__, key=isort_key)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_reactive_config_reports_every_problem_at_once() -> None:
    with pytest.raises(ValueError) as caught:
        ReactiveConfig(queue_per_replica_high=-1, target_kv_usage=2.0, max_up_factor=0.5)
    message = str(caught.value)
    for field_name in ("queue_per_replica_high", "target_kv_usage", "max_up_factor"):
        assert field_name in message


def test_metric_docs_list_every_reason_code() -> None:
    """docs/metrics.md is the metric-name contract: the ``reason`` label values must all be there."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    line = next(ln for ln in docs.splitlines() if "the codes of `controller.types.Reason`" in ln)
    listed = {code.strip(" `.") for code in line.split(":", 1)[1].split(",")}
    assert listed == {str(r) for r in Reason}
