"""What every SLI source shares: the interface, metric names, windows and histogram math.

A source turns policies into :class:`~controller.types.PolicyObservation`
values (SLIs, queue depth, load).  It never fills ``current_replicas``: the
actuator knows how many replicas were asked for.  A source that cannot read a
value leaves it ``None`` and says why in ``errors``; it never reports a zero it
did not see.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Mapping, Sequence
from typing import Protocol, TypeVar

from contracts.catalogue import (
    GENERATION_TOKENS,
    ITL_HISTOGRAM,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    REQUEST_SUCCESS,
    TTFT_HISTOGRAM,
    total,
)
from contracts.errors import UnavailableError
from contracts.ttft_objective import TtftAllowance
from controller.policy import Policy
from controller.ttft_series import ttft_matchers, ttft_metric
from controller.types import PolicyObservation

HISTOGRAMS: Mapping[str, str] = {"ttft": TTFT_HISTOGRAM, "itl": ITL_HISTOGRAM}
REQUESTS_TOTAL = total(REQUEST_SUCCESS)
PROMPT_TOKENS_TOTAL = total(PROMPT_TOKENS)
GENERATION_TOKENS_TOTAL = total(GENERATION_TOKENS)
PREFIX_QUERIES_TOTAL = total(PREFIX_CACHE_QUERIES)
PREFIX_HITS_TOTAL = total(PREFIX_CACHE_HITS)

SHORT_WINDOW = "5m"
"""The window of ``SliSnapshot.ttft_good_ratio`` and the p99s unless the controller sets ``sli_window_s``
(the short window of the SRE workbook's multiwindow burn rates)."""
BURN_WINDOWS: tuple[str, ...] = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
"""Burn-rate windows: the short and long windows of the SRE workbook's multiwindow alerts."""
QUANTILE = 0.99
RATE_WINDOW_S = 60.0
"""Request and token rates are averaged over this long."""

_T = TypeVar("_T")


class LateAnswerError(UnavailableError):
    """A read that had not ended when its time was up."""


async def within(work: Awaitable[_T], timeout_s: float | None, what: str) -> _T:
    """``work``'s result, or a :class:`LateAnswerError` naming ``what`` when it has not ended after ``timeout_s``
    (None: no bound, as an HTTP client without a timeout).

    httpx's timeout bounds each socket read, not an answer: an endpoint that sends a byte per read never trips it
    and would hold whoever awaits it (the tick loop, for every policy) as long as it likes.
    """
    try:
        return await asyncio.wait_for(work, timeout_s)
    except TimeoutError as exc:
        raise LateAnswerError(f"{what}: no complete answer within {timeout_s:g} s") from exc


class SliSource(Protocol):
    """Something that observes the engines behind policies."""

    async def observe(self, policies: Sequence[Policy], now_s: float) -> dict[str, PolicyObservation]:
        """One observation per policy name, taken at ``now_s`` (the caller's monotonic clock)."""
        ...

    async def aclose(self) -> None: ...


def ttft_key(policy: Policy) -> str:
    """The key of the TTFT series a policy reads: ``ttft``, or ``ttft[<reference>,<per 1k>]`` with an allowance."""
    return allowance_key(policy.objectives.ttft.allowance)


def allowance_key(allowance: TtftAllowance) -> str:
    if allowance.flat:
        return "ttft"
    labels = allowance.labels()
    return f"ttft[{labels['reference_prompt_tokens']},{labels['per_1k_prompt_tokens_s']}]"


def sli_series(policies: Sequence[Policy]) -> dict[str, tuple[str, str]]:
    """Every latency series the policies read, by key: (histogram name, extra label matchers)."""
    series = {slo: (metric, "") for slo, metric in HISTOGRAMS.items()}
    for policy in policies:
        allowance = policy.objectives.ttft.allowance
        series.setdefault(ttft_key(policy), (ttft_metric(allowance), ttft_matchers(allowance)))
    return series


def windows_for(policies: Sequence[Policy], sli_window: str = SHORT_WINDOW) -> tuple[str, ...]:
    """The SLI window, the burn-rate windows and every policy's compliance window."""
    return tuple(dict.fromkeys((sli_window, *BURN_WINDOWS, *sorted({p.window for p in policies}))))


def same_edge(le: float, threshold_s: float) -> bool:
    """Whether a bucket's upper edge is the SLO threshold (edges are exact decimal floats)."""
    return math.isclose(le, threshold_s, rel_tol=1e-9, abs_tol=1e-12)


def parse_le(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def edges_around(edges: Sequence[float], threshold_s: float) -> tuple[float, ...]:
    """The bucket edge at the threshold, or the finite edges just below and above it."""
    finite = sorted(e for e in edges if math.isfinite(e))
    exact = [e for e in finite if same_edge(e, threshold_s)]
    if exact:
        return (exact[0],)
    below = [e for e in finite if e < threshold_s]
    above = [e for e in finite if e > threshold_s]
    return tuple(([below[-1]] if below else []) + ([above[0]] if above else []))


def good_count_at(buckets: Mapping[float, float], threshold_s: float) -> float | None:
    """Events at or under the threshold from cumulative counts by bucket edge.

    The count of the bucket whose edge is the threshold when there is one;
    otherwise a linear interpolation inside the bucket that holds the
    threshold (as ``histogram_quantile`` assumes), because a stock vLLM ITL
    histogram has no 0.02 edge.  None when the threshold lies beyond the last
    finite edge (nothing to interpolate against) or there are no buckets.
    """
    finite = {e: c for e, c in buckets.items() if math.isfinite(e)}
    for edge, count in finite.items():
        if same_edge(edge, threshold_s):
            return count
    above = [e for e in finite if e > threshold_s]
    if not above:
        return None
    upper = min(above)
    below = [e for e in finite if e < threshold_s]
    lower = max(below) if below else 0.0
    lower_count = finite[lower] if below else 0.0
    return lower_count + (finite[upper] - lower_count) * (threshold_s - lower) / (upper - lower)


def burn_rates_of(ratios: Mapping[str, float], target: float) -> dict[str, float]:
    """Burn rate per window from good ratios per window: ``(1 - ratio) / (1 - target)``."""
    budget = 1.0 - target
    return {window: max(0.0, 1.0 - min(ratio, 1.0)) / budget for window, ratio in ratios.items()}


def model_matcher(models: Sequence[str]) -> str:
    """A PromQL matcher on ``model_name`` for one model (``=``) or several (``=~``)."""
    distinct = sorted(set(models))
    if len(distinct) == 1:
        return f'model_name="{_promql_string(distinct[0])}"'
    pattern = "|".join(_regex_escape(m) for m in distinct)
    return f'model_name=~"{_promql_string(pattern)}"'


def label_matchers(labels: Mapping[str, str]) -> str:
    """Exact-match PromQL matchers for ``labels`` (names already validated), values escaped."""
    return ",".join(f'{name}="{_promql_string(value)}"' for name, value in sorted(labels.items()))


_REGEX_SPECIAL = set(r".^$*+?()[]{}|\\")


def _regex_escape(text: str) -> str:
    return "".join(f"\\{ch}" if ch in _REGEX_SPECIAL else ch for ch in text)


def _promql_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
