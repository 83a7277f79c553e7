"""Where a policy stands, from the same :class:`PolicyStatus` that ``/v1/status`` serves.

The multiwindow alerting pairs are the SRE workbook's (:func:`controller.slo.standard_burn_rate_windows`
for the policy's compliance window), evaluated on the burn rates the controller computed
this tick, and held back by the rules' low-traffic guard pair by pair (the TTFT requests over each pair's short
window, :func:`controller.slo.enough_requests`, from Prometheus), so the page says "burning" when the generated
alert rules would; a pair whose rates burn but whose guard holds it back is shown "held" (:attr:`PairState.held`).
Compliance over the window is the good ratio the error budget left was computed from:
``remaining = 1 - (1 - ratio) / (1 - target)``, so ``ratio = 1 - (1 - remaining)(1 - target)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

from controller.api.schemas import PolicyStatus
from controller.policy import Policy
from controller.slo import (
    MIN_ALERT_REQUESTS,
    BurnRateWindow,
    Severity,
    enough_requests,
    is_burning,
    standard_burn_rate_windows,
)

__all__ = ["SLOS", "Level", "PairState", "Verdict", "chip_css", "compliance", "pair_states", "verdict", "worst_pair"]

SLOS = ("ttft", "itl")


class Level(IntEnum):
    """Most urgent first (the overview sorts by it)."""

    PAGE = 0
    TICKET = 1
    BLIND = 2
    BUDGET_SPENT = 3
    NO_DATA = 4
    OK = 5


_TEXT = {
    Level.PAGE: "paging",
    Level.TICKET: "ticket",
    Level.BLIND: "stale",
    Level.BUDGET_SPENT: "budget spent",
    Level.NO_DATA: "no data yet",
    Level.OK: "ok",
}


@dataclass(frozen=True, slots=True)
class PairState:
    """One multiwindow alert of one SLO: its windows, threshold and the burn rates now."""

    slo: str
    window: BurnRateWindow
    long_rate: float | None
    short_rate: float | None
    quiet: bool = False
    """Too few requests for the generated alert to fire (its low-traffic guard), whatever the rates."""

    @property
    def severity(self) -> Severity:
        return self.window.severity

    @property
    def firing(self) -> bool:
        return self.burning and not self.quiet

    @property
    def burning(self) -> bool:
        """Both rates over the threshold, the guard aside."""
        if self.long_rate is None or self.short_rate is None:
            return False
        return is_burning(self.long_rate, self.short_rate, self.window.burn_rate)

    @property
    def held(self) -> bool:
        """Burning, and held back by the low-traffic guard: the generated alert does not fire."""
        return self.burning and self.quiet

    @property
    def held_text(self) -> str:
        return f"held: fewer than {MIN_ALERT_REQUESTS} requests in {self.window.short_window}"

    @property
    def pressure(self) -> float | None:
        """How close to firing: the lesser of the two rates over the threshold (above 1: firing)."""
        if self.long_rate is None or self.short_rate is None:
            return None
        return min(self.long_rate, self.short_rate) / self.window.burn_rate


@dataclass(frozen=True, slots=True)
class Verdict:
    level: Level
    why: str
    """One line: which SLO and pair, or what is missing."""

    @property
    def text(self) -> str:
        return _TEXT[self.level]

    @property
    def css(self) -> str:
        return self.level.name.lower().replace("_", "-")


def compliance(status: PolicyStatus, policy: Policy, slo: str) -> float | None:
    """The good ratio over the compliance window (None: no data over it yet)."""
    remaining = status.error_budget_remaining.get(slo)
    if remaining is None:
        return None
    target: float = getattr(policy.objectives, slo).target
    return 1.0 - (1.0 - remaining) * (1.0 - target)


def pair_states(
    status: PolicyStatus, policy: Policy, request_rates: Mapping[str, float] | None = None
) -> list[PairState]:
    """Each SLO's alert pairs; a pair whose short window saw fewer requests than the alerts' guard does not
    fire, as the generated rule does not.

    ``request_rates``: TTFT requests per second by short window (what the rules' guard reads,
    :func:`controller.api.page.prom.alert_request_rates`).  For a window it lacks (no Prometheus, or its
    query failed) the guard falls back to the request rate the controller last saw, over the last minute.
    """
    windows = standard_burn_rate_windows(policy.window_s)
    seen = status.seen.get("request_rate_rps")
    fallback = float(seen) if isinstance(seen, int | float) else None
    requests = {w.short_window_s: (request_rates or {}).get(w.short_window, fallback) for w in windows}
    quiet = {short_s: rate is not None and not enough_requests(rate, short_s) for short_s, rate in requests.items()}
    out = []
    for slo in SLOS:
        rates = status.burn_rates.get(slo, {})
        for w in windows:
            out.append(PairState(slo, w, rates.get(w.long_window), rates.get(w.short_window), quiet[w.short_window_s]))
    return out


def chip_css(pair: PairState) -> str:
    """A pair's chip: red firing, grey dashed held back by the guard, amber past half its threshold."""
    if pair.firing or pair.held:
        return "chip firing" if pair.firing else "chip held"
    return "chip warm" if (pair.pressure or 0.0) >= 0.5 else "chip"


def worst_pair(pairs: list[PairState]) -> PairState | None:
    """The pair to show first: a firing page pair, else a firing ticket pair (each in window order, as
    :func:`verdict` names them), else the one closest to firing."""
    for severity in ("page", "ticket"):
        firing = [p for p in pairs if p.firing and p.severity == severity]
        if firing:
            return firing[0]
    rated = [p for p in pairs if p.pressure is not None]
    return max(rated, key=lambda p: p.pressure or 0.0) if rated else None


def verdict(status: PolicyStatus, policy: Policy, pairs: list[PairState]) -> Verdict:
    """The most urgent thing about a policy."""
    for severity, level in (("page", Level.PAGE), ("ticket", Level.TICKET)):
        firing = [p for p in pairs if p.firing and p.severity == severity]
        if firing:
            p = firing[0]
            w = p.window
            old = "; as last seen, the data is stale" if status.stale else ""
            return Verdict(level, f"{p.slo.upper()} burning {p.long_rate:.1f}x over {w.long_window} and "
                                  f"{p.short_rate:.1f}x over {w.short_window} (alert at {w.burn_rate:g}x{old})")
    has_sli = (any(v is not None for v in status.sli.values())
               or any(v is not None for v in status.error_budget_remaining.values())
               or any(rates for rates in status.burn_rates.values()))  # fmt: skip
    if status.observed_at is None and not has_sli:
        return Verdict(Level.NO_DATA, "no observation yet: the controller has not evaluated this policy")
    if status.stale or status.errors:
        first = status.errors[0] if status.errors else "the last observation is too old"
        return Verdict(Level.BLIND, f"SLI source: {first}")
    if not has_sli:  # observed, but nothing served in the SLI window: nothing to judge, which is not "ok"
        return Verdict(Level.NO_DATA, "no requests in the SLI window yet: nothing to judge")
    left = [(slo, status.error_budget_remaining.get(slo)) for slo in SLOS]
    spent = [slo.upper() for slo, remaining in left if remaining is not None and remaining <= 0.0]
    # A pair held back by the guard is named: its chip burns, and "ok" alone would leave that unexplained.
    held = "".join(f"; {p.slo.upper()} {p.window.long_window}/{p.window.short_window} burning "
                   f"{p.long_rate:.1f}x/{p.short_rate:.1f}x, {p.held_text}" for p in pairs if p.held)
    if spent:
        return Verdict(Level.BUDGET_SPENT, f"{', '.join(spent)} error budget spent over {policy.window}{held}")
    return Verdict(Level.OK, f"within every objective{held}")
