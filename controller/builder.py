"""The one way a decision core is built: for the service, the local stack, the replay and the benchmarks.

``moeslo controller serve`` (and so ``moeslo up``), ``moeslo replay``'s moeslo
strategy and ``moeslo bench controller`` all call :func:`build_decision_core`, so
what the replay proves is what production runs.  Per policy, the core's sizing
advisor reads the policy's own settings (``forecast``, ``profile``, objectives,
``lead_time_s``, ``scaling``); what is set here is what is shared by every policy:
the tick, the default replica profile, the reactive thresholds and the
forecaster's refit cadence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.advisors import ReactiveAdvisor, ReactiveConfig
from controller.capacity import DEFAULT_PROFILE, ReplicaProfile
from controller.core import CoreConfig, DecisionCore
from controller.forecast import ForecastConfig
from controller.forecast.history import DAY_S, TWO_WEEKS_S
from controller.forecast.models import preload_fitters
from controller.predictive import PredictiveAdvisor, PredictiveConfig
from controller.scale_check import ScaleCheckConfig, ScaleChecker
from controller.sizing import SizingAdvisor
from controller.sources.base import RATE_WINDOW_S

__all__ = ["CoreOptions", "build_decision_core", "sizing_advisor"]


@dataclass(frozen=True, kw_only=True, slots=True)
class CoreOptions:
    tick_interval_s: float = 15.0
    stale_after_s: float | None = None
    """Observations older than this hold a policy (None: three ticks)."""
    profile: ReplicaProfile = DEFAULT_PROFILE
    """Capacity of one replica for policies that name no profile of their own."""
    reactive: ReactiveConfig = field(default_factory=ReactiveConfig)
    scale_check: ScaleCheckConfig = field(default_factory=ScaleCheckConfig)
    refit_every_ticks: int = 240
    """Refit each policy's forecaster at most this often once its history is long (refits are staggered)."""
    season_s: float | None = DAY_S
    rate_window_s: float | None = RATE_WINDOW_S
    """The window the observed request rates count arrivals over (the source's): the forecast audit
    judges the forecast's error above the counts' Poisson noise."""
    history_keep_s: float = TWO_WEEKS_S
    isolate_advisor_errors: bool = True
    """False lets an advisor's exception through (replays and tests, where bugs should surface)."""


def sizing_advisor(options: CoreOptions) -> SizingAdvisor:
    forecast = ForecastConfig(
        bin_s=options.tick_interval_s,
        horizon_s=options.tick_interval_s,
        keep_s=max(options.history_keep_s, 2 * (options.season_s or 0.0), options.tick_interval_s),
        refit_every_bins=options.refit_every_ticks,
        season_s=options.season_s,
    )
    predictive = PredictiveAdvisor(
        PredictiveConfig(forecast=forecast, profile=options.profile, rate_window_s=options.rate_window_s)
    )
    return SizingAdvisor(predictive, ReactiveAdvisor(options.reactive), ScaleChecker(options.scale_check))


def build_decision_core(options: CoreOptions | None = None) -> DecisionCore:
    """The production decision core: guardrails over the forecast-first sizing advisor."""
    options = options or CoreOptions()
    preload_fitters()
    return DecisionCore(
        [sizing_advisor(options)],
        CoreConfig(
            tick_interval_s=options.tick_interval_s,
            stale_after_s=options.stale_after_s,
            isolate_advisor_errors=options.isolate_advisor_errors,
        ),
    )
