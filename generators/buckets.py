"""Whose histogram buckets an engine writes, and the check that every SLO threshold is one of its edges.

The alert rules and the dashboards count good events from the cumulative
bucket at the threshold (``le="0.02"``); a threshold between two edges has no
such series and would count nothing.  So every generator (alerts, dashboards,
manifests) refuses a policy whose thresholds are not edges of its target
engine's histograms, naming the threshold and the nearest edges.

Engines, by name:

* ``moeslo``: the embedded engine (ITL edges include 0.02);
* ``vllm``: a stock vLLM 0.32 server (ITL edges 0.01, 0.025, ...: no 0.02);
* ``vllm-slo-buckets``: vLLM started with
  :func:`contracts.catalogue.vllm_slo_bucket_args` (``--custom-histogram-buckets``
  with our ITL edges), as every vLLM in deploy/ is.

A vLLM started with other custom buckets is described by
:func:`vllm_engine` from its parsed flag (the manifest generator reads it from
the container arguments).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from contracts.catalogue import (
    BUCKETS_BY_METRIC,
    ITL_HISTOGRAM,
    TTFT_NORMALIZED_HISTOGRAM,
    VLLM_CUSTOM_BUCKETS_FLAG,
    VLLM_SLO_CUSTOM_BUCKETS,
    format_le,
    is_bucket_edge,
    nearest_edges,
    vllm_buckets_by_metric,
)
from contracts.errors import ValidationError
from contracts.ttft_objective import TTFT_ALLOWANCES_ENV, TtftAllowance, format_allowances
from controller.policy import Policy
from controller.ttft_series import ttft_metric

EngineName = Literal["moeslo", "vllm", "vllm-slo-buckets"]
ENGINE_NAMES: tuple[EngineName, ...] = ("moeslo", "vllm", "vllm-slo-buckets")


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineBuckets:
    """The histogram edges one kind of engine writes, by histogram name."""

    name: str
    """Shown in messages: ``moeslo``, ``vllm``, ``vllm-slo-buckets`` or ``vllm (custom buckets)``."""
    edges: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    hint: str = ""
    """What to do when a threshold is not an edge (appended to the message)."""
    ttft_allowances: tuple[TtftAllowance, ...] | None = None
    """The long-prompt allowances it writes ``moeslo_ttft_normalized_seconds`` for (None: not known here; none:
    it writes no such series, as a vLLM without the moeslo plugin)."""


def _vllm_edges(custom: Mapping[str, Sequence[float]] | None = None) -> Mapping[str, tuple[float, ...]]:
    """The edges a vLLM server writes: its own histograms' (``custom`` replaces a family's), and the moeslo
    plugin's normalized TTFT, always with the catalogue's TTFT edges (vLLM's flag does not reach it)."""
    edges = {**vllm_buckets_by_metric(custom), TTFT_NORMALIZED_HISTOGRAM: BUCKETS_BY_METRIC[TTFT_NORMALIZED_HISTOGRAM]}
    return MappingProxyType(edges)


_VLLM_PLUGIN_ON = "MOESLO_VLLM_PLUGIN=1 in the moeslo-vllm image; VLLM_PLUGINS, where set, naming moeslo_ttft"
_VLLM_HINT = (
    f"start vLLM with {VLLM_CUSTOM_BUCKETS_FLAG} (contracts.catalogue.vllm_slo_bucket_args) "
    "so the threshold is an edge, or choose an edge"
)
ENGINES: Mapping[str, EngineBuckets] = MappingProxyType({
    "moeslo": EngineBuckets(name="moeslo", edges=MappingProxyType(dict(BUCKETS_BY_METRIC))),
    "vllm": EngineBuckets(name="vllm", edges=_vllm_edges(), hint=_VLLM_HINT),
    "vllm-slo-buckets": EngineBuckets(name="vllm-slo-buckets", edges=_vllm_edges(VLLM_SLO_CUSTOM_BUCKETS)),
})  # fmt: skip


def engine_buckets(engine: str | EngineBuckets) -> EngineBuckets:
    """An engine by name (one of :data:`ENGINE_NAMES`), or the given description unchanged."""
    if isinstance(engine, EngineBuckets):
        return engine
    try:
        return ENGINES[engine]
    except KeyError:
        raise ValidationError(f"engine must be one of {', '.join(ENGINE_NAMES)}, got {engine!r}") from None


def vllm_engine(custom: Mapping[str, Sequence[float]] | None) -> EngineBuckets:
    """A vLLM server started with ``--custom-histogram-buckets`` = ``custom`` (None: without the flag)."""
    if not custom:
        return ENGINES["vllm"]
    edges = _vllm_edges(custom)
    if edges == ENGINES["vllm-slo-buckets"].edges:
        return ENGINES["vllm-slo-buckets"]
    return EngineBuckets(name="vllm (custom buckets)", edges=edges, hint=_VLLM_HINT)


def threshold_problems(policy: Policy, engine: str | EngineBuckets) -> list[str]:
    """One message per latency threshold of ``policy`` that is not an edge of the engine's histogram."""
    described = engine_buckets(engine)
    problems: list[str] = []
    for slo, metric, threshold_s in (
        ("ttft", ttft_metric(policy.objectives.ttft.allowance), policy.objectives.ttft.threshold_s),
        ("itl", ITL_HISTOGRAM, policy.objectives.itl.threshold_s),
    ):
        edges = described.edges[metric]
        if is_bucket_edge(threshold_s, edges):
            continue
        below, above = nearest_edges(threshold_s, edges)
        nearest = " and ".join(format_le(e) for e in (below, above) if e is not None)
        problems.append(
            f"policy {policy.name!r}: objectives.{slo}.threshold_s = {threshold_s!r} is not a bucket edge of "
            f"{metric} ({described.name}); the nearest edges are {nearest}. Good events are counted from the "
            f"bucket at the threshold, so it must be one of {', '.join(format_le(e) for e in edges)}"
            + (f"; {described.hint}" if described.hint else "")
        )
    allowance = policy.objectives.ttft.allowance
    exported = described.ttft_allowances
    if not allowance.flat and exported is not None and allowance.labels() not in [a.labels() for a in exported]:
        wanted = format_allowances((allowance,))
        reads = f"policy {policy.name!r}: its TTFT objective reads {TTFT_NORMALIZED_HISTOGRAM} at the long-prompt "
        problems.append(
            reads + f"allowance {wanted}, but its engine writes no {TTFT_NORMALIZED_HISTOGRAM}: switch vLLM's moeslo "
            f"plugin on ({_VLLM_PLUGIN_ON})" if not exported else
            reads + f"allowance {wanted}, which its engine does not write (it writes {format_allowances(exported)}); "
            f"start it with --ttft-allowances {wanted} (moeslo serve) or {TTFT_ALLOWANCES_ENV}={wanted} (vLLM)"
        )  # fmt: skip
    return problems


def check_thresholds(
    policies: Sequence[Policy], engine: str | EngineBuckets | Mapping[str, EngineBuckets] = "moeslo"
) -> None:
    """Refuse latency thresholds that are not bucket edges of ``engine`` (a mapping: each policy's own by name,
    moeslo's for the others), and duplicate names; all at once."""

    def engine_of(policy: Policy) -> str | EngineBuckets:
        if isinstance(engine, Mapping):
            return engine.get(policy.name, ENGINES["moeslo"])
        return engine

    problems = [problem for policy in policies for problem in threshold_problems(policy, engine_of(policy))]
    names = [policy.name for policy in policies]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    problems.extend(f"policy name {name!r} appears more than once" for name in duplicates)
    if problems:
        raise ValidationError(problems)


__all__ = [
    "ENGINES",
    "ENGINE_NAMES",
    "EngineBuckets",
    "EngineName",
    "check_thresholds",
    "engine_buckets",
    "threshold_problems",
    "vllm_engine",
]
