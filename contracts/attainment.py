"""Whether one request met the latency objectives: the per-request verdict the demo and the replay share.

A request is *within both objectives* when its time to first token is at most
the TTFT threshold and its inter-token latency is at most the ITL threshold,
where a request's ITL is its mean gap between tokens (time per output token,
as the serving literature scores per-request SLO attainment; DistServe,
Splitwise).  The controller's ITL *SLI* is per gap instead (the share of all
gaps at or under the threshold, from the histogram): both are reported, and
:func:`every_gap_within` gives the strict per-request reading (no gap over).
"""

from __future__ import annotations

from collections.abc import Sequence

from contracts.slo_defaults import ITL_THRESHOLD_S, TTFT_THRESHOLD_S

__all__ = ["every_gap_within", "gaps_within_share", "mean_itl_s", "within_objectives"]


def mean_itl_s(itls_s: Sequence[float]) -> float | None:
    """The request's mean inter-token gap (None for a single-token answer)."""
    return sum(itls_s) / len(itls_s) if itls_s else None


def within_objectives(
    ttft_s: float | None,
    itls_s: Sequence[float],
    *,
    ttft_threshold_s: float = TTFT_THRESHOLD_S,
    itl_threshold_s: float = ITL_THRESHOLD_S,
) -> bool:
    """TTFT at or under its threshold and mean ITL at or under its threshold (no first token: not within)."""
    if ttft_s is None or ttft_s > ttft_threshold_s:
        return False
    itl = mean_itl_s(itls_s)
    return itl is None or itl <= itl_threshold_s


def every_gap_within(
    ttft_s: float | None,
    itls_s: Sequence[float],
    *,
    ttft_threshold_s: float = TTFT_THRESHOLD_S,
    itl_threshold_s: float = ITL_THRESHOLD_S,
) -> bool:
    """The strict reading: TTFT within, and no single gap over the ITL threshold."""
    return ttft_s is not None and ttft_s <= ttft_threshold_s and all(x <= itl_threshold_s for x in itls_s)


def gaps_within_share(itls_s: Sequence[float], *, itl_threshold_s: float = ITL_THRESHOLD_S) -> float | None:
    """The share of token gaps at or under the ITL threshold: the controller's ITL SLI (None: no gaps)."""
    return sum(x <= itl_threshold_s for x in itls_s) / len(itls_s) if itls_s else None
