"""The multi-node EP overlay: a LeaderWorkerSet group runs vLLM DP+EP across nodes, spread over zones,
scaled by the controller through the scale subresource."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from controller.actuators.kubernetes import LWS_GROUP, LWS_PLURAL, LWS_VERSION
from controller.policy import KubernetesTarget
from generators.manifests import build, load_overlays
from generators.manifests.engines import command_line, flag_value
from tests.deploy import crd_schemas

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NAME = "vllm-qwen3-moe-ep"
GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
ZONE, HOST = "topology.kubernetes.io/zone", "kubernetes.io/hostname"


@pytest.fixture(scope="module")
def rendered() -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["kind"], r["metadata"]["name"]): r for r in build(DEPLOY / "overlays" / "vllm-multinode")}


def _templates(lws: dict[str, Any]) -> dict[str, dict[str, Any]]:
    group = lws["spec"]["leaderWorkerTemplate"]
    return {"leader": group["leaderTemplate"], "worker": group["workerTemplate"]}


def _container(template: dict[str, Any]) -> dict[str, Any]:
    (container,) = template["spec"]["containers"]
    return container


def test_one_group_spans_nodes_and_restarts_as_one(rendered: dict[tuple[str, str], dict[str, Any]]) -> None:
    lws = rendered[("LeaderWorkerSet", NAME)]
    assert lws["apiVersion"] == f"{LWS_GROUP}/{LWS_VERSION}"
    spec = lws["spec"]
    assert "replicas" not in spec  # the controller owns it
    assert spec["startupPolicy"] == "LeaderCreated"  # LeaderReady would deadlock: readiness needs the workers
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    for role, template in _templates(lws).items():
        assert _container(template)["resources"]["limits"]["nvidia.com/gpu"] == "8", role
        assert template["metadata"]["labels"]["app.kubernetes.io/name"] == NAME


def test_dp_and_ep_flags_agree_across_the_group(rendered: dict[tuple[str, str], dict[str, Any]]) -> None:
    lws = rendered[("LeaderWorkerSet", NAME)]
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    leader, worker = (command_line(_container(t)) for t in _templates(lws).values())
    for words in (leader, worker):
        assert "--enable-expert-parallel" in words and "--enable-eplb" in words
        local = int(flag_value(words, "--data-parallel-size-local") or 0)
        assert int(flag_value(words, "--data-parallel-size") or 0) == local * size
        assert flag_value(words, "--data-parallel-rpc-port") == "13345"
        eplb = json.loads(flag_value(words, "--eplb-config") or "{}")
        assert eplb["num_redundant_experts"] % local == 0
    assert "--headless" in worker and "--headless" not in leader
    assert flag_value(leader, "--data-parallel-address") == "$(POD_IP)"
    assert flag_value(worker, "--data-parallel-address") == "$(LWS_LEADER_ADDRESS)"
    # The worker's first rank is 8 x its index: the multiplier is the local DP size.
    local = flag_value(worker, "--data-parallel-size-local")
    assert f'--data-parallel-start-rank="$$((LWS_WORKER_INDEX * {local}))"' in worker[2]
    shared = {"--model", "--served-model-name", "--tensor-parallel-size", "--data-parallel-size", "--eplb-config"}
    assert {f: flag_value(leader, f) for f in shared} == {f: flag_value(worker, f) for f in shared}


def test_groups_spread_over_zones_and_a_groups_pods_share_one(rendered: dict[tuple[str, str], dict[str, Any]]) -> None:
    lws = rendered[("LeaderWorkerSet", NAME)]
    for role, template in _templates(lws).items():
        affinity = template["spec"]["affinity"]
        (together,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        (apart,) = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert (together["topologyKey"], together["matchLabelKeys"]) == (ZONE, [GROUP_KEY]), role
        assert (apart["topologyKey"], apart["matchLabelKeys"]) == (HOST, [GROUP_KEY]), role
        for term in (together, apart):
            assert term["labelSelector"]["matchLabels"] == {"app.kubernetes.io/name": NAME}
    (spread,) = _templates(lws)["leader"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == ZONE and spread["maxSkew"] == 1
    assert spread["labelSelector"]["matchLabels"] == {"app.kubernetes.io/name": NAME, "role": "leader"}


def test_disruption_budget_and_services_select_the_right_pods(rendered: dict[tuple[str, str], dict[str, Any]]) -> None:
    lws = rendered[("LeaderWorkerSet", NAME)]
    labels = {role: t["metadata"]["labels"] for role, t in _templates(lws).items()}

    def selects(selector: dict[str, str], role: str) -> bool:
        return all(labels[role].get(k) == v for k, v in selector.items())

    pdb = rendered[("PodDisruptionBudget", NAME)]["spec"]
    assert pdb["maxUnavailable"] == 1 and pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert selects(pdb["selector"]["matchLabels"], "leader") and selects(pdb["selector"]["matchLabels"], "worker")
    service = rendered[("Service", f"{NAME}-leader")]["spec"]
    assert selects(service["selector"], "leader") and not selects(service["selector"], "worker")
    assert ("Service", NAME) not in rendered  # LWS's own headless Service takes the LeaderWorkerSet's name
    # The PodMonitor scrapes engines' /metrics: the leaders (API servers), not the headless workers.
    monitor = rendered[("PodMonitor", "moeslo-engines")]["spec"]["selector"]["matchLabels"]
    assert selects(monitor, "leader") and not selects(monitor, "worker")
    leader_ports = {p["name"] for p in _container(_templates(lws)["leader"])["ports"]}
    assert {e["port"] for e in rendered[("PodMonitor", "moeslo-engines")]["spec"]["podMetricsEndpoints"]} <= \
        leader_ports
    worker_probe = _container(_templates(lws)["worker"])["readinessProbe"]["exec"]["command"]
    assert "LWS_LEADER_ADDRESS" in worker_probe[-1] and ":8000/health" in worker_probe[-1]


def test_the_controller_scales_the_group_through_the_scale_subresource(
    rendered: dict[tuple[str, str], dict[str, Any]],
) -> None:
    (policy,) = load_overlays(DEPLOY)["vllm-multinode"].policies
    assert isinstance(policy.target, KubernetesTarget)
    assert (policy.target.kind, policy.target.name, policy.target.hpa) == ("leaderworkerset", NAME, None)
    assert crd_schemas.served_version("LeaderWorkerSet")["subresources"]["scale"]["specReplicasPath"] == \
        ".spec.replicas"
    assert crd_schemas.crd("LeaderWorkerSet")["spec"]["names"]["plural"] == LWS_PLURAL
    role = rendered[("Role", "moeslo-controller")]
    granted = {verb for rule in role["rules"] if LWS_GROUP in rule["apiGroups"]
               and f"{LWS_PLURAL}/scale" in rule["resources"] for verb in rule["verbs"]}
    assert granted == {"get", "update"}
    assert "actuator: kubernetes" in rendered[("ConfigMap", "moeslo-controller-config")]["data"]["controller.yaml"]


def test_the_lws_schema_catches_mistakes(rendered: dict[tuple[str, str], dict[str, Any]]) -> None:
    lws = rendered[("LeaderWorkerSet", NAME)]
    crd_schemas.validate(lws)
    for mutate in (
        lambda r: r["spec"]["leaderWorkerTemplate"].update(sise=2),
        lambda r: r["spec"].update(startupPolicy="WhenReady"),
        lambda r: r["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0].update(gpus=8),
        lambda r: r["spec"]["leaderWorkerTemplate"].update(size="two"),
    ):
        broken = copy.deepcopy(lws)
        mutate(broken)
        with pytest.raises(jsonschema.ValidationError):
            crd_schemas.validate(broken)
