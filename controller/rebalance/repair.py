"""Re-planning from a previous placement: keep what still works, fix only what is needed.

Each replica kept in its slot is a weight transfer saved.  Per row:

1. replica counts: every expert gets at least ``ceil(load / (slack * m))``
   replicas, where ``m`` is the heaviest replica of a from-scratch plan;
   spare slots go first to experts that already had more replicas;
2. surplus replicas leave the busiest ranks; freed slots (and slots holding
   experts that no longer belong to this row) take the new replicas,
   heaviest first onto the least-loaded rank;
3. :func:`~controller.rebalance.packing.refine_swaps` only until the busiest
   rank is within the target (a from-scratch plan's peak plus a tolerance),
   preferring swaps that move few replicas away from their old rank.

The caller falls back to a from-scratch plan for rows that miss the target.
"""

from __future__ import annotations

import numpy as np

from controller.rebalance.packing import (
    FloatArray,
    IntArray,
    Packing,
    packing_from_slots,
    refine_swaps,
    spread_copies,
)


def repair_counts(
    load: FloatArray, previous: IntArray, greedy_counts: IntArray, slack: float = 1.0, *, max_count: int | None = None
) -> IntArray:
    """Replica counts close to ``previous`` whose heaviest replica is at most ``slack`` x the greedy's.

    No expert gets more than ``max_count`` replicas (as :func:`~controller.rebalance.packing.replica_counts`),
    however many it had before."""
    rows, num_experts = load.shape
    num_slots = previous.shape[1]
    cap = (load / greedy_counts).max(axis=1, keepdims=True) * slack
    with np.errstate(divide="ignore", invalid="ignore"):
        required = np.where(cap > 0, np.ceil(load / np.where(cap > 0, cap, 1.0) - 1e-9), 1.0)
    counts = np.maximum(required.astype(np.int64), 1)
    if max_count is not None:
        counts = np.minimum(counts, max_count)
    prev_counts = np.zeros((rows, num_experts), dtype=np.int64)
    valid = previous >= 0
    row_ids = np.repeat(np.arange(rows), num_slots).reshape(rows, num_slots)
    np.add.at(prev_counts, (row_ids[valid], previous[valid]), 1)
    spare = num_slots - counts.sum(axis=1)
    all_rows = np.arange(rows)
    # Experts that used to have more replicas get them back first (no transfer needed), hottest first.
    bonus = np.max(load, axis=1, keepdims=True) * 2.0 + 1.0
    while (spare > 0).any():
        live = all_rows[spare > 0]
        per_replica = load[live] / counts[live]
        score = per_replica + np.where(counts[live] < prev_counts[live], bonus[live], 0.0)
        if max_count is not None:
            score = np.where(counts[live] < max_count, score, -np.inf)
        pick = np.argmax(score, axis=1)
        counts[live, pick] += 1
        spare[live] -= 1
    return counts


def repair_rows(
    load: FloatArray, previous: IntArray, counts: IntArray, num_ranks: int, target: FloatArray
) -> Packing:
    """Start from ``previous`` (row-local expert ids, -1 = slot to refill) and refine towards ``target``."""
    rows, num_slots = previous.shape
    num_experts = load.shape[1]
    k = num_slots // num_ranks
    per_replica = load / counts
    experts = previous.copy()
    for row in range(rows):
        experts[row] = _refill_row(experts[row], counts[row], per_replica[row], num_ranks, k)
    weights = np.take_along_axis(per_replica, experts, axis=1)
    packing = packing_from_slots(experts, weights, num_ranks, num_experts)
    spread_copies(packing)  # a refill can only fill the free slots there are, even on a rank holding the expert
    # A replica's home is the rank it sat on before; refilled slots hold replicas copied anyway.
    home = np.where(experts == previous, np.arange(num_slots) // k, -1)
    refine_swaps(packing, target=target, home=home)
    return packing


def _refill_row(slots: IntArray, counts: IntArray, per_replica: FloatArray, num_ranks: int, k: int) -> IntArray:
    """Drop surplus replicas from the busiest ranks, then fill free slots heaviest-first, least-loaded rank."""
    out = slots.copy()
    rank_of = np.arange(out.size) // k
    valid = out >= 0
    slot_weight = np.where(valid, per_replica[np.where(valid, out, 0)], 0.0)
    rank_load = np.bincount(rank_of, weights=slot_weight, minlength=num_ranks)
    held = np.bincount(out[valid], minlength=counts.size)
    surplus = np.flatnonzero(held > counts)
    for expert in surplus:
        where = np.flatnonzero(out == expert)
        # Busiest ranks first; ties by slot id for determinism.
        order = np.lexsort((where, -rank_load[rank_of[where]]))
        for slot in where[order][: held[expert] - counts[expert]]:
            out[slot] = -1
            rank_load[rank_of[slot]] -= per_replica[expert]
    held = np.bincount(out[out >= 0], minlength=counts.size)
    missing = counts - held
    new_experts = np.repeat(np.arange(counts.size), np.maximum(missing, 0))
    if new_experts.size == 0:
        return out
    new_experts = new_experts[np.argsort(-per_replica[new_experts], kind="stable")]
    free_per_rank = np.bincount(rank_of[out < 0], minlength=num_ranks)
    copies = np.zeros((num_ranks, counts.size), dtype=np.int64)
    np.add.at(copies, (rank_of[out >= 0], out[out >= 0]), 1)
    copy_penalty = 2.0 * float(per_replica @ counts) + 1.0  # above any rank load: fewest copies first
    for expert in new_experts:
        score = rank_load + np.where(free_per_rank > 0, 0.0, np.inf) + copies[:, expert] * copy_penalty
        rank = int(np.argmin(score))
        slot = rank * k + int(np.flatnonzero(out[rank * k : (rank + 1) * k] < 0)[0])
        out[slot] = expert
        free_per_rank[rank] -= 1
        rank_load[rank] += per_replica[expert]
        copies[rank, expert] += 1
    return out
