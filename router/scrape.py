"""Reading a replica's load from its ``/metrics`` text (pure parsing; the fetching lives in :mod:`router.monitor`).

Our engine and vLLM both write ``vllm:num_requests_waiting``,
``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc``; a replica
serving several models (or EP engines) sums its series, and KV usage takes
the largest.  A body with none of them is a replica without exporters: the
router then routes on its own counts.

Only the lines of those three series are read, found by substring search:
an engine with per-expert series writes tens of thousands of other lines
(about a megabyte), and this runs on the router's event loop.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from contracts.catalogue import KV_CACHE_USAGE, RUNNING, WAITING
from contracts.errors import DataError

_NAMES = (WAITING, RUNNING, KV_CACHE_USAGE)
_SAMPLE = re.compile(
    r"^(?P<name>[^{ \t]+)"
    r"(?:\{(?:[^\"}]|\"(?:[^\"\\]|\\.)*\")*\})?"  # labels; a quoted value may hold braces
    r"[ \t]+(?P<value>\S+)(?:[ \t]+-?\d+)?[ \t]*$"  # value, then an optional timestamp
)


@dataclass(frozen=True, slots=True)
class ScrapedLoad:
    """The load series of one scrape (None: the series was absent)."""

    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None


def _lines(text: str) -> list[str]:
    """The lines that start with one of the three names followed by ``{`` or a blank."""
    found = []
    for name in _NAMES:
        starts = [0] if text.startswith(name) else []
        at = text.find("\n" + name)
        while at >= 0:
            starts.append(at + 1)
            at = text.find("\n" + name, at + 1)
        for begin in starts:
            end = text.find("\n", begin)
            line = text[begin : end if end >= 0 else len(text)]
            if line[len(name) : len(name) + 1] in ("{", " ", "\t"):
                found.append(line)
    return found


def parse_load(text: str) -> ScrapedLoad:
    """The load series in a Prometheus text body; DataError when one of their lines does not parse or holds
    NaN or an infinity."""
    sums: dict[str, float] = {}
    kv: float | None = None
    for line in _lines(text):
        match = _SAMPLE.match(line)
        try:
            if match is None:
                raise ValueError(f"not a sample line: {line[:80]!r}")
            name, value = match["name"], float(match["value"])
            if not math.isfinite(value):  # valid Prometheus text, but no count to route on
                raise ValueError(f"{name} is not a finite number: {match['value']}")
        except ValueError as exc:
            raise DataError(f"unparseable metrics: {exc}") from exc
        if name == KV_CACHE_USAGE:
            kv = value if kv is None else max(kv, value)
        else:
            sums[name] = sums.get(name, 0.0) + value
    return ScrapedLoad(waiting=sums.get(WAITING), running=sums.get(RUNNING), kv_usage=kv)


__all__ = ["ScrapedLoad", "parse_load"]
