"""The bounds a policy's ``scaling`` puts on one decision (pure): the replica range and how far one scale-down goes.

Used by the decision core (:mod:`controller.core`), which applies them in its order of guardrails.
"""

from __future__ import annotations

import math

from controller.policy import Scaling
from controller.types import Reason

__all__ = ["bound_first", "clamp_to_bounds", "scale_down_floor"]


def clamp_to_bounds(need: int, current: int, scaling: Scaling) -> tuple[int, list[str]]:
    """``need`` within [min_replicas, max_replicas], and the guards that say where the fleet stands."""
    guards: list[str] = []
    desired = need
    if desired > scaling.max_replicas:
        desired = scaling.max_replicas
        guards.append(Reason.AT_MAX)
    elif desired < scaling.min_replicas:
        desired = scaling.min_replicas
        guards.append(Reason.AT_MIN)
    if current < scaling.min_replicas and desired >= current:
        guards.append(Reason.BELOW_MIN)
    elif current > scaling.max_replicas and desired <= current:
        guards.append(Reason.ABOVE_MAX)
    return desired, guards


def bound_first(reasons: tuple[str, ...], need: int, current: int, desired: int) -> tuple[str, ...]:
    """``reasons`` (the action first) with the bound that made the change next, when the advisors wanted none.

    A decision is logged and counted by its second reason: the scale-up from zero that the advisors' "no change"
    (``within_slo``, ``insufficient_data``) never asked for is ``below_min``'s, as is the way down to the maximum.
    """
    if desired == current or (need - current) * (desired - current) > 0:
        return reasons
    moved = tuple(r for r in reasons if r in (Reason.BELOW_MIN, Reason.ABOVE_MAX))
    return (reasons[0], *moved, *(r for r in reasons[1:] if r not in moved))


def scale_down_floor(current: int, desired: int, scaling: Scaling) -> int | None:
    """The fewest replicas one scale-down from ``current`` may leave, when ``desired`` is below it; else None.

    As Knative's ``max-scale-down-rate``: the capacity model says what a smaller fleet serves, but a fleet has
    only been seen to serve at sizes near the current one, and a scale-down that was wrong is undone only a
    start-up time later.  Going to zero is the entry's rule (an idle router), not the model's, and is not held;
    nor is a fleet above ``max_replicas`` held above it (the bound is the policy's own rule).  One scale-down
    may always remove one replica: below a rate of 2, ``ceil(current / rate)`` is ``current`` itself for a small
    fleet, which would then never shrink.
    """
    if desired <= 0:
        return None
    floor = min(math.ceil(current / scaling.max_scale_down_rate), current - 1, scaling.max_replicas)
    return floor if desired < floor else None
