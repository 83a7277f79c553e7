"""Demand at the entry router: the one signal that reaches a fleet at zero replicas.

A policy that names its entry ``router`` gets the router's queue in its observations
(``router_queued``: requests held at admission).  The advisors count it as waiting
requests next to the engines' queue; this module holds the two rules about zero,
which the decision core applies to the advisors' need (pure functions, no I/O):

- **scale from zero**: requests wait at the router and the advisors need no
  replica (a fleet at zero has no engines, so they see nothing else): need one
  (``router_queue``).  Once it runs, the queue rules size the rest;
- **down to zero** only when the policy allows it (``min_replicas: 0``) and the
  entry is idle: the router was read, holds nothing and refuses nothing, and the engines report
  no queue, no running request and no arrivals (``router_idle``).  Otherwise a
  need of zero is raised to one, because nothing could wake the fleet again.
  The core's scale-down guardrails still apply: the need must have been zero for
  the whole ``scale_down_cooldown_s`` (stabilization) and the last change must be
  that long ago, and a source reporting errors (an unreadable router) holds it.

In its reject mode the router answers 429 when every replica is predicted over the
TTFT objective (``router_refused_rps``).  Those requests never reach an engine, so
the engines' rates leave them out, and a forecast of served load alone would size
the fleet for what it already serves.  :func:`offered_load` adds them back: the
load the forecaster learns, the capacity model sizes and the scale checks hold
still is what clients asked for.  A client that retries after ``Retry-After`` is
counted once per try: in overload the offered load errs high, not low.
"""

from __future__ import annotations

import math
from dataclasses import replace

from controller.capacity import Load
from controller.policy import Policy
from controller.types import PolicyObservation, Reason

__all__ = [
    "admitted_load", "admitted_rate", "entry_floor", "entry_idle", "offered_load", "router_refused", "router_waiting",
    "served_load", "waiting",
]


def router_waiting(obs: PolicyObservation) -> float:
    """Requests the router holds (0 when unknown)."""
    return obs.router_queued if obs.router_queued is not None and obs.router_queued > 0 else 0.0


def waiting(obs: PolicyObservation) -> float:
    """Requests waiting for the fleet: the engines' queue and the entry router's."""
    return (obs.queue_depth or 0.0) + router_waiting(obs)


def router_refused(obs: PolicyObservation) -> float:
    """Requests per second the router refused (0 when unknown)."""
    refused = obs.router_refused_rps
    return refused if refused is not None and refused > 0 else 0.0


def served_load(obs: PolicyObservation) -> Load | None:
    """What the engines served: their request and token rates (None without them)."""
    values = (obs.request_rate_rps, obs.prompt_tokens_per_s, obs.output_tokens_per_s)
    if any(v is None or not math.isfinite(v) or v < 0 for v in values):
        return None
    rate, prompt, output = (float(v) for v in values if v is not None)
    return Load(request_rate_rps=rate, prompt_tokens_per_s=prompt, output_tokens_per_s=output)


def admitted_rate(served_rps: float, prompt_tokens_per_s: float, mean_prompt_tokens: float | None) -> float:
    """The requests admitted per second: with none counted (requests count as they finish, prompt tokens as
    they are admitted, so none has finished yet: a ramp from idle, long answers), the prompt tokens over the
    mean prompt length known; otherwise ``served_rps`` as it is."""
    if served_rps > 0 or prompt_tokens_per_s <= 0 or not mean_prompt_tokens:
        return served_rps
    return prompt_tokens_per_s / mean_prompt_tokens


def admitted_load(served: Load, mean_prompt_tokens: float | None) -> Load:
    """``served`` as the requests admitted (:func:`admitted_rate`)."""
    rate = admitted_rate(served.request_rate_rps, served.prompt_tokens_per_s, mean_prompt_tokens)
    return served if rate == served.request_rate_rps else replace(served, request_rate_rps=rate)


def offered_load(obs: PolicyObservation) -> Load | None:
    """What clients asked for: the engines' rates plus the requests the router refused (None without rates).

    A refused request is taken to carry the served ones' mean prompt and output tokens (the router
    refuses by predicted wait, not by length).  With no request counted served (requests count as
    they finish, tokens as they are processed), the refused ones' tokens are unknown: the rate is
    the refused one and the tokens are the engines'.
    """
    served = served_load(obs)
    refused = router_refused(obs)
    if served is None or refused <= 0:
        return served
    if served.request_rate_rps <= 0:
        return Load(request_rate_rps=refused, prompt_tokens_per_s=served.prompt_tokens_per_s,
                    output_tokens_per_s=served.output_tokens_per_s)  # fmt: skip
    return served.scaled(1.0 + refused / served.request_rate_rps)


def entry_idle(policy: Policy, obs: PolicyObservation) -> bool:
    """Whether the fleet may go to zero now: allowed, the router read and empty, the engines known idle."""
    return (
        policy.scaling.min_replicas == 0
        and policy.router is not None
        and obs.router_queued == 0
        and obs.queue_depth == 0
        and obs.running_requests == 0
        and obs.request_rate_rps == 0
        and obs.router_refused_rps == 0  # unknown (not read yet) is not idle
    )


def entry_floor(
    policy: Policy, obs: PolicyObservation, current: int, need: int, why: tuple[str, ...]
) -> tuple[int, tuple[str, ...], str | None]:
    """The need and its reasons after the rules about zero, and a note when a rule changed them."""
    if need >= 1:
        return need, why, None
    queued = router_waiting(obs)
    if queued > 0:
        return 1, (*why, Reason.ROUTER_QUEUE), f"the entry router holds {queued:g} requests: at least 1 replica"
    if current < 1:
        return need, why, None  # already at zero, nothing waiting: stay
    if entry_idle(policy, obs):
        return 0, (*why, Reason.ROUTER_IDLE), "the entry router and the engines are idle: zero replicas allowed"
    return 1, why, None  # without an idle router in view, nothing could wake a fleet at zero
