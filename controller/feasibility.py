"""Requests no fleet can serve within the TTFT objective: counted apart, never a reason to scale up.

A request is infeasible when an idle replica, prefilling its uncached tokens at
full speed, already misses the objective (:mod:`contracts.ttft_objective`): its
prompt length lies in :meth:`controller.capacity.CapacityModel.infeasible_prompts` (every length
beyond one, or a band when the allowance outruns the prefill).  The engines report finished
requests by prompt length (``vllm:request_prompt_tokens``), so the share in it is read from the
histogram (interpolated inside the buckets that hold its ends, as ``histogram_quantile`` does).

Such requests count against the SLO as they are (the status shows both), but the
signals that drive scale-ups judge only the feasible ones: the TTFT good ratios are
taken over the feasible requests, and a p99 TTFT that the infeasible tail reaches is
not used for pressure or for correcting the capacity model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from contracts.histograms import histogram_quantile
from controller.types import PolicyObservation

__all__ = ["MIN_TAIL_REQUESTS", "P99_TAIL_SHARE", "feasible_view", "infeasible_share", "prompt_length_tail"]

P99_TAIL_SHARE = 0.002
"""Infeasible share from which the observed p99 TTFT is taken to be theirs (a fifth of the 1 % tail)."""
MIN_TAIL_REQUESTS = 200.0
"""Finished requests in the window below which the prompt histogram is too thin to read a length tail from."""


def infeasible_share(
    buckets: Sequence[tuple[float, float]], shortest: float, longest: float = math.inf
) -> float | None:
    """Share of requests with prompts longer than ``shortest`` and shorter than ``longest`` (None without data).

    The two are :meth:`controller.capacity.CapacityModel.infeasible_prompts`: a band when an allowance above the
    prefill time per token lets the longest prompts catch up, else everything beyond ``shortest``.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    return max(_share_beyond(buckets, shortest) - _share_beyond(buckets, longest), 0.0)


def _share_beyond(buckets: Sequence[tuple[float, float]], length: float) -> float:
    """Share of the requests with prompts longer than ``length`` in a cumulative histogram with a count."""
    if math.isinf(length):
        return 0.0
    total = buckets[-1][1]
    below_edge, below_count = 0.0, 0.0
    for edge, count in buckets:
        if edge >= length:
            if math.isinf(edge):
                within = below_count  # beyond the last finite edge: nothing to interpolate with
            else:
                within = below_count + (count - below_count) * (length - below_edge) / (edge - below_edge)
            return min(max(1.0 - within / total, 0.0), 1.0)
        below_edge, below_count = edge, count
    return 0.0


def feasible_view(observation: PolicyObservation, share: float | None) -> PolicyObservation:
    """The observation as the scale-up signals should see it: TTFT judged over the feasible requests.

    Each good ratio ``r`` becomes ``r / (1 - share)``, taking the infeasible requests as all missed, and the
    TTFT event count shrinks to the feasible requests (a handful of them is noise, as any handful is).  A ratio
    above ``1 - share`` contradicts that: fewer requests missed than the model calls infeasible, so some it calls
    infeasible were served in time and the share overstates.  Such a ratio stays as observed, and where the
    short window's does, the whole observation does (its p99 too), so a wrong model never hides a miss.
    """
    sli = observation.sli
    if sli is None or share is None or share <= 0:
        return observation
    feasible = 1.0 - share
    if sli.ttft_good_ratio is not None and sli.ttft_good_ratio > feasible:
        return observation
    if share >= 1.0:
        by_window: dict[str, float] = {}
        ratio_now = None
    else:
        by_window = {w: r if r > feasible else min(r / feasible, 1.0) for w, r in sli.ttft_good_ratio_by_window.items()}
        ratio_now = None if sli.ttft_good_ratio is None else min(sli.ttft_good_ratio / feasible, 1.0)
    requests = sli.ttft_events_in_window if sli.ttft_events_in_window is not None else sli.requests_in_window
    adjusted = replace(
        sli,
        ttft_good_ratio=ratio_now,
        ttft_good_ratio_by_window=by_window,
        ttft_p99_s=None if share >= P99_TAIL_SHARE else sli.ttft_p99_s,
        ttft_events_in_window=None if requests is None else requests * max(feasible, 0.0),
    )
    return replace(observation, sli=adjusted)


def prompt_length_tail(buckets: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Squared coefficient of variation and p99 over mean of the prompt lengths in a cumulative histogram.

    Lengths are taken as spread evenly inside each bucket (as ``histogram_quantile`` interpolates);
    those beyond the last finite edge sit at it.  None under :data:`MIN_TAIL_REQUESTS` requests.
    """
    if not buckets or buckets[-1][1] < MIN_TAIL_REQUESTS:
        return None
    total = buckets[-1][1]
    first = second = 0.0
    low, below = 0.0, 0.0
    for edge, count in buckets:
        inside = count - below
        high = low if math.isinf(edge) else edge
        first += inside * (low + high) / 2.0
        second += inside * (low * low + low * high + high * high) / 3.0
        low, below = high, count
    mean = first / total
    if mean <= 0:
        return None
    cv2 = max(second / total / (mean * mean) - 1.0, 0.0)
    p99 = histogram_quantile(0.99, dict(buckets))
    return None if p99 is None else (cv2, p99 / mean)

