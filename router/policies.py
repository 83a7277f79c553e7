"""Routing policies: pure functions of a request's features and the replicas' states, returning a Choice.

Nothing here does I/O or reads a clock: the proxy and the replay call the
same functions.  Every policy picks among healthy replicas only, and says
why in ``Choice.reason`` (a fixed word per branch, so tests and metrics can
count them):

* :func:`round_robin`: ``next_in_turn``;
* :func:`least_outstanding`: ``fewest_outstanding``;
* :func:`estimated_cost`: ``lowest_predicted_ttft`` or ``avoids_itl_risk``;
* :func:`prefix_affinity`: ``prefix_owner``, ``prefix_owner_full`` (bounded
  load sent it further round the ring) or ``no_prefix`` (too short a prompt:
  least outstanding);
* :func:`admission`: ``all_over_budget`` (reject) or ``no_healthy_replica``; a request over the
  objective even on an idle replica is let through (:func:`over_objective_alone`).

The cost model (:func:`predict`): a new request's TTFT on a replica is the
prefill work queued ahead of it plus its own (less the leading tokens the
replica likely holds in its prefix cache), at the replica's prefill rate,
stretched by the running batch (decode steps share each iteration) and by KV
pressure above a soft limit (block waits and preemptions).  ITL grows with the
running batch; a replica whose predicted ITL breaks the objective is avoided
when another within the TTFT objective has none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from router.prefix import walk
from router.types import Choice, CostModel, Prediction, ReplicaState, RequestFeatures

NO_REPLICA = Choice(replica=None, reason="no_healthy_replica")


def predict(state: ReplicaState, features: RequestFeatures, model: CostModel) -> Prediction:
    """Predicted TTFT and ITL of ``features`` on ``state``'s replica."""
    batch_factor = 1.0 + state.running / model.max_batch
    over = max(0.0, state.kv_usage - model.kv_soft_limit) / max(1e-9, 1.0 - model.kv_soft_limit)
    kv_factor = 1.0 + model.kv_full_penalty * min(1.0, over)
    work = state.pending_prefill_tokens + prefill_work(features, state.cached_prompt_tokens, model)
    ttft_s = work / max(state.prefill_tokens_per_s, 1e-9) * batch_factor * kv_factor
    per_seq_s = model.itl_per_seq_s if model.itl_per_seq_s is not None else model.decode_step_s / model.max_batch
    itl_s = model.decode_step_s + per_seq_s * (state.running + 1)
    return Prediction(ttft_s=ttft_s, itl_s=itl_s, itl_risk=itl_s > model.itl_objective_s)


def prefill_work(features: RequestFeatures, cached_prompt_tokens: int, model: CostModel) -> float:
    """Prompt tokens' worth of prefill a request costs on a replica holding its first ``cached_prompt_tokens``.

    A cached token costs ``model.cached_token_cost`` of a computed one; the last prompt token is
    always computed (its logits give the first output token).  Each choice after a prompt's first
    finds that prompt cached, all but its last token (the engine keys a prompt's blocks as they are
    scheduled, so its other choices share them; with caching off, ``cached_token_cost`` is near 1).
    """
    cached = min(cached_prompt_tokens, max(features.prompt_tokens - 1, 0))
    first = features.prompt_tokens - cached * (1.0 - model.cached_token_cost)
    leads = max(features.prompt_tokens - features.prompts, 0)  # every prompt but its last token
    further = (features.choices - 1) * (features.prompt_tokens - leads * (1.0 - model.cached_token_cost))
    return first + further


def healthy(replicas: Sequence[ReplicaState]) -> list[ReplicaState]:
    return [r for r in replicas if r.healthy]


def round_robin(turn: int, replicas: Sequence[ReplicaState]) -> Choice:
    """The ``turn``-th healthy replica, cyclically (the caller counts turns)."""
    live = healthy(replicas)
    if not live:
        return NO_REPLICA
    return Choice(replica=live[turn % len(live)].name, reason="next_in_turn")


def least_outstanding(replicas: Sequence[ReplicaState]) -> Choice:
    """Fewest requests in flight from this router; ties: the smaller scraped queue, then the name."""
    live = healthy(replicas)
    if not live:
        return NO_REPLICA
    best = min(live, key=lambda r: (r.outstanding, r.waiting + r.running, r.name))
    return Choice(replica=best.name, reason="fewest_outstanding", detail={r.name: float(r.outstanding) for r in live})


def estimated_cost(features: RequestFeatures, replicas: Sequence[ReplicaState], model: CostModel) -> Choice:
    """The replica predicted to serve the first token soonest, avoiding ITL risk when the TTFT budget allows."""
    live = healthy(replicas)
    if not live:
        return NO_REPLICA
    predictions = {r.name: predict(r, features, model) for r in live}
    objective_s = model.ttft_objective_for(features.prompt_tokens)

    def key(r: ReplicaState) -> tuple[bool, bool, float, int, str]:
        p = predictions[r.name]
        over = p.ttft_s > objective_s  # over the objective anywhere: the lowest TTFT, ITL risk or not
        return (over, p.itl_risk and not over, p.ttft_s, r.outstanding, r.name)

    best = min(live, key=key)
    fastest = min(live, key=lambda r: (predictions[r.name].ttft_s, r.outstanding, r.name))
    reason = "lowest_predicted_ttft" if best.name == fastest.name else "avoids_itl_risk"
    return Choice(
        replica=best.name, reason=reason, predicted_ttft_s=predictions[best.name].ttft_s,
        detail={name: p.ttft_s for name, p in predictions.items()},
    )


def prefix_affinity(
    features: RequestFeatures, replicas: Sequence[ReplicaState], *, affinity_blocks: int = 4, load_factor: float = 1.25
) -> Choice:
    """Consistent hashing with bounded load over the leading ``affinity_blocks`` prompt blocks.

    The key is the chained hash of the first ``affinity_blocks`` blocks (fewer when the
    prompt is shorter), so prompts sharing that lead meet on one replica.  A replica
    whose outstanding requests reach ``ceil(load_factor x mean)`` (the mean counting
    this request) is passed over for the next one clockwise.
    """
    live = healthy(replicas)
    if not live:
        return NO_REPLICA
    if not features.prefix_blocks:
        fallback = least_outstanding(live)
        return Choice(replica=fallback.replica, reason="no_prefix", detail=fallback.detail)
    key = features.prefix_blocks[min(len(features.prefix_blocks), affinity_blocks) - 1]
    by_name = {r.name: r for r in live}
    cap = math.ceil(load_factor * (sum(r.outstanding for r in live) + 1) / len(live))
    order = walk(key, tuple(by_name))
    for position, name in enumerate(order):
        if by_name[name].outstanding < cap:
            return Choice(replica=name, reason="prefix_owner" if position == 0 else "prefix_owner_full",
                          detail={"cap": float(cap), "position": float(position)})  # fmt: skip
    return Choice(replica=order[0], reason="prefix_owner", detail={"cap": float(cap)})


def admission(features: RequestFeatures, replicas: Sequence[ReplicaState], model: CostModel) -> Choice | None:
    """None when some healthy replica is predicted within the TTFT objective; else a refusal with Retry-After.

    ``retry_after_s``: the best replica's predicted excess over the objective (its
    backlog has to drain that long before this request would fit).  A request predicted
    over the objective even on an idle replica is never refused: no wait brings it within
    (a long prompt, or replicas slowed down), so holding it only adds the wait to its TTFT.
    """
    live = healthy(replicas)
    if not live:
        return NO_REPLICA
    predictions = {r.name: predict(r, features, model).ttft_s for r in live}
    best = min(predictions.values())
    objective_s = model.ttft_objective_for(features.prompt_tokens)
    if best <= objective_s or over_objective_alone(features, live, model):
        return None
    return Choice(replica=None, reason="all_over_budget", predicted_ttft_s=best,
                  retry_after_s=best - objective_s, detail=predictions)  # fmt: skip


def over_objective_alone(features: RequestFeatures, replicas: Sequence[ReplicaState], model: CostModel) -> bool:
    """The request is predicted over the TTFT objective on every replica even with nothing ahead of it."""
    idle = (replace(r, waiting=0, running=0, kv_usage=0.0, pending_prefill_tokens=0) for r in replicas)
    objective_s = model.ttft_objective_for(features.prompt_tokens)
    return all(predict(r, features, model).ttft_s > objective_s for r in idle)


Policy = Callable[[RequestFeatures, Sequence[ReplicaState], int], Choice]
"""A policy as the proxy calls it: features, states, the turn counter."""


def policy_named(name: str, model: CostModel, *, affinity_blocks: int = 4, load_factor: float = 1.25) -> Policy:
    """``round-robin``, ``least-loaded``, ``cost`` or ``prefix`` as a :data:`Policy` (ValueError otherwise)."""
    policies: dict[str, Policy] = {
        "round-robin": lambda _f, replicas, turn: round_robin(turn, replicas),
        "least-loaded": lambda _f, replicas, _t: least_outstanding(replicas),
        "cost": lambda features, replicas, _t: estimated_cost(features, replicas, model),
        "prefix": lambda features, replicas, _t: prefix_affinity(
            features, replicas, affinity_blocks=affinity_blocks, load_factor=load_factor),
    }  # fmt: skip
    if name not in policies:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
    return policies[name]


POLICY_NAMES = ("cost", "prefix", "least-loaded", "round-robin")

__all__ = [
    "NO_REPLICA",
    "POLICY_NAMES",
    "Policy",
    "admission",
    "estimated_cost",
    "healthy",
    "least_outstanding",
    "policy_named",
    "predict",
    "prefill_work",
    "prefix_affinity",
    "round_robin",
]
