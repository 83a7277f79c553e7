"""Planner figures of a placement: the balance lower bound, moves between placements, rank relabelling.

These recompute everything from ``phy2log`` and the load alone, so tests can
check the planner's own bookkeeping against them.  Per-rank load and its
imbalance are :mod:`contracts.imbalance`'s.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def max_over_mean_lower_bound(load: FloatArray, counts: IntArray, num_ranks: int) -> FloatArray:
    """Per layer, a max/mean that no placement with ``counts.sum()`` slots can beat.

    ``counts`` must come from the greedy replication, which minimizes the
    heaviest replica ``m``.  The busiest rank carries at least the mean, and at
    least ``m`` plus ``k - 1`` other replicas: with no redundancy those are the
    ``k - 1`` lightest other experts; with redundancy each weighs at least the
    lightest expert split as far as the spare slots allow.
    """
    layers, num_experts = load.shape
    num_slots = int(counts[0].sum()) if layers else num_experts
    k = num_slots // num_ranks
    mean = load.sum(axis=1) / num_ranks
    heaviest = (load / counts).max(axis=1)
    if num_slots == num_experts:
        sorted_load = np.sort(load, axis=1)
        # The k-1 lightest experts other than the heaviest one (which is the last after sorting).
        others = sorted_load[:, : max(k - 1, 0)].sum(axis=1) if k - 1 < num_experts else 0.0
        busiest = heaviest + others
    else:
        busiest = heaviest + (k - 1) * load.min(axis=1) / (num_slots - num_experts + 1)
    bound = np.maximum(mean, busiest)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, bound / np.where(mean > 0, mean, 1.0), 1.0)


def _rank_expert_counts(phy2log: IntArray, num_ranks: int, num_experts: int) -> IntArray:
    """(layers, ranks, experts) replicas of each expert on each rank."""
    layers, num_slots = phy2log.shape
    rank_ids = np.arange(num_slots) // (num_slots // num_ranks)
    flat = (np.arange(layers)[:, None] * num_ranks + rank_ids[None, :]) * num_experts + phy2log
    counts = np.bincount(flat.ravel(), minlength=layers * num_ranks * num_experts)
    return counts.reshape(layers, num_ranks, num_experts).astype(np.int64)


def rank_moves(previous: IntArray, new: IntArray, num_ranks: int) -> IntArray:
    """Per layer, how many replicas each plan must copy in: (rank, expert) pairs new to a rank.

    Slot order within a rank is free (a local copy), so this is the multiset
    difference per rank, summed over ranks.
    """
    num_experts = int(max(previous.max(initial=0), new.max(initial=0))) + 1
    before = _rank_expert_counts(previous, num_ranks, num_experts)
    after = _rank_expert_counts(new, num_ranks, num_experts)
    moves: IntArray = np.maximum(after - before, 0).sum(axis=(1, 2))
    return moves


def relabel_ranks(
    previous: IntArray, new: IntArray, num_ranks: int
) -> tuple[IntArray, IntArray]:
    """Permute whole ranks of ``new`` to keep most replicas where ``previous`` has them.

    A plan's rank numbering is arbitrary; renumbering it to overlap the previous
    placement most (an assignment problem per layer) costs nothing in balance and
    saves weight transfers.  Slots are then aligned with :func:`align_slots`.
    Returns ``(phy2log, source_rank)``: ``source_rank[layer, r]`` is the rank of
    ``new`` that now sits at rank ``r``.
    """
    source = matching_ranks(previous, new, num_ranks)
    return align_slots(previous, permute_ranks(new, source), num_ranks), source


def matching_ranks(previous: IntArray, new: IntArray, num_ranks: int) -> IntArray:
    """``source[layer, r]``: the rank of ``new`` (``num_ranks`` equal blocks of slots) that overlaps rank ``r`` of
    ``previous`` most, the ranks matched one to one per layer (an assignment problem)."""
    layers = new.shape[0]
    num_experts = int(max(previous.max(initial=0), new.max(initial=0))) + 1
    before = _rank_expert_counts(previous, num_ranks, num_experts)
    after = _rank_expert_counts(new, num_ranks, num_experts)
    # overlap[l, i, j] = sum_e min(after[l, i, e], before[l, j, e]) = sum_t [after >= t] . [before >= t]
    overlap = np.zeros((layers, num_ranks, num_ranks))
    for t in range(1, int(min(after.max(initial=0), before.max(initial=0))) + 1):
        # A contiguous right operand keeps numpy's matmul on BLAS (a transposed view is ~15x slower).
        overlap += np.matmul((after >= t).astype(np.float64),
                             np.ascontiguousarray((before >= t).astype(np.float64).transpose(0, 2, 1)))
    source = np.empty((layers, num_ranks), dtype=np.int64)
    for layer in range(layers):
        new_ranks, old_ranks = linear_sum_assignment(overlap[layer], maximize=True)
        source[layer, old_ranks] = new_ranks
    return source


def permute_ranks(new: IntArray, source: IntArray) -> IntArray:
    """``new`` with rank ``source[layer, r]``'s block of slots moved to rank ``r``, slot order kept."""
    layers, num_slots = new.shape
    num_ranks = source.shape[1]
    blocks = np.take_along_axis(new.reshape(layers, num_ranks, num_slots // num_ranks), source[:, :, None], axis=1)
    out: IntArray = blocks.reshape(layers, num_slots)
    return out


def align_slots(previous: IntArray, new: IntArray, num_ranks: int) -> IntArray:
    """Within each rank, put experts that the rank already held back into their old slots."""
    layers, num_slots = new.shape
    k = num_slots // num_ranks
    prev = previous.reshape(layers, num_ranks, k)
    cur = new.reshape(layers, num_ranks, k)
    out = np.full_like(cur, -1)
    used = np.zeros(cur.shape, dtype=bool)
    for slot in range(k):
        match = (cur == prev[:, :, slot : slot + 1]) & ~used  # (layers, ranks, k)
        found = match.any(axis=2)
        pick = np.argmax(match, axis=2)
        layer_ids, rank_ids = np.nonzero(found)
        out[layer_ids, rank_ids, slot] = prev[layer_ids, rank_ids, slot]
        used[layer_ids, rank_ids, pick[layer_ids, rank_ids]] = True
    # Remaining experts fill the remaining slots in their current order.
    free_first = np.argsort(out >= 0, axis=2, kind="stable")
    unused_first = np.argsort(used, axis=2, kind="stable")
    num_free = (out < 0).sum(axis=2, keepdims=True)
    fill = np.take_along_axis(cur, unused_first, axis=2)
    kept = np.take_along_axis(out, free_first, axis=2)
    merged = np.where(np.arange(k) < num_free, fill, kept)
    np.put_along_axis(out, free_first, merged, axis=2)
    return out.reshape(layers, num_slots)


def renumber_plan(base: IntArray, new: IntArray, num_ranks: int, num_nodes: int = 1) -> IntArray:
    """``new`` with whole nodes, then whole ranks inside their node, renumbered to keep most replicas where
    ``base`` has them (renumbering ranks inside each node alone moved experts between nodes for no gain)."""
    per_node = new.shape[1] // num_nodes
    out = permute_ranks(new, matching_ranks(base, new, num_nodes)) if num_nodes > 1 else new.copy()
    new = out.copy()
    for node in range(num_nodes):
        span = slice(node * per_node, (node + 1) * per_node)
        out[:, span] = relabel_ranks(base[:, span], new[:, span], num_ranks // num_nodes)[0]
    return align_slots(base, out, num_ranks)


def slot_moves(previous: IntArray, new: IntArray, num_ranks: int) -> list[dict[str, int]]:
    """Every physical slot whose logical expert changes, as JSON-ready records."""
    layer_ids, slot_ids = np.nonzero(previous != new)
    k = new.shape[1] // num_ranks
    return [
        {
            "layer": int(layer),
            "slot": int(slot),
            "rank": int(slot // k),
            "from_expert": int(previous[layer, slot]),
            "to_expert": int(new[layer, slot]),
        }
        for layer, slot in zip(layer_ids, slot_ids, strict=True)
    ]
