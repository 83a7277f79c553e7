"""Every vLLM container deploy/ renders starts with arguments vLLM 0.32's own parser accepts.

The command line is built as the pod would run it: the kubelet expands
``$(VAR)`` from the container's env (with the values Kubernetes and
LeaderWorkerSet put there: the pod IP, ``LWS_LEADER_ADDRESS``,
``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``), a ``/bin/sh -c`` wrapper runs
against a stand-in ``vllm`` that prints what it was given, and the resulting
``vllm serve`` arguments go through ``make_arg_parser`` and the engine-argument
checks in the vLLM venv (tests/deploy/vllm_parse_args.py).  A flag vLLM does not
know fails here, not on a GPU node.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from contracts.catalogue import VLLM_SLO_CUSTOM_BUCKETS
from generators.manifests import build
from generators.manifests.engines import VLLM_IMAGE, pod_specs
from generators.manifests.kustomize import split_image
from harness.vllm_server import vllm_python

pytestmark = [pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PARSER = Path(__file__).with_name("vllm_parse_args.py")
TREES = [f"overlays/{p.parent.name}" for p in sorted(DEPLOY.glob("overlays/*/kustomization.yaml"))]
POD_IP = "10.4.2.17"


def kubelet_expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` is a literal ``$``, the rest stays."""
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", replace, text)


def container_env(container: Mapping[str, Any], injected: Mapping[str, str]) -> dict[str, str]:
    """The env the kubelet expands against: LWS's variables first (its webhook prepends them), then the
    container's own, with ``status.podIP`` resolved."""
    env = dict(injected)
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = kubelet_expand(variable["value"], env)
        elif variable.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            env[variable["name"]] = POD_IP
    return env


def pod_runs(resource: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, str]]]:
    """(where, container, injected env) for each pod a workload makes: every LWS worker index."""
    name = resource["metadata"]["name"]
    if resource["kind"] != "LeaderWorkerSet":
        for spec in pod_specs(resource):
            for container in spec["containers"]:
                yield f"{resource['kind']}/{name}", container, {}
        return
    group = resource["spec"]["leaderWorkerTemplate"]
    size = group["size"]
    roles = [("leader", group["leaderTemplate"], [0]), ("worker", group["workerTemplate"], range(1, size))]
    for role, template, indices in roles:
        for index in indices:
            injected = {"LWS_LEADER_ADDRESS": f"{name}-0.{name}.{resource['metadata']['namespace']}",
                        "LWS_GROUP_SIZE": str(size), "LWS_WORKER_INDEX": str(index)}
            for container in template["spec"]["containers"]:
                yield f"LeaderWorkerSet/{name} {role} {index}", container, injected


def serve_argv(container: Mapping[str, Any], env: Mapping[str, str], tmp_path: Path) -> list[str]:
    """The ``vllm ...`` argv the container ends up running."""
    words = [kubelet_expand(str(w), env) for w in [*container.get("command", []), *container.get("args", [])]]
    if words[:2] != ["/bin/sh", "-c"]:
        return words
    fake = tmp_path / "vllm"
    fake.write_text("#!/bin/sh\nprintf '%s\\0' vllm \"$@\"\n")
    fake.chmod(0o755)
    run = subprocess.run(words, capture_output=True, check=True, timeout=30,
                         env={**env, "PATH": f"{tmp_path}:/usr/bin:/bin"})
    return run.stdout.decode().split("\0")[:-1]


def parse_with_vllm(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    python = vllm_python()
    assert python is not None
    result = subprocess.run([str(python), str(PARSER)], input=json.dumps(items), capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    parsed: list[dict[str, Any]] = json.loads(result.stdout)
    return parsed


def vllm_commands(tmp_path: Path) -> list[dict[str, Any]]:
    items = []
    for tree in TREES:
        for resource in build(DEPLOY / tree):
            for where, container, injected in pod_runs(resource):
                if split_image(container["image"])[0] != VLLM_IMAGE:
                    continue
                argv = serve_argv(container, container_env(container, injected), tmp_path)
                assert argv[:2] == ["vllm", "serve"], f"{tree} {where}: {argv[:4]}"
                items.append({"where": f"{tree} {where}", "argv": argv[2:], "env": injected})
    return items


def test_rendered_vllm_arguments_parse_under_vllm_0_32(tmp_path: Path) -> None:
    if vllm_python() is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    items = vllm_commands(tmp_path)
    assert {i["where"].split()[0] for i in items} == {"overlays/vllm-gpu", "overlays/vllm-multinode"}
    # A flag vLLM does not know must fail: the check can fail.
    canary = {"where": "canary", "argv": [*items[0]["argv"], "--no-such-vllm-flag=1"]}
    bad_buckets = {"where": "bad buckets", "argv": [*items[0]["argv"],
                                                    '--custom-histogram-buckets={"inter_token_latency":[0.02,0.01]}']}
    results = parse_with_vllm([{k: i[k] for k in ("where", "argv")} for i in items] + [canary, bad_buckets])
    *ours, canary_result, bad_result = results
    assert "unrecognized arguments: --no-such-vllm-flag=1" in canary_result.get("error", ""), canary_result
    assert "strictly increasing" in bad_result.get("error", ""), bad_result
    errors = {r["where"]: r["error"] for r in ours if "error" in r}
    assert errors == {}
    for item, result in zip(items, ours, strict=True):
        parsed = result["parsed"]
        if not parsed["headless"]:  # API servers write the latency histograms: the SLO edges
            assert parsed["custom_histogram_buckets"] == {k: list(v) for k, v in VLLM_SLO_CUSTOM_BUCKETS.items()}
        assert parsed["enable_expert_parallel"], item["where"]
        if "LWS_WORKER_INDEX" in item["env"]:
            index = int(item["env"]["LWS_WORKER_INDEX"])
            local = parsed["data_parallel_size_local"]
            assert parsed["data_parallel_size"] == local * int(item["env"]["LWS_GROUP_SIZE"])
            assert parsed["headless"] == (index > 0)
            assert parsed["data_parallel_start_rank"] == (index * local if index else None)
            assert parsed["data_parallel_address"] == (item["env"]["LWS_LEADER_ADDRESS"] if index else POD_IP)
            assert parsed["enable_eplb"] and parsed["eplb_num_redundant_experts"] == 16
