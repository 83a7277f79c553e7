"""Which EP rank serves a logical expert's tokens: the rank map of the imbalance gauges.

Imbalance is measured per EP rank, so the plugin turns per-expert counts
into per-rank loads with an (experts x ranks) weight matrix:

* vLLM's EP without EPLB: each rank holds a block of experts.  ``linear``
  (vLLM's default ``expert_placement_strategy``) gives rank ``r`` the
  experts ``[r*base + min(r, rem), ...)`` with the ``rem = E % ranks``
  extra experts on the first ranks; ``round_robin`` gives expert ``e`` to
  rank ``e % ranks``.
* EPLB: the logical-to-physical map lists each expert's replicas; an
  expert's tokens are split evenly among them (vLLM hashes tokens to
  replicas), and physical slot ``s`` lives on rank ``s // slots_per_rank``.
* EP off: a virtual EP of ``MOESLO_VLLM_EP_RANKS`` ranks over contiguous
  expert groups (the layout EP would use), so CV answers "how imbalanced
  would this load be on that many ranks".

numpy only.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from contracts.errors import ValidationError

FloatArray = npt.NDArray[np.float64]


def contiguous_rank_weights(num_experts: int, num_ranks: int, strategy: str = "linear") -> FloatArray:
    """(experts, ranks) 0/1 matrix of vLLM's static EP layout."""
    problems = []
    if num_experts < 1:
        problems.append(f"num_experts must be >= 1, got {num_experts}")
    if num_ranks < 1:
        problems.append(f"num_ranks must be >= 1, got {num_ranks}")
    if strategy not in ("linear", "round_robin"):
        problems.append(f"unknown expert placement strategy {strategy!r} (linear, round_robin)")
    if problems:
        raise ValidationError(problems)
    experts = np.arange(num_experts)
    if strategy == "round_robin":
        ranks = experts % num_ranks
    else:
        base, rem = divmod(num_experts, num_ranks)
        # The first `rem` ranks hold base + 1 experts, the others base.
        boundary = rem * (base + 1)
        ranks = np.where(
            experts < boundary,
            experts // (base + 1),
            rem + (experts - boundary) // max(base, 1),
        )
    weights = np.zeros((num_experts, num_ranks), dtype=np.float64)
    weights[experts, np.minimum(ranks, num_ranks - 1)] = 1.0
    return weights


def eplb_rank_weights(logical_to_physical: npt.ArrayLike, num_physical: int, num_ranks: int) -> FloatArray:
    """(experts, ranks) matrix from EPLB's map (experts x max replicas, -1 = no replica)."""
    l2p = np.asarray(logical_to_physical, dtype=np.int64)
    problems = []
    if l2p.ndim != 2:
        problems.append(f"logical_to_physical must be 2-D, got shape {l2p.shape}")
    if num_ranks < 1 or num_physical % max(num_ranks, 1) != 0:
        problems.append(f"{num_physical} physical slots do not split over {num_ranks} ranks")
    if l2p.ndim == 2 and l2p.size and int(l2p.max()) >= num_physical:
        problems.append(f"physical slot {int(l2p.max())} >= num_physical {num_physical}")
    if problems:
        raise ValidationError(problems)
    slots_per_rank = num_physical // num_ranks
    # One scatter over every live replica (no loop over experts: this runs at each flush in the worker).
    live = l2p >= 0
    share = np.broadcast_to(1.0 / np.maximum(live.sum(axis=1, keepdims=True), 1), l2p.shape)
    expert_of = np.broadcast_to(np.arange(l2p.shape[0])[:, None], l2p.shape)
    cell = expert_of[live] * num_ranks + l2p[live] // slots_per_rank
    weights = np.bincount(cell, weights=share[live], minlength=l2p.shape[0] * num_ranks)
    return np.asarray(weights.reshape(l2p.shape[0], num_ranks), dtype=np.float64)


def placement_rank_weights(phy2log: npt.ArrayLike, num_experts: int, num_ranks: int) -> FloatArray:
    """(layers, experts, ranks) matrix of a physical-to-logical map (layers x slots), as
    :func:`eplb_rank_weights` reads EPLB's map of each layer."""
    p2l = np.asarray(phy2log, dtype=np.int64)
    layers, slots = p2l.shape
    rank_of = np.broadcast_to(np.arange(slots) // (slots // num_ranks), p2l.shape)
    counts = np.zeros((layers, num_experts, num_ranks), dtype=np.float64)
    np.add.at(counts, (np.broadcast_to(np.arange(layers)[:, None], p2l.shape), p2l, rank_of), 1.0)
    replicas = counts.sum(axis=2, keepdims=True)
    out: FloatArray = np.divide(counts, replicas, out=np.zeros_like(counts), where=replicas > 0)
    return out


def rank_loads(expert_tokens: npt.ArrayLike, weights: FloatArray) -> FloatArray:
    """(layers, ranks) load from (layers, experts) counts and an (experts, ranks) or
    (layers, experts, ranks) weight matrix."""
    counts = np.asarray(expert_tokens, dtype=np.float64)
    if weights.ndim == 3:
        out: FloatArray = np.einsum("le,ler->lr", counts, weights)
        return out
    return np.asarray(counts @ weights, dtype=np.float64)
