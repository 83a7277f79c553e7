"""An engine's fixed limits, read from its ``/metrics``: what a profile would otherwise have to guess.

- KV capacity (tokens): ``kv_cache_size_tokens`` of ``vllm:cache_config_info`` where vLLM states it,
  else ``block_size`` x ``num_gpu_blocks`` (vLLM and the embedded engine both export the gauge);
- batch limits: ``max_num_seqs`` and ``max_num_batched_tokens`` (the prefill chunk) of
  ``moeslo_scheduler_config_info``, which only the embedded engine exports.

A limit the engine does not export is None; the caller says what it assumed instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import httpx
from prometheus_client.parser import text_string_to_metric_families

from contracts.catalogue import CACHE_CONFIG_INFO, SCHEDULER_CONFIG_INFO

__all__ = [
    "ASSUMED_LIMITS", "EngineLimits", "ProfileLimits", "assumed_note", "parse_engine_limits", "profile_limits",
    "read_engine_limits",
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
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None


def _positive(labels: dict[str, str], name: str) -> int | None:
    try:
        value = int(labels.get(name, ""))
    except ValueError:  # vLLM writes "None" for a value it has not set
        return None
    return value if value > 0 else None


def parse_engine_limits(text: str) -> EngineLimits:
    """The limits in a Prometheus exposition (the first engine's, where several serve one ``/metrics``)."""
    kv = seqs = chunk = None
    for family in text_string_to_metric_families(text):
        if not family.samples:
            continue
        labels = family.samples[0].labels
        if family.name == CACHE_CONFIG_INFO:
            block, blocks = _positive(labels, "block_size"), _positive(labels, "num_gpu_blocks")
            kv = _positive(labels, "kv_cache_size_tokens") or (None if block is None or blocks is None
                                                                 else block * blocks)
        elif family.name == SCHEDULER_CONFIG_INFO:
            seqs, chunk = _positive(labels, "max_num_seqs"), _positive(labels, "max_num_batched_tokens")
    return EngineLimits(kv_capacity_tokens=kv, max_num_seqs=seqs, max_num_batched_tokens=chunk)


def read_engine_limits(url: str, *, timeout_s: float = 10.0) -> EngineLimits:
    """The limits the engine at ``url`` exports (none where ``/metrics`` does not answer or does not parse)."""
    try:
        response = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
        response.raise_for_status()
        return parse_engine_limits(response.text)
    except (httpx.HTTPError, ValueError):
        return EngineLimits()


def profile_limits(url: str, *, kv_capacity_tokens: int | None = None, max_num_seqs: int | None = None,
                   prefill_chunk_tokens: int | None = None) -> tuple[ProfileLimits, dict[str, int]]:  # fmt: skip
    """A profile's limits, each as given, else as the engine at ``url`` exports it, else assumed
    (:data:`ASSUMED_LIMITS`); and those assumed, for the profile to say so."""
    exported = read_engine_limits(url)
    given = {"kv_capacity_tokens": kv_capacity_tokens, "max_num_seqs": max_num_seqs,
             "prefill_chunk_tokens": prefill_chunk_tokens}
    found = {"kv_capacity_tokens": exported.kv_capacity_tokens, "max_num_seqs": exported.max_num_seqs,
             "prefill_chunk_tokens": exported.max_num_batched_tokens}
    limits = ASSUMED_LIMITS.copy()
    assumed: dict[str, int] = {}
    for key in ("kv_capacity_tokens", "max_num_seqs", "prefill_chunk_tokens"):
        value = given[key] if given[key] is not None else found[key]
        if value is None:
            assumed[key] = limits[key]
        else:
            limits[key] = value
    return limits, assumed


def assumed_note(assumed: dict[str, int]) -> str:
    """What a profile's ``source`` adds for the limits it assumed (empty where it assumed none)."""
    return "".join(f"; assumed {key} {value:,}" for key, value in assumed.items())
