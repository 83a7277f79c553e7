"""Reading a replica's load from its ``/metrics`` text (pure parsing; the fetching lives in :mod:`router.pool`).

Our engine and vLLM both write ``vllm:num_requests_waiting``,
``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc``; a replica
serving several models (or EP engines) sums its series, and KV usage takes
the largest.  A body with none of them is a replica without exporters: the
router then routes on its own counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from contracts.catalogue import KV_CACHE_USAGE, RUNNING, WAITING
from contracts.errors import DataError

_NAMES = (WAITING, RUNNING, KV_CACHE_USAGE)
_PREFIXES = tuple(f"{name}{{" for name in _NAMES) + tuple(f"{name} " for name in _NAMES)
_COMMENTS = tuple(f"# {kind} {name} " for name in _NAMES for kind in ("TYPE", "HELP"))
"""Only these lines are parsed: an engine with per-expert series writes tens of thousands of others."""


@dataclass(frozen=True, slots=True)
class ScrapedLoad:
    """The load series of one scrape (None: the series was absent)."""

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None


def parse_load(text: str) -> ScrapedLoad:
    """The load series in a Prometheus text body; DataError when the body does not parse."""
    sums: dict[str, float] = {}
    kv: float | None = None
    wanted = [line for line in text.splitlines() if line.startswith(_PREFIXES) or line.startswith(_COMMENTS)]
    try:
        for family in text_string_to_metric_families("\n".join(wanted) + "\n"):
            for sample in family.samples:
                if family.name == KV_CACHE_USAGE:
                    kv = sample.value if kv is None else max(kv, sample.value)
                else:
                    sums[family.name] = sums.get(family.name, 0.0) + sample.value
    except (ValueError, TypeError, IndexError) as exc:
        raise DataError(f"unparseable metrics: {exc}") from exc
    return ScrapedLoad(waiting=sums.get(WAITING), running=sums.get(RUNNING), kv_usage=kv)


__all__ = ["ScrapedLoad", "parse_load"]
