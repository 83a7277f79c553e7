"""deploy/: drift, rendering (Python vs kubectl kustomize), schema validation, RBAC, wiring."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest
import yaml

from controller.config import load_settings
from controller.policy import KubernetesTarget, Policy
from controller.policy_files import DEFAULT_POLICIES, load_policies
from generators.dashboards import render_dashboard_files
from generators.manifests import build, deploy_files, load_overlays
from generators.manifests.engines import VLLM_IMAGE, command_line, flag_value
from generators.manifests.kustomize import split_image
from tests.deploy import crd_schemas

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TREES = ["base", *(f"overlays/{p.parent.name}" for p in sorted(DEPLOY.glob("overlays/*/kustomization.yaml")))]
K8S_VERSION = "1.32"


def _key(resource: dict[str, Any]) -> tuple[str, str, str]:
    meta = resource["metadata"]
    return resource["kind"], meta.get("namespace", ""), meta["name"]


def _rendered(tree: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {_key(r): r for r in build(DEPLOY / tree)}


def _overlay_policies() -> dict[str, tuple[Policy, ...]]:
    return {name: overlay.policies for name, overlay in load_overlays(DEPLOY).items()}


def test_generated_files_match_the_generators() -> None:
    files = deploy_files(DEFAULT_POLICIES, load_overlays(DEPLOY))
    on_disk = sorted(str(p.relative_to(DEPLOY)) for p in DEPLOY.glob("**/generated/*.yaml"))
    assert sorted(files) == on_disk
    for relative, text in files.items():
        assert (DEPLOY / relative).read_text(encoding="utf-8") == text, f"{relative} drifted: moeslo deploy render"


@pytest.mark.parametrize("tree", TREES)
def test_python_render_matches_kubectl_kustomize(tree: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: the Python renderer is checked against it where it is")
    out = subprocess.run([kubectl, "kustomize", str(DEPLOY / tree)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    theirs = {_key(r): r for r in yaml.safe_load_all(out) if r}
    assert _rendered(tree) == theirs


def _embedded_pod_templates(resource: dict[str, Any]) -> list[dict[str, Any]]:
    """A LeaderWorkerSet's leader and worker pod templates, as v1 PodTemplates Kubernetes can check."""
    if resource["kind"] != "LeaderWorkerSet":
        return []
    group = resource["spec"]["leaderWorkerTemplate"]
    return [{"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"{resource['metadata']['name']}-{role}"},
             "template": group[f"{role}Template"]} for role in ("leader", "worker") if f"{role}Template" in group]


@pytest.mark.parametrize("tree", TREES)
def test_every_manifest_validates(tree: str) -> None:
    """Built-in kinds against Kubernetes 1.32; custom resources against their vendored CRDs, and the
    pod templates inside a LeaderWorkerSet against Kubernetes 1.32 too (the CRD embeds a newer PodSpec)."""
    kinds = set()
    for key, resource in _rendered(tree).items():
        kinds.add(key[0])
        if key[0] in crd_schemas.CRD_KINDS:
            crd_schemas.validate(resource)
            for template in _embedded_pod_templates(resource):
                kubernetes_validate.validate(template, K8S_VERSION, strict=True)
        else:
            kubernetes_validate.validate(resource, K8S_VERSION, strict=True)
        assert resource["metadata"]["labels"]["app.kubernetes.io/part-of"] == "moeslo"
        if key[0] != "Namespace":
            assert key[1] == "moeslo", key
    assert {"Deployment", "Service", "Role", "RoleBinding", "ServiceAccount", "ConfigMap", "PodMonitor",
            "ServiceMonitor", "PrometheusRule"} <= kinds


KINDS = {"deployment": "Deployment", "leaderworkerset": "LeaderWorkerSet"}


def test_cli_render_refuses_a_directory_that_is_not_a_deploy_tree(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    missing = tmp_path / "no-such-dir"
    result = CliRunner().invoke(app, ["deploy", "render", "--dir", str(missing)])
    assert result.exit_code == 2
    assert "not a deploy directory" in " ".join(result.output.split())
    assert not missing.exists()  # nothing was created


@pytest.mark.parametrize("overlay", sorted(load_overlays(DEPLOY)))
def test_scaled_workloads_leave_replicas_to_their_scaler(overlay: str) -> None:
    """A Deployment or LeaderWorkerSet the controller or an HPA scales must not pin spec.replicas:
    every ``kubectl apply -k`` would reset the scaled fleet to that number."""
    rendered = _rendered(f"overlays/{overlay}")
    scaled = {
        (KINDS[target.kind], target.namespace, target.name)
        for policy in _overlay_policies()[overlay]
        if isinstance(target := policy.target, KubernetesTarget)
    }
    scaled |= {
        (resource["spec"]["scaleTargetRef"]["kind"], key[1], resource["spec"]["scaleTargetRef"]["name"])
        for key, resource in rendered.items()
        if key[0] == "HorizontalPodAutoscaler"
    }
    assert scaled, "the overlay scales nothing"
    for kind, namespace, name in sorted(scaled):
        workload = rendered[(kind, namespace, name)]
        assert "replicas" not in workload["spec"], f"{overlay}: {kind} {name} pins spec.replicas"


def test_hpas_whose_floor_the_controller_sets_leave_min_replicas_out() -> None:
    """A policy's ``target.hpa`` has the controller raise that HPA's minReplicas: a pinned one would put the floor
    back on every ``kubectl apply -k``, under the load the controller raised it for."""
    managed = [
        (overlay, target.namespace, target.hpa)
        for overlay, policies in _overlay_policies().items()
        for policy in policies
        if isinstance(target := policy.target, KubernetesTarget) and target.hpa
    ]
    assert managed, "no overlay scales through an HPA"
    for overlay, namespace, name in managed:
        hpa = _rendered(f"overlays/{overlay}")[("HorizontalPodAutoscaler", namespace, name)]
        assert "minReplicas" not in hpa["spec"], f"{overlay}: HorizontalPodAutoscaler {name} pins minReplicas"


def test_validation_can_fail() -> None:
    resources = _rendered("overlays/vllm-gpu")
    deployment = copy.deepcopy(resources[("Deployment", "moeslo", "vllm-qwen3-moe")])
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    deployment = copy.deepcopy(resources[("Deployment", "moeslo", "vllm-qwen3-moe")])
    deployment["spec"]["template"]["spec"]["containers"][0]["gpus"] = 8
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    monitor = copy.deepcopy(resources[("PodMonitor", "moeslo", "moeslo-engines")])
    monitor["spec"]["podMetricEndpoints"] = monitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        crd_schemas.validate(monitor)


@pytest.mark.parametrize("tree", TREES)
def test_prometheus_rule_passes_promtool(tree: str, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    rule = _rendered(tree)[("PrometheusRule", "moeslo", "moeslo-slo-rules")]
    path = tmp_path / "rules.yaml"
    path.write_text(json.dumps(rule["spec"]))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


_CLIENT_CALL_VERBS = {
    "read_namespaced_deployment_scale": ("apps", "deployments/scale", "get"),
    "replace_namespaced_deployment_scale": ("apps", "deployments/scale", "update"),
    "patch_namespaced_deployment_scale": ("apps", "deployments/scale", "patch"),
    "get_namespaced_custom_object_scale": ("leaderworkerset.x-k8s.io", "leaderworkersets/scale", "get"),
    "replace_namespaced_custom_object_scale": ("leaderworkerset.x-k8s.io", "leaderworkersets/scale", "update"),
    "patch_namespaced_custom_object_scale": ("leaderworkerset.x-k8s.io", "leaderworkersets/scale", "patch"),
    "read_namespaced_horizontal_pod_autoscaler": ("autoscaling", "horizontalpodautoscalers", "get"),
    "replace_namespaced_horizontal_pod_autoscaler": ("autoscaling", "horizontalpodautoscalers", "update"),
    "patch_namespaced_horizontal_pod_autoscaler": ("autoscaling", "horizontalpodautoscalers", "patch"),
    "list_namespaced_horizontal_pod_autoscaler": ("autoscaling", "horizontalpodautoscalers", "list"),
    "read_namespaced_lease": ("coordination.k8s.io", "leases", "get"),
    "create_namespaced_lease": ("coordination.k8s.io", "leases", "create"),
    "replace_namespaced_lease": ("coordination.k8s.io", "leases", "update"),
    "patch_namespaced_lease": ("coordination.k8s.io", "leases", "patch"),
    "list_namespaced_pod": ("", "pods", "list"),
    "patch_namespaced_pod": ("", "pods", "patch"),
}


def test_rbac_grants_exactly_the_verbs_the_controller_code_uses() -> None:
    source = "".join((ROOT / path).read_text() for path in ("controller/actuators/kubernetes.py",
                                                            "controller/actuators/kube_pods.py",
                                                            "controller/leader.py"))
    calls = set(re.findall(r"\.(\w+_namespaced_\w+)\(", source))
    unknown = calls - set(_CLIENT_CALL_VERBS)
    assert unknown == set(), f"map these Kubernetes client calls to RBAC verbs: {unknown}"
    needed = {_CLIENT_CALL_VERBS[call] for call in calls}
    role = _rendered("base")[("Role", "moeslo", "moeslo-controller")]
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert granted == needed
    assert not [k for k in _rendered("base") if k[0] in ("ClusterRole", "ClusterRoleBinding")]


@pytest.mark.parametrize("tree", TREES)
def test_controller_config_and_policies_load(tree: str, tmp_path: Path) -> None:
    resources = _rendered(tree)
    config = tmp_path / "controller.yaml"
    config.write_text(resources[("ConfigMap", "moeslo", "moeslo-controller-config")]["data"]["controller.yaml"])
    settings = load_settings(config)
    assert settings.leader_election.enabled and settings.port == 8090
    assert settings.actuator == ("dryrun" if tree == "base" else "kubernetes")
    # The status page lists the firing alerts only when it knows where Alertmanager is.
    assert settings.prometheus_url and settings.alertmanager_url
    policies_file = tmp_path / "policies.yaml"
    policies_file.write_text(resources[("ConfigMap", "moeslo", "moeslo-policies")]["data"]["policies.yaml"])
    expected = DEFAULT_POLICIES if tree == "base" else _overlay_policies()[tree.rsplit("/", 1)[1]]
    assert load_policies(policies_file) == expected
    # Every policy of an overlay governs a workload that the overlay deploys.
    for policy in expected:
        target = policy.target
        if isinstance(target, KubernetesTarget):
            assert (KINDS[target.kind], target.namespace, target.name) in resources
            if target.hpa:
                assert ("HorizontalPodAutoscaler", target.namespace, target.hpa) in resources


@pytest.mark.parametrize("tree", TREES)
def test_the_controller_pod_is_killed_only_after_its_shutdown(tree: str, tmp_path: Path) -> None:
    """On SIGTERM the actions in flight get ``shutdown_grace_s`` and the Lease's release is bounded by its renew
    period; a kill before both ends (and the decision log's write, the margin) loses what they did."""
    resources = _rendered(tree)
    config = tmp_path / "controller.yaml"
    config.write_text(resources[("ConfigMap", "moeslo", "moeslo-controller-config")]["data"]["controller.yaml"])
    settings = load_settings(config)
    pod = resources[("Deployment", "moeslo", "moeslo-controller")]["spec"]["template"]["spec"]
    shutdown_s = settings.shutdown_grace_s + settings.leader_election.renew_period_s
    assert pod["terminationGracePeriodSeconds"] >= shutdown_s + 5


def test_vllm_overlay_wiring() -> None:
    resources = _rendered("overlays/vllm-gpu")
    pod = resources[("Deployment", "moeslo", "vllm-qwen3-moe")]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert {"name": "MOESLO_VLLM_PLUGIN", "value": "1"} in container["env"]
    assert "--enable-expert-parallel" in container["args"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
    hpa = resources[("HorizontalPodAutoscaler", "moeslo", "vllm-qwen3-moe")]["spec"]
    targets = {m["resource"]["name"]: m["resource"]["target"]["averageUtilization"] for m in hpa["metrics"]}
    assert targets == {"cpu": 70, "memory": 80}
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 180
    rules = json.dumps(resources[("PrometheusRule", "moeslo", "moeslo-slo-rules")]["spec"])
    assert 'model_name=\\"qwen3-moe\\"' in rules and 'le=\\"0.02\\"' in rules


def _containers(resource: dict[str, Any]) -> list[dict[str, Any]]:
    templates = [t["template"] for t in _embedded_pod_templates(resource)]
    if "template" in resource.get("spec", {}):
        templates.append(resource["spec"]["template"])
    return [c for t in templates for c in t["spec"]["containers"]]


@pytest.mark.parametrize("overlay", ["overlays/vllm-gpu", "overlays/vllm-multinode"])
def test_every_vllm_with_the_plugin_names_the_plugins_it_loads(overlay: str) -> None:
    """vLLM loads endpoint plugins (/moeslo/eplb, which rebalancing calls) only when VLLM_PLUGINS names them,
    and naming any limits every group to those named: each name must be one of our entry points."""
    entry_points = set(re.findall(r"^(moeslo\w*) = ", (ROOT / "pyproject.toml").read_text(), re.MULTILINE))
    with_plugin = [c for r in _rendered(overlay).values() for c in _containers(r)
                   if {"name": "MOESLO_VLLM_PLUGIN", "value": "1"} in c.get("env", [])]  # fmt: skip
    assert with_plugin
    for container in with_plugin:
        named = {e["name"]: e.get("value") for e in container["env"]}.get("VLLM_PLUGINS", "")
        plugins = set(named.split(","))
        assert {"moeslo", "moeslo_eplb", "moeslo_ttft"} <= plugins <= entry_points, (overlay, named)


def _rebalance_refusal(words: list[str]) -> str | None:
    """Why the plugin would refuse a rebalance of the vLLM these arguments start (eplb_control.apply), or None."""
    if "--enable-eplb" not in words:
        return "eplb_off"
    if int(flag_value(words, "--data-parallel-size") or 1) > 1:
        return "eplb_data_parallel"
    return None


@pytest.mark.parametrize("tree", TREES)
def test_the_controller_rebalances_no_vllm_that_would_refuse_it(tree: str, tmp_path: Path) -> None:
    """A vLLM without EPLB, or with data parallelism, answers every apply with 409: a controller rebalancing it
    would log a ``failed`` rebalance each cooldown.  There vLLM's own EPLB (our planner as its policy) balances."""
    resources = _rendered(tree)
    config = tmp_path / "controller.yaml"
    config.write_text(resources[("ConfigMap", "moeslo", "moeslo-controller-config")]["data"]["controller.yaml"])
    refusals = {
        (resource["metadata"]["name"], container["name"]): refusal
        for resource in resources.values() for container in _containers(resource)
        if split_image(str(container.get("image", "")))[0].rsplit("/", 1)[-1] == VLLM_IMAGE
        and "--headless" not in (words := command_line(container))
        and (refusal := _rebalance_refusal(words)) is not None
    }  # fmt: skip
    if refusals:
        assert not load_settings(config).rebalance, (tree, refusals)
    if tree == "overlays/embedded-cpu":
        assert load_settings(config).rebalance  # the embedded engine applies placements itself


@pytest.mark.parametrize("overlay", [t for t in TREES if t.startswith("overlays/")])
def test_every_serving_engine_is_restarted_when_its_health_fails(overlay: str) -> None:
    """A dead engine core answers 503 on /health for good: without a liveness probe it stays unready forever."""
    serving = [c for r in _rendered(overlay).values() for c in _containers(r)
               if c.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/health"
               and c["name"] in ("vllm", "engine")]  # fmt: skip
    assert serving, overlay
    for container in serving:
        assert container["livenessProbe"]["httpGet"]["path"] == "/health", (overlay, container["name"])
        assert "startupProbe" in container, (overlay, container["name"])  # the model load is not a failure


def _engine_pod_specs(resource: dict[str, Any]) -> list[dict[str, Any]]:
    templates = [t["template"] for t in _embedded_pod_templates(resource)]
    if resource["kind"] == "Deployment" and resource["spec"]["template"]["metadata"]["labels"].get(
        "app.kubernetes.io/component", ""
    ).startswith("engine"):
        templates.append(resource["spec"]["template"])
    return [t["spec"] for t in templates]


@pytest.mark.parametrize("overlay", [t for t in TREES if t.startswith("overlays/")])
def test_an_engine_pod_being_removed_drains_its_requests_before_it_is_killed(overlay: str, tmp_path: Path) -> None:
    """A scale-down's pod keeps serving until the Service and the controller's replica list (one tick) have
    dropped it (preStop), then lets its requests in flight finish (``--shutdown-timeout``; vLLM's default, 0,
    aborts them, and ``moeslo serve``'s 5 s cuts a long answer), and is killed only after both."""
    resources = _rendered(overlay)
    config = tmp_path / "controller.yaml"
    config.write_text(resources[("ConfigMap", "moeslo", "moeslo-controller-config")]["data"]["controller.yaml"])
    tick_s = load_settings(config).tick_interval_s
    specs = [spec for resource in resources.values() for spec in _engine_pod_specs(resource)]
    assert specs, overlay
    for spec in specs:
        (container,) = spec["containers"]
        sleep_s = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
        drain_s = int(flag_value(command_line(container), "--shutdown-timeout") or 0)
        assert sleep_s > tick_s and drain_s >= 30, (overlay, container["name"], sleep_s, drain_s)
        assert spec["terminationGracePeriodSeconds"] >= sleep_s + drain_s + 5, (overlay, container["name"])


@pytest.mark.parametrize("overlay", [t for t in TREES if t.startswith("overlays/")])
def test_each_overlays_controller_dashboard_draws_the_forecast_one_of_its_own_lead_times_back(overlay: str) -> None:
    (lead_time_s,) = {p.lead_time_s for p in _overlay_policies()[overlay.removeprefix("overlays/")]}
    name = "grafana-dashboard-moeslo-controller"
    resources = _rendered(overlay).values()
    (dashboard,) = [r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == name]
    offsets = set(re.findall(r"offset (\d+)s", json.dumps(dashboard["data"])))
    assert offsets == {str(lead_time_s)}, (overlay, offsets)


def test_dashboards_ship_as_sidecar_configmaps() -> None:
    resources = _rendered("base")
    dashboards = render_dashboard_files(DEFAULT_POLICIES)
    maps = [r for k, r in resources.items() if k[0] == "ConfigMap" and k[2].startswith("grafana-dashboard-")]
    assert len(maps) == len(dashboards) == 4
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, text),) = config_map["data"].items()
        assert dashboards[name] == text


def test_cli_render_is_idempotent_and_build_prints_the_overlay(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    copy_dir = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy_dir)
    for generated in copy_dir.glob("**/generated/*.yaml"):
        generated.unlink()
    result = CliRunner().invoke(app, ["deploy", "render", "--dir", str(copy_dir), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["overlays"] == ["embedded-cpu", "vllm-gpu", "vllm-multinode"]
    for path in DEPLOY.glob("**/generated/*.yaml"):
        assert (copy_dir / path.relative_to(DEPLOY)).read_text() == path.read_text()
    built = CliRunner().invoke(app, ["deploy", "build", "embedded-cpu", "--dir", str(copy_dir)])
    assert built.exit_code == 0, built.output
    docs = [doc for doc in yaml.safe_load_all(built.stdout) if doc]
    deployments = sorted(doc["metadata"]["name"] for doc in docs if doc["kind"] == "Deployment")
    assert deployments == ["moeslo-controller", "moeslo-engine", "moeslo-router"]
    assert "PrometheusRule" in [doc["kind"] for doc in docs]
    # Without --custom-histogram-buckets, vLLM has no 0.02 ITL edge: the 20 ms objective is refused.
    vllm = copy_dir / "overlays" / "vllm-gpu" / "vllm.yaml"
    vllm.write_text("\n".join(line for line in vllm.read_text().splitlines()
                              if "--custom-histogram-buckets" not in line) + "\n")
    refused = CliRunner().invoke(app, ["deploy", "render", "--dir", str(copy_dir)])
    assert refused.exit_code == 2
    message = " ".join(refused.output.split())
    assert "overlay vllm-gpu: policy 'qwen3-moe': objectives.itl.threshold_s = 0.02 is not a bucket edge" in message
    assert "the nearest edges are 0.01 and 0.025" in message


@pytest.mark.parametrize("overlay", sorted(load_overlays(DEPLOY)))
def test_the_controller_finds_the_routers_queue_by_the_job_its_pod_monitor_sets(overlay: str) -> None:
    """Each overlay's policies name the router by labels its series carry in Prometheus (job from the pod label)."""
    rendered = _rendered(f"overlays/{overlay}")
    monitor = rendered[("PodMonitor", "moeslo", "moeslo-router")]["spec"]
    router = rendered[("Deployment", "moeslo", "moeslo-router")]
    job = router["spec"]["template"]["metadata"]["labels"][monitor["jobLabel"]]
    for policy in _overlay_policies()[overlay]:
        assert policy.router is not None, f"{overlay}: {policy.name} does not read the router's queue"
        assert policy.router.prometheus_labels == {"job": job}
