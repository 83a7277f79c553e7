"""The mission's objectives in every overlay, and the engine each policy is checked against read from the
workload manifests (vLLM's --custom-histogram-buckets)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from contracts.catalogue import VLLM_CUSTOM_BUCKETS_FLAG, vllm_custom_buckets_json
from contracts.errors import ValidationError
from contracts.slo_defaults import ITL_THRESHOLD_S, LATENCY_TARGET, MAX_IMBALANCE_CV, TTFT_THRESHOLD_S
from controller.policy import ModelTarget, Policy
from generators.buckets import ENGINES
from generators.manifests import Overlay, build, load_overlays, policy_engines
from generators.manifests.engines import command_line, container_engine, flag_value, pod_specs, workload_engines
from generators.manifests.generated import overlay_files

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = load_overlays(DEPLOY)


def _vllm_containers(resources: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{r['kind']}/{r['metadata']['name']}", c) for r in resources for spec in pod_specs(r)
            for c in spec.get("containers", []) if c["image"].split(":")[0] == "moeslo-vllm"]


def test_every_overlay_keeps_the_missions_objectives() -> None:
    assert set(OVERLAYS) >= {"embedded-cpu", "vllm-gpu", "vllm-multinode"}
    for name, overlay in OVERLAYS.items():
        assert overlay.policies, name
        for policy in overlay.policies:
            objectives = policy.objectives
            assert (objectives.ttft.threshold_s, objectives.ttft.target) == (TTFT_THRESHOLD_S, LATENCY_TARGET), name
            assert (objectives.itl.threshold_s, objectives.itl.target) == (ITL_THRESHOLD_S, LATENCY_TARGET), name
            assert objectives.imbalance.max_cv == MAX_IMBALANCE_CV, name
            rendered = build(DEPLOY / "overlays" / name)
            rules = json.dumps([r for r in rendered if r["kind"] == "PrometheusRule"])
            assert 'le=\\"0.02\\"' in rules and 'le=\\"0.5\\"' in rules, name


@pytest.mark.parametrize("overlay", ["vllm-gpu", "vllm-multinode"])
def test_every_serving_vllm_gets_the_slo_edges(overlay: str) -> None:
    containers = _vllm_containers(build(DEPLOY / "overlays" / overlay))
    serving = [(where, c) for where, c in containers if "--headless" not in command_line(c)]
    assert serving
    for where, container in serving:
        assert flag_value(command_line(container), VLLM_CUSTOM_BUCKETS_FLAG) == vllm_custom_buckets_json(), where
        engine = container_engine(container, where)
        assert engine is not None and engine.edges is ENGINES["vllm-slo-buckets"].edges
    assert {e.name for e in policy_engines(OVERLAYS[overlay]).values()} == {"vllm-slo-buckets"}
    assert {e.name for e in policy_engines(OVERLAYS["embedded-cpu"]).values()} == {"moeslo"}


def _without_bucket_flag(overlay: Overlay) -> Overlay:
    workloads = copy.deepcopy(list(overlay.workloads))
    for resource in workloads:
        for spec in pod_specs(resource):
            for container in spec.get("containers", []):
                container["args"] = [a for a in container.get("args", []) if VLLM_CUSTOM_BUCKETS_FLAG not in a]
    return Overlay(policies=overlay.policies, workloads=tuple(workloads))


@pytest.mark.parametrize("overlay", ["vllm-gpu", "vllm-multinode"])
def test_a_20ms_itl_objective_on_vllm_without_the_flag_is_refused(overlay: str) -> None:
    assert overlay_files(overlay, OVERLAYS[overlay])  # with the flag: accepted
    with pytest.raises(ValidationError) as info:
        overlay_files(overlay, _without_bucket_flag(OVERLAYS[overlay]))
    (problem,) = info.value.problems
    assert "objectives.itl.threshold_s = 0.02 is not a bucket edge of vllm:inter_token_latency_seconds (vllm)" \
        in problem
    assert "the nearest edges are 0.01 and 0.025" in problem
    # The same policy at vLLM's 25 ms edge passes without the flag: the check is about edges, not vLLM.
    (policy,) = OVERLAYS[overlay].policies
    relaxed = policy.model_copy(update={"objectives": policy.objectives.model_copy(
        update={"itl": policy.objectives.itl.model_copy(update={"threshold_s": 0.025})})})
    stock = _without_bucket_flag(OVERLAYS[overlay])
    assert overlay_files(overlay, Overlay(policies=(relaxed,), workloads=stock.workloads))


def test_engines_are_read_per_workload() -> None:
    vllm_gpu, cpu = OVERLAYS["vllm-gpu"], OVERLAYS["embedded-cpu"]
    engines = workload_engines([*vllm_gpu.workloads, *cpu.workloads])
    assert engines[("deployment", "vllm-qwen3-moe")].edges is ENGINES["vllm-slo-buckets"].edges
    assert engines[("deployment", "moeslo-engine")].edges is ENGINES["moeslo"].edges
    both = Overlay(policies=(), workloads=tuple(_without_bucket_flag(vllm_gpu).workloads) + cpu.workloads)
    (gpu_policy,), (cpu_policy,) = vllm_gpu.policies, cpu.policies
    # Each policy is checked against its own target: the CPU engine has 0.02, the flagless vLLM not.
    with pytest.raises(ValidationError) as info:
        overlay_files("mixed", Overlay(policies=(gpu_policy, cpu_policy), workloads=both.workloads))
    assert len(info.value.problems) == 1 and "'qwen3-moe'" in info.value.problems[0]
    # A target by model name among engines with different buckets is ambiguous: refused, saying why.
    by_model = Policy(name="by-model", target=ModelTarget(model="qwen3-moe"))
    with pytest.raises(ValidationError, match="target the workload"):
        overlay_files("mixed", Overlay(policies=(by_model,), workloads=both.workloads))


def test_a_malformed_bucket_flag_is_named() -> None:
    container = {"name": "vllm", "image": "moeslo-vllm", "command": ["vllm", "serve"],
                 "args": [f"{VLLM_CUSTOM_BUCKETS_FLAG}", "{not json"]}
    with pytest.raises(ValidationError, match=r"Deployment/x container vllm: --custom-histogram-buckets is not JSON"):
        container_engine(container, "Deployment/x container vllm")
    headless = {**container, "args": ["--headless"]}
    assert container_engine(headless, "w") is None


def _with_allowance(policy: Policy, reference: int, per_1k: float) -> Policy:
    ttft = policy.objectives.ttft.model_copy(
        update={"reference_prompt_tokens": reference, "per_1k_prompt_tokens_s": per_1k}
    )
    return policy.model_copy(update={"objectives": policy.objectives.model_copy(update={"ttft": ttft})})


def _engine_containers(overlay: Overlay) -> list[dict[str, Any]]:
    return [c for r in overlay.workloads for spec in pod_specs(r) for c in spec.get("containers", [])
            if container_engine(c, "w") is not None]  # fmt: skip


@pytest.mark.parametrize("overlay", ["vllm-gpu", "embedded-cpu"])
def test_a_ttft_allowance_its_engine_does_not_write_is_refused(overlay: str) -> None:
    """The alerts would read a series no engine writes: TTFT never pages, nor ITL (its traffic check reads it)."""
    (policy,) = OVERLAYS[overlay].policies
    assert overlay_files(overlay, Overlay(policies=(_with_allowance(policy, 1000, 0.05),),
                                          workloads=OVERLAYS[overlay].workloads))  # every engine writes the default
    wanting = Overlay(policies=(_with_allowance(policy, 2000, 0.1),), workloads=OVERLAYS[overlay].workloads)
    with pytest.raises(ValidationError) as info:
        overlay_files(overlay, wanting)
    (problem,) = info.value.problems
    assert "allowance 2000:0.1, which its engine does not write (it writes 1000:0.05)" in problem
    told = copy.deepcopy(wanting)
    for container in _engine_containers(told):
        if overlay == "vllm-gpu":
            container.setdefault("env", []).append({"name": "MOESLO_TTFT_ALLOWANCES", "value": "2000:0.1"})
        else:
            container["args"] = [*container.get("args", []), "--ttft-allowances", "2000:0.1"]
    assert overlay_files(overlay, told)
    if overlay == "vllm-gpu":  # from a ConfigMap: not known here, so not refused
        for container in _engine_containers(told):
            container["env"][-1] = {"name": "MOESLO_TTFT_ALLOWANCES",
                                    "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
        assert overlay_files(overlay, told)


def test_a_vllm_without_the_moeslo_plugin_writes_no_normalized_ttft() -> None:
    """A stock vLLM image, or moeslo-vllm with MOESLO_VLLM_PLUGIN unset or 0, writes no
    moeslo_ttft_normalized_seconds, yet deploy render took a policy with the default allowance for it: its
    SLI, recording rules and burn-rate alerts read a series nothing writes (never a page, TTFT or ITL)."""
    from engine.vllm_plugin.settings import ENABLE_ENV, PluginSettings
    from generators.buckets import threshold_problems
    from generators.manifests.engines import PLUGIN_ENV, PLUGIN_ON, TTFT_PLUGIN

    assert PLUGIN_ENV == ENABLE_ENV  # generators may not import the engine: the two spellings are kept alike
    for value in ("1", "on", "true", "0", "off", "false", ""):
        assert PluginSettings.from_env({ENABLE_ENV: value}).enabled == (value in PLUGIN_ON), value
    policy = Policy.model_validate({
        "name": "chat", "target": {"kind": "deployment", "namespace": "default", "name": "vllm"},
        "objectives": {"ttft": {"threshold_s": 0.5, "target": 0.99, "per_1k_prompt_tokens_s": 0.05},
                       "itl": {"threshold_s": 0.025, "target": 0.99}},  # an edge of stock vLLM's ITL
    })  # fmt: skip
    stock = {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "command": ["vllm", "serve", "m"]}
    unset = {"name": "vllm", "image": "moeslo-vllm", "command": ["vllm", "serve", "m"]}
    on = [{"name": PLUGIN_ENV, "value": "1"}]
    for container in (stock, unset, {**unset, "env": [{"name": PLUGIN_ENV, "value": "0"}]},
                      {**unset, "env": [*on, {"name": "VLLM_PLUGINS", "value": "moeslo,moeslo_eplb"}]}):
        engine = container_engine(container, "Deployment/vllm container vllm")
        assert engine is not None and engine.ttft_allowances == (), container
        (problem,) = threshold_problems(policy, engine)
        assert "its engine writes no moeslo_ttft_normalized_seconds" in problem and "MOESLO_VLLM_PLUGIN=1" in problem
    for env in (on, [*on, {"name": "VLLM_PLUGINS", "value": f"moeslo,{TTFT_PLUGIN}"}]):
        engine = container_engine({**unset, "env": env}, "w")
        assert engine is not None and threshold_problems(policy, engine) == []
    # Set from a ConfigMap, or perhaps by envFrom: not known here, so not refused.
    from_map = {"name": PLUGIN_ENV, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
    for container in ({**unset, "env": [from_map]}, {**unset, "envFrom": [{"configMapRef": {"name": "c"}}]}):
        engine = container_engine(container, "w")
        assert engine is not None and engine.ttft_allowances is None
