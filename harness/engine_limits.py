"""An engine's fixed limits, read from its ``/metrics``: what a profile would otherwise have to guess.

- KV capacity (tokens): ``kv_cache_size_tokens`` of ``vllm:cache_config_info`` where vLLM states it,
  else ``block_size`` x ``num_gpu_blocks`` (vLLM and the embedded engine both export the gauge);
- batch limits: ``max_num_seqs`` and ``max_num_batched_tokens`` (the prefill chunk) of
  ``moeslo_scheduler_config_info``, which only the embedded engine exports.

One ``/metrics`` may serve several engines: vLLM with data parallelism writes each series once per
``engine`` label value (``log_metrics_info`` labels ``vllm:cache_config_info`` with each engine index).
Each engine has its own KV cache and its own running batch, and a profile describes the whole replica,
so the KV capacity and ``max_num_seqs`` are the engines' sum; each engine schedules its own steps, so
the prefill chunk is one engine's (the smallest).

A limit the engine does not export is None; the caller says what it assumed instead.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TypedDict

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from contracts.catalogue import CACHE_CONFIG_INFO, ENGINE_LABEL, SCHEDULER_CONFIG_INFO

__all__ = [
    "ASSUMED_LIMITS", "EngineLimits", "ProfileLimits", "assumed_note", "engines_note", "parse_engine_limits",
    "profile_limits", "read_engine_limits",
]


class ProfileLimits(TypedDict):
    """A replica profile's limits (``controller.capacity.ReplicaProfile``'s fields of the same names)."""

    kv_capacity_tokens: int
    max_num_seqs: int
    prefill_chunk_tokens: int


ASSUMED_LIMITS: ProfileLimits = {"kv_capacity_tokens": 100_000, "max_num_seqs": 256, "prefill_chunk_tokens": 2048}
"""What a profile says of a limit that neither the command line nor the engine's ``/metrics`` gives."""


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What the engine said of its limits (None: not exported)."""

    kv_capacity_tokens: int | None = None
    """All engines' KV caches together."""
    max_num_seqs: int | None = None
    """All engines' running batches together."""
    max_num_batched_tokens: int | None = None
    """One engine's step (the smallest, where they differ)."""
    engines: int = 1
    """How many engines (distinct ``engine`` labels) behind the ``/metrics`` the limits were read over."""
    uneven: tuple[str, ...] = ()
    """The limits whose engines' values differ (the sums and the smallest are taken all the same)."""


def _positive(labels: dict[str, str], name: str) -> int | None:
    try:
        value = int(labels.get(name, ""))
    except ValueError:  # vLLM writes "None" for a value it has not set
        return None
    return value if value > 0 else None


def _kv_tokens(labels: dict[str, str]) -> int | None:
    block, blocks = _positive(labels, "block_size"), _positive(labels, "num_gpu_blocks")
    return _positive(labels, "kv_cache_size_tokens") or (None if block is None or blocks is None else block * blocks)


def _by_engine(family: Metric) -> list[dict[str, str]]:
    """Each engine's labels: the first sample of each ``engine`` value (one engine where there is no label)."""
    engines: dict[str, dict[str, str]] = {}
    for sample in family.samples:
        engines.setdefault(sample.labels.get(ENGINE_LABEL, ""), sample.labels)
    return list(engines.values())


def _combine(values: list[int | None], combine: Callable[[list[int]], int]) -> int | None:
    """The engines' values combined; None where any engine does not state its own (a part is no whole)."""
    known = [value for value in values if value is not None]
    return combine(known) if known and len(known) == len(values) else None


def parse_engine_limits(text: str) -> EngineLimits:
    """The limits in a Prometheus exposition, over every engine it serves (see the module's note)."""
    per_engine: dict[str, list[int | None]] = {}
    for family in text_string_to_metric_families(text):
        if not family.samples:
            continue
        if family.name == CACHE_CONFIG_INFO:
            per_engine["kv_capacity_tokens"] = [_kv_tokens(labels) for labels in _by_engine(family)]
        elif family.name == SCHEDULER_CONFIG_INFO:
            engines = _by_engine(family)
            for name in ("max_num_seqs", "max_num_batched_tokens"):
                per_engine[name] = [_positive(labels, name) for labels in engines]
    if not per_engine:
        return EngineLimits()
    return EngineLimits(
        kv_capacity_tokens=_combine(per_engine.get("kv_capacity_tokens", []), sum),
        max_num_seqs=_combine(per_engine.get("max_num_seqs", []), sum),
        max_num_batched_tokens=_combine(per_engine.get("max_num_batched_tokens", []), min),
        engines=max(len(values) for values in per_engine.values()),
        uneven=tuple(name for name, values in per_engine.items() if len(set(values)) > 1),
    )


def read_engine_limits(url: str, *, timeout_s: float = 10.0) -> EngineLimits:
    """The limits the engine at ``url`` exports (none where ``/metrics`` does not answer or does not parse)."""
    try:
        response = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
        response.raise_for_status()
        return parse_engine_limits(response.text)
    except (httpx.HTTPError, ValueError):
        return EngineLimits()


def profile_limits(url: str, *, kv_capacity_tokens: int | None = None, max_num_seqs: int | None = None,
                   prefill_chunk_tokens: int | None = None) -> tuple[ProfileLimits, dict[str, int], str]:  # fmt: skip
    """A profile's limits, each as given, else as the engine at ``url`` exports it, else assumed
    (:data:`ASSUMED_LIMITS`); those assumed, and :func:`engines_note` of those read, for the profile to say so."""
    exported = read_engine_limits(url)
    given = {"kv_capacity_tokens": kv_capacity_tokens, "max_num_seqs": max_num_seqs,
             "prefill_chunk_tokens": prefill_chunk_tokens}
    found = {"kv_capacity_tokens": exported.kv_capacity_tokens, "max_num_seqs": exported.max_num_seqs,
             "prefill_chunk_tokens": exported.max_num_batched_tokens}
    limits = ASSUMED_LIMITS.copy()
    assumed: dict[str, int] = {}
    read: list[str] = []
    for key in ("kv_capacity_tokens", "max_num_seqs", "prefill_chunk_tokens"):
        value = given[key] if given[key] is not None else found[key]
        if value is None:
            assumed[key] = limits[key]
        else:
            limits[key] = value
            read += [] if given[key] is not None else [key]
    return limits, assumed, engines_note(exported, read)


_ENGINE_FIELD = {"kv_capacity_tokens": "kv_capacity_tokens", "max_num_seqs": "max_num_seqs",
                 "prefill_chunk_tokens": "max_num_batched_tokens"}


def engines_note(exported: EngineLimits, read: Collection[str]) -> str:
    """What a profile's source adds where the limits it ``read`` (profile keys) add up several engines
    (empty for one engine): how many were summed, and which limits differ between them."""
    if exported.engines <= 1 or not read:
        return ""
    summed = [key for key in ("kv_capacity_tokens", "max_num_seqs") if key in read]
    parts = [f"{' and '.join(summed)} summed over {exported.engines} engines behind one /metrics"] if summed else []
    if "prefill_chunk_tokens" in read:
        parts.append(f"prefill_chunk_tokens one engine's (the smallest of {exported.engines})")
    uneven = [key for key in read if _ENGINE_FIELD[key] in exported.uneven]
    if uneven:
        parts.append(f"the engines' {' and '.join(uneven)} differ")
    return "; " + "; ".join(parts)


def assumed_note(assumed: dict[str, int]) -> str:
    """What a profile's ``source`` adds for the limits it assumed (empty where it assumed none)."""
    return "".join(f"; assumed {key} {value:,}" for key, value in assumed.items())
