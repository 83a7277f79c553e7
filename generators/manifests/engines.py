"""Which engine a policy's target runs, read from the workload manifests (pure: resources in, engines out).

A policy's latency thresholds must be bucket edges of the histograms its
target's engine writes (:mod:`generators.buckets`).  For a vLLM container
that depends on how it is started: stock vLLM 0.32 has no 0.02 ITL edge, but
``--custom-histogram-buckets`` replaces a family's edges.  So the manifest
generator reads the container's own arguments: remove the flag from a vLLM
workload whose policy keeps the 20 ms ITL objective and ``moeslo deploy
render`` refuses the policy.

Engine containers: the ``moeslo-vllm`` image (or a command that runs vLLM)
serving the API, i.e. not ``--headless`` (headless vLLM nodes run engine cores
only; the latency histograms are the API server's); the ``moeslo`` image
running ``moeslo serve``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from enum import Enum
from typing import Any

from contracts.catalogue import VLLM_CUSTOM_BUCKETS_FLAG
from contracts.errors import ValidationError
from contracts.ttft_objective import TTFT_ALLOWANCES_ENV, TtftAllowance, exported_allowances
from controller.policy import KubernetesTarget, Policy
from generators.buckets import ENGINES, EngineBuckets, vllm_engine
from generators.manifests.kustomize import split_image

VLLM_IMAGE = "moeslo-vllm"
MOESLO_IMAGE = "moeslo"
PLUGIN_ENV = "MOESLO_VLLM_PLUGIN"
"""The moeslo plugin's switch in vLLM's environment (``engine.vllm_plugin.settings``, which generators may not
import; a test keeps the two alike).  Off, the plugin writes no ``moeslo_ttft_normalized_seconds``."""
PLUGIN_ON = frozenset({"1", "on", "true"})
TTFT_PLUGIN = "moeslo_ttft"
"""The stat-logger entry point that writes the normalized TTFT: vLLM loads it only where ``VLLM_PLUGINS``, when
set, names it."""
WORKLOAD_KINDS = {"Deployment": "deployment", "LeaderWorkerSet": "leaderworkerset", "StatefulSet": "statefulset"}
"""Manifest kind -> the ``target.kind`` a policy names it by."""


def pod_specs(resource: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The pod specs of a workload: its template, or a LeaderWorkerSet's leader and worker templates."""
    spec = resource.get("spec", {})
    if resource.get("kind") == "LeaderWorkerSet":
        group = spec.get("leaderWorkerTemplate", {})
        for template in (group.get("leaderTemplate"), group.get("workerTemplate")):
            if template:
                yield template.get("spec", {})
    elif "template" in spec:
        yield spec["template"].get("spec", {})


def command_line(container: Mapping[str, Any]) -> list[str]:
    return [str(word) for word in [*container.get("command", []), *container.get("args", [])]]


def flag_value(words: Sequence[str], flag: str) -> str | None:
    """The value of ``--flag=value`` or ``--flag value`` in ``words`` (None when absent)."""
    for position, word in enumerate(words):
        if word.startswith(f"{flag}="):
            return word.split("=", 1)[1]
        if word == flag and position + 1 < len(words):
            return words[position + 1]
    return None


def _is_vllm(container: Mapping[str, Any], words: Sequence[str]) -> bool:
    image = split_image(str(container.get("image", "")))[0].rsplit("/", 1)[-1]
    runs_vllm = any(w == "vllm" or w.startswith("vllm.entrypoints") for w in words[:4])
    return image == VLLM_IMAGE or runs_vllm


def container_engine(container: Mapping[str, Any], where: str) -> EngineBuckets | None:
    """The engine whose latency histograms this container writes, or None (not an engine, or headless)."""
    words = command_line(container)
    if _is_vllm(container, words):
        if "--headless" in words:
            return None
        value = flag_value(words, VLLM_CUSTOM_BUCKETS_FLAG)
        allowances = _plugin_allowances(container, where)
        if value is None:
            return replace(vllm_engine(None), ttft_allowances=allowances)
        try:
            custom = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{where}: {VLLM_CUSTOM_BUCKETS_FLAG} is not JSON: {exc}") from None
        return replace(vllm_engine(custom), ttft_allowances=allowances)
    image = split_image(str(container.get("image", "")))[0].rsplit("/", 1)[-1]
    if image == MOESLO_IMAGE and words[:2] == ["moeslo", "serve"]:
        return replace(ENGINES["moeslo"], ttft_allowances=_allowances(flag_value(words, "--ttft-allowances"), where))
    return None


def _plugin_allowances(container: Mapping[str, Any], where: str) -> tuple[TtftAllowance, ...] | None:
    """The allowances a vLLM container's moeslo plugin writes a normalized series for: none with the plugin off
    (the switch unset or off, or ``VLLM_PLUGINS`` not naming its TTFT logger), else what its
    ``MOESLO_TTFT_ALLOWANCES`` says.  None: not known here (set from a ConfigMap or Secret, or perhaps by
    ``envFrom``), so the policy's allowance is not checked."""
    switch = _env_value(container, PLUGIN_ENV)
    plugins = _env_value(container, "VLLM_PLUGINS")  # vLLM splits it on commas, as here
    told = _env_value(container, TTFT_ALLOWANCES_ENV)
    if switch is _Elsewhere.SET or plugins is _Elsewhere.SET:
        return None
    if switch is None or switch.strip().lower() not in PLUGIN_ON:
        return ()
    if plugins is not None and TTFT_PLUGIN not in plugins.split(","):
        return ()
    return None if told is _Elsewhere.SET else _allowances(told, where)


class _Elsewhere(Enum):
    SET = "set from a ConfigMap or Secret"


def _env_value(container: Mapping[str, Any], name: str) -> str | _Elsewhere | None:
    """A variable of the container's environment as its manifest sets it: None when unset; ``_Elsewhere.SET``
    from a ConfigMap or Secret (``valueFrom``, or ``envFrom`` without an entry of its own)."""
    entry = next((e for e in container.get("env", []) if e.get("name") == name), None)
    if entry is None:
        return _Elsewhere.SET if container.get("envFrom") else None
    return str(entry["value"]) if "value" in entry else _Elsewhere.SET


def _allowances(text: str | None, where: str) -> tuple[TtftAllowance, ...]:
    """The TTFT allowances a container's engine writes a normalized series for."""
    try:
        return exported_allowances(text)
    except ValueError as exc:
        raise ValidationError(f"{where}: {exc}") from None


def workload_engines(resources: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], EngineBuckets]:
    """``(target kind, name)`` -> engine, for each workload with an API-serving engine container."""
    found: dict[tuple[str, str], EngineBuckets] = {}
    problems: list[str] = []
    for resource in resources:
        kind = WORKLOAD_KINDS.get(str(resource.get("kind")))
        if kind is None:
            continue
        name = str(resource.get("metadata", {}).get("name"))
        where = f"{resource['kind']}/{name}"
        engines = {
            engine.name: engine
            for spec in pod_specs(resource)
            for container in spec.get("containers", [])
            if (engine := container_engine(container, f"{where} container {container.get('name')}")) is not None
        }
        if len(engines) > 1:
            problems.append(f"{where}: its engine containers write different histogram buckets "
                            f"({', '.join(sorted(engines))})")
        elif engines:
            found[(kind, name)] = next(iter(engines.values()))
    if problems:
        raise ValidationError(problems)
    return found


def policy_engine(policy: Policy, engines: Mapping[tuple[str, str], EngineBuckets]) -> EngineBuckets:
    """The engine of the policy's target workload; for a target by model name, the one every workload shares.

    With no engine workload at all (the base, or policies for engines deployed
    elsewhere) the default is moeslo's engine.
    """
    target = policy.target
    if isinstance(target, KubernetesTarget) and (target.kind, target.name) in engines:
        return engines[(target.kind, target.name)]
    kinds = {engine.name: engine for engine in engines.values()}
    if len(kinds) > 1:
        raise ValidationError(
            f"policy {policy.name!r}: its target is not one of the workloads here and they write different "
            f"histogram buckets ({', '.join(sorted(kinds))}); target the workload (kind and name)"
        )
    return next(iter(kinds.values()), ENGINES["moeslo"])


__all__ = [
    "MOESLO_IMAGE",
    "PLUGIN_ENV",
    "PLUGIN_ON",
    "TTFT_PLUGIN",
    "VLLM_IMAGE",
    "WORKLOAD_KINDS",
    "command_line",
    "container_engine",
    "flag_value",
    "pod_specs",
    "policy_engine",
    "workload_engines",
]
