"""Arrival bursts that one-minute rates average away (pure).

Some traffic is on/off at the scale of seconds: the Azure 2023 code trace sends two thousand
requests in fifteen seconds between quiet half-minutes.  A one-minute rate sees half of that, and a
fleet sized for it meets the next burst short.  So the sources also report the highest request
rate over any :data:`PEAK_STEP_S` of the SLI window, and the advisors size for the load of that
half-minute as well as for the last minute's: to the targets themselves, without the headroom the
last minute's load is sized with (the headroom is for what the model does not see, and this it
sees; with it, the Azure conversation trace's mild half-minute swings cost up to 10 % more
replica-hours in the replay, and 3-6 % without).

Poisson arrivals have busier and quieter half-minutes too, and the queueing model already
allows for those: only the part of the peak beyond :data:`POISSON_Z` standard deviations of a
Poisson count at the window's mean rate counts as a burst.  Smooth traffic therefore asks for
next to nothing more (Poisson arrivals, the last minute's rate and the window's mean read from
the same counts: under 1 % of five-minute windows show a "burst" at 10 requests/s, of under 10 %
over the mean; about 1 % at 1 request/s, of up to 30 %).  A burst counts for the SLI window
after it, and the stabilization window then holds its need for the cooldown.
"""

from __future__ import annotations

import math

from controller.capacity import Load
from controller.types import PolicyObservation

__all__ = ["PEAK_STEP_S", "POISSON_Z", "burst_load", "peak_beyond_noise_rps"]

PEAK_STEP_S = 30.0
"""The sub-window of the peak rate: consecutive scrapes at kube-prometheus-stack's default interval (30 s),
every other one at our PodMonitors' (15 s)."""

POISSON_Z = 3.0
"""A half-minute this many Poisson standard deviations above the window's mean is a burst (about 1 in 700 by
chance)."""


def peak_beyond_noise_rps(peak_rps: float, mean_rps: float) -> float:
    """The peak rate less what Poisson arrivals at ``mean_rps`` reach by chance in one :data:`PEAK_STEP_S`."""
    noise_rps = POISSON_Z * math.sqrt(max(mean_rps, 0.0) * PEAK_STEP_S) / PEAK_STEP_S
    return peak_rps - noise_rps


def burst_load(obs: PolicyObservation, served: Load) -> Load | None:
    """The load of the SLI window's busiest half-minute, at the last minute's lengths.

    None when there is no burst: no peak or SLI window reported, nothing served in the last minute
    (no lengths to size with), or a peak within Poisson noise of the window's mean, or, less that
    noise, below the last minute's rate or the window's mean.
    """
    sli = obs.sli
    peak = obs.request_rate_peak_rps
    if peak is None or sli is None or sli.requests_in_window is None or sli.window_s <= 0:
        return None
    if served.request_rate_rps <= 0 or not math.isfinite(peak):
        return None
    mean_rps = sli.requests_in_window / sli.window_s
    bursting = peak_beyond_noise_rps(peak, mean_rps)
    # Against the window's mean as well as the last minute's rate: a minute that reads low by chance is
    # no burst after it.
    if bursting <= max(served.request_rate_rps, mean_rps):
        return None
    return served.scaled(bursting / served.request_rate_rps)
