"""The flat solver: replicate experts, then pack replicas into ranks of exactly k slots.

Every function works on a batch of independent *rows* (one row = one layer in
global mode, one (layer, node) pair in hierarchical mode) and is vectorized
across rows with numpy, so 58 layers cost about as much as one in Python
overhead.  Three steps:

1. :func:`replica_counts` -- give each extra slot to the expert with the largest
   load per replica (the greedy is optimal for the busiest replica), at most one
   replica per rank (:func:`max_replicas`).
2. :func:`lpt_pack` -- longest processing time first: each replica, heaviest
   first, goes to the least-loaded rank that still has a free slot and does not
   hold that expert yet.
3. :func:`refine_swaps` -- local search: swap one replica of the busiest rank
   with a lighter one elsewhere while that lowers the pair's maximum, until no
   swap helps (or a per-row target is met, which keeps re-plans cheap in moves).

Replicas of one expert split its load evenly, as the engine does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_REL_EPS = 1e-12
"""Gains below this fraction of the rank load are rounding noise, not improvements."""


def max_replicas(num_ranks: int, num_slots: int, num_experts: int) -> int:
    """The most replicas one expert may get: one per rank, as two copies on one rank carry no more
    load off the others than one does.  Only where a rank has more slots than there are experts
    must some rank hold two copies: then ``ceil(slots per rank / experts)`` per rank."""
    per_rank = num_slots // max(num_ranks, 1)
    return max(num_ranks, 1) * max(1, -(-per_rank // max(num_experts, 1)))


def replica_counts(load: FloatArray, num_slots: int, max_count: int | None = None) -> IntArray:
    """(rows, experts) replica counts summing to ``num_slots`` per row, minimizing max load/replica.

    No expert gets more than ``max_count`` replicas (:func:`max_replicas`; None: no cap), which
    needs ``max_count * experts >= num_slots``.  Ties go to the lower expert id, so the result is
    deterministic.
    """
    rows, num_experts = load.shape
    counts = np.ones((rows, num_experts), dtype=np.int64)
    cap = num_slots if max_count is None else max_count
    # Load per replica, -inf once an expert is at the cap; a step changes one entry per row, so only
    # that entry is recomputed (the same division as recomputing them all).
    per_replica = np.where(counts < cap, load / counts, -np.inf)
    flat_counts, flat_load, flat_ratio = counts.reshape(-1), load.reshape(-1), per_replica.reshape(-1)
    offset = np.arange(rows) * num_experts
    for _ in range(num_slots - num_experts):
        hottest = offset + np.argmax(per_replica, axis=1)
        count = flat_counts[hottest] + 1
        flat_counts[hottest] = count
        flat_ratio[hottest] = np.where(count < cap, flat_load[hottest] / count, -np.inf)
    return counts


def expand_replicas(load: FloatArray, counts: IntArray) -> tuple[IntArray, FloatArray]:
    """Per row: the expert id and load of each replica, heaviest first (ties: lower id first)."""
    rows, _ = load.shape
    num_slots = int(counts[0].sum()) if rows else 0
    experts = np.empty((rows, num_slots), dtype=np.int64)
    for row in range(rows):
        experts[row] = np.repeat(np.arange(counts.shape[1], dtype=np.int64), counts[row])
    weights = np.take_along_axis(load / counts, experts, axis=1)
    order = np.argsort(-weights, axis=1, kind="stable")
    return np.take_along_axis(experts, order, axis=1), np.take_along_axis(weights, order, axis=1)


@dataclass
class Packing:
    """Mutable packing state of a batch of rows; ``bin_items[row, rank, j]`` indexes the replica arrays."""

    experts: IntArray
    """(rows, slots) logical expert (row-local id) of each replica."""
    weights: FloatArray
    """(rows, slots) load each replica carries."""
    item_bin: IntArray
    """(rows, slots) rank each replica sits on."""
    bin_items: IntArray
    """(rows, ranks, slots_per_rank) replica indices on each rank, in slot order."""
    rank_load: FloatArray
    """(rows, ranks) summed replica load per rank."""
    has_expert: npt.NDArray[np.int16]
    """(rows, ranks, experts) how many replicas of each expert a rank holds."""

    def phy2log(self) -> IntArray:
        """(rows, ranks * slots_per_rank) expert id per physical slot."""
        rows, ranks, k = self.bin_items.shape
        flat = self.bin_items.reshape(rows, ranks * k)
        return np.take_along_axis(self.experts, flat, axis=1)


def packing_from_slots(
    experts: IntArray, weights: FloatArray, num_ranks: int, num_experts: int
) -> Packing:
    """Build the packing state where replica i sits in physical slot i (rank i // k)."""
    rows, num_slots = experts.shape
    k = num_slots // num_ranks
    item_bin = np.broadcast_to(np.arange(num_slots, dtype=np.int64) // k, (rows, num_slots)).copy()
    bin_items = np.broadcast_to(
        np.arange(num_slots, dtype=np.int64).reshape(num_ranks, k), (rows, num_ranks, k)
    ).copy()
    rank_load = weights.reshape(rows, num_ranks, k).sum(axis=2)
    has_expert = np.zeros((rows, num_ranks, num_experts), dtype=np.int16)
    row_ids = np.repeat(np.arange(rows), num_slots)
    np.add.at(has_expert, (row_ids, item_bin.ravel(), experts.ravel()), 1)
    return Packing(experts.copy(), weights.copy(), item_bin, bin_items, rank_load, has_expert)


def lpt_pack(experts: IntArray, weights: FloatArray, num_ranks: int, num_experts: int) -> Packing:
    """Pack replicas (given heaviest first) into ranks with exactly ``slots/num_ranks`` slots each."""
    rows, num_slots = experts.shape
    k = num_slots // num_ranks
    row_ids = np.arange(rows)
    rank_load = np.zeros((rows, num_ranks))
    fill = np.zeros((rows, num_ranks), dtype=np.int64)
    has_expert = np.zeros((rows, num_ranks, num_experts), dtype=np.int16)
    item_bin = np.empty((rows, num_slots), dtype=np.int64)
    bin_items = np.empty((rows, num_ranks, k), dtype=np.int64)
    # Penalties order the choice: a full rank never; among the others the fewest copies of the
    # expert first (a finite step above any load, so ties still go to the least-loaded rank).
    copy_penalty = (2.0 * weights.sum(axis=1) + 1.0)[:, None]
    for item in range(num_slots):
        expert = experts[:, item]
        score = rank_load + np.where(fill >= k, np.inf, 0.0)
        score = score + has_expert[row_ids, :, expert] * copy_penalty
        rank = np.argmin(score, axis=1)
        item_bin[:, item] = rank
        bin_items[row_ids, rank, fill[row_ids, rank]] = item
        fill[row_ids, rank] += 1
        rank_load[row_ids, rank] += weights[:, item]
        has_expert[row_ids, rank, expert] += 1
    return Packing(experts.copy(), weights.copy(), item_bin, bin_items, rank_load, has_expert)


# long: one vectorised local-search loop over every layer at once; its state is shared across the rounds.
def refine_swaps(
    packing: Packing,
    *,
    target: FloatArray | None = None,
    home: IntArray | None = None,
    max_rounds: int | None = None,
) -> int:
    """Swap replicas between the busiest rank and others while that lowers the busiest rank.

    Each round, for every row still improving, picks the swap (replica ``a`` on
    the busiest rank ``p``, replica ``x`` on rank ``q``) that minimizes
    ``max(P - d, Q + d)`` with ``d = w_a - w_x``; a replica only moves to a
    rank holding fewer copies of its expert than the rank it leaves (so no
    duplicates appear where there were none).  A row stops when no swap lowers its busiest
    rank, or when its busiest rank is at or below ``target[row]``.  With
    ``home`` (the rank each replica started on, -1 for none), swaps are ranked
    by gain per replica newly moved away from home, so re-plans copy fewer weights.
    Returns the number of swaps made.
    """
    rows, ranks, k = packing.bin_items.shape
    num_slots = ranks * k
    if max_rounds is None:
        max_rounds = 4 * num_slots
    active = np.arange(rows)
    swaps = 0
    for _ in range(max_rounds):
        if active.size == 0:
            break
        load = packing.rank_load[active]
        busiest = np.argmax(load, axis=1)
        peak = load[np.arange(active.size), busiest]
        if target is not None:
            keep = peak > target[active]
            active, busiest, peak, load = active[keep], busiest[keep], peak[keep], load[keep]
            if active.size == 0:
                break
        n = active.size
        on_peak = packing.bin_items[active, busiest]  # (n, k)
        w_a = np.take_along_axis(packing.weights[active], on_peak, axis=1)  # (n, k)
        e_a = np.take_along_axis(packing.experts[active], on_peak, axis=1)
        w_x = packing.weights[active]  # (n, S)
        e_x = packing.experts[active]
        q = packing.item_bin[active]  # (n, S)
        load_q = np.take_along_axis(load, q, axis=1)  # (n, S)
        d = w_a[:, :, None] - w_x[:, None, :]  # (n, k, S)
        # Gain = how much the pair's maximum drops: min(d, P - Q - d), positive only for 0 < d < P - Q.
        gap = (peak[:, None] - load_q)[:, None, :]
        gain = np.minimum(d, gap - d).reshape(n, k * num_slots)
        eps = _REL_EPS * np.maximum(peak, 1e-300)
        row_ids = np.arange(n)
        score = gain
        if home is not None:
            # Transfers a swap adds: a goes p -> q, x goes q -> p; leaving or reaching home counts.
            h_x = home[active]  # (n, S)
            h_a = np.take_along_axis(h_x, on_peak, axis=1)  # (n, k)
            cost_a = (q[:, None, :] != h_a[:, :, None]).astype(np.int8) - (busiest[:, None] != h_a)[:, :, None]
            cost_x = (busiest[:, None] != h_x).astype(np.int8) - (q != h_x)
            cost = (cost_a + cost_x[:, None, :]).reshape(n, k * num_slots)
            score = np.where(gain > eps[:, None], gain / np.maximum(cost, 0.5), gain)
        # No duplicates: x's expert must be absent from p, a's expert absent from q.  Checked on the
        # best candidate only, re-picking while it is invalid (rare), which is far cheaper than a full mask.
        for _ in range(k * num_slots):
            best = np.argmax(score, axis=1)
            best_gain = gain[row_ids, best]
            slot_a, item_x = best // num_slots, best % num_slots
            rank_q = q[row_ids, item_x]
            # A swap may not pile copies of an expert up: the receiving rank must hold fewer copies
            # than the giving one (with no duplicates anywhere: the receiver holds none).
            e_xb, e_ab = e_x[row_ids, item_x], e_a[row_ids, slot_a]
            has = packing.has_expert
            dup = (has[active, busiest, e_xb] >= has[active, rank_q, e_xb]) | (
                has[active, rank_q, e_ab] >= has[active, busiest, e_ab]
            )
            dup &= best_gain > eps
            if not dup.any():
                break
            score[row_ids[dup], best[dup]] = -np.inf
            gain[row_ids[dup], best[dup]] = -np.inf
        improving = best_gain > eps
        if not improving.any():
            break
        active, busiest = active[improving], busiest[improving]
        slot_a, item_x = slot_a[improving], item_x[improving]
        apply_swaps(packing, active, busiest, slot_a, item_x)
        swaps += int(active.size)
    return swaps


class SwappablePacking(Protocol):
    """What :func:`apply_swaps` touches: :class:`Packing`, or a packing whose loads have a window axis."""

    experts: IntArray
    weights: FloatArray
    item_bin: IntArray
    bin_items: IntArray
    rank_load: FloatArray
    has_expert: npt.NDArray[np.int16]


def apply_swaps(
    packing: SwappablePacking, rows: IntArray, busiest: IntArray, slot_a: IntArray, item_x: IntArray
) -> None:
    """Swap the replica in ``slot_a`` of rank ``busiest`` with replica ``item_x``, row by row."""
    item_a = packing.bin_items[rows, busiest, slot_a]
    rank_q = packing.item_bin[rows, item_x]
    # Position of x inside rank q's slot list.
    slot_x = np.argmax(packing.bin_items[rows, rank_q] == item_x[:, None], axis=1)
    w_a, w_x = packing.weights[rows, item_a], packing.weights[rows, item_x]
    e_a, e_x = packing.experts[rows, item_a], packing.experts[rows, item_x]
    packing.bin_items[rows, busiest, slot_a] = item_x
    packing.bin_items[rows, rank_q, slot_x] = item_a
    packing.item_bin[rows, item_a] = rank_q
    packing.item_bin[rows, item_x] = busiest
    packing.rank_load[rows, busiest] += w_x - w_a
    packing.rank_load[rows, rank_q] += w_a - w_x
    packing.has_expert[rows, busiest, e_a] -= 1
    packing.has_expert[rows, busiest, e_x] += 1
    packing.has_expert[rows, rank_q, e_x] -= 1
    packing.has_expert[rows, rank_q, e_a] += 1


def spread_copies(packing: SwappablePacking) -> int:
    """Swap second copies of an expert off their rank, where a rank has no more slots than there are experts.

    Each second copy of expert ``e`` on rank ``p`` swaps with a replica ``x`` on a rank ``q`` without
    ``e`` whose expert ``p`` lacks (the swap that raises the pair's maximum least), so no copy piles up
    elsewhere.  Packing fills the last free slots where it must, and replica counts of at most one per
    rank (:func:`max_replicas`) leave such a swap.  Loads may carry a window axis (the larger pair's
    maximum over windows decides).  Returns the number of swaps made.
    """
    _, ranks, k = packing.bin_items.shape
    if k > packing.has_expert.shape[2]:
        return 0  # more slots than experts: some rank must hold two copies
    swaps = 0
    for row in np.flatnonzero((packing.has_expert > 1).any(axis=(1, 2))):
        ids = np.array([row])
        for _ in range(ranks * k):
            has = packing.has_expert[row]
            doubled = np.argwhere(has > 1)
            if doubled.size == 0:
                break
            p, e = (int(v) for v in doubled[0])
            slot_a = int(np.argmax(packing.experts[row, packing.bin_items[row, p]] == e))
            a = int(packing.bin_items[row, p, slot_a])
            q, experts = packing.item_bin[row], packing.experts[row]
            allowed = (has[q, e] == 0) & (has[p, experts] == 0)
            if not allowed.any():
                break
            weights = packing.weights[row].reshape(q.size, -1)
            load = packing.rank_load[row].reshape(ranks, -1)
            moved = weights[a] - weights  # what rank p hands to rank q, per window
            pair_max = np.maximum(load[p] - moved, load[q] + moved).max(axis=1)
            x = int(np.argmin(np.where(allowed, pair_max, np.inf)))
            apply_swaps(packing, ids, np.array([p]), np.array([slot_a]), np.array([x]))
            swaps += 1
    return swaps


def _pack(load: FloatArray, counts: IntArray, num_ranks: int) -> tuple[IntArray, FloatArray]:
    experts, weights = expand_replicas(load, counts)
    packing = lpt_pack(experts, weights, num_ranks, load.shape[1])
    spread_copies(packing)
    refine_swaps(packing)
    return packing.phy2log(), packing.rank_load.copy()


def solve_rows(load: FloatArray, num_ranks: int, num_slots: int) -> tuple[IntArray, IntArray, FloatArray]:
    """From-scratch plan of every row: (phy2log, greedy replica counts, rank load).

    The greedy replica counts minimize the heaviest replica, which is not always
    what packs best: with at least two slots per expert, equal counts are tried
    too, and the plain contiguous layout always; each row keeps the best.
    """
    rows, num_experts = load.shape
    counts = replica_counts(load, num_slots, max_replicas(num_ranks, num_slots, num_experts))
    best, best_load = _pack(load, counts, num_ranks)
    candidates: list[IntArray] = [np.broadcast_to(np.arange(num_slots) % num_experts, (rows, num_slots))]
    if num_slots >= 2 * num_experts:
        even = num_slots // num_experts + (np.arange(num_experts) < num_slots % num_experts)
        candidates.append(_pack(load, np.broadcast_to(even, (rows, num_experts)).astype(np.int64), num_ranks)[0])
    for phy2log in candidates:
        slot_load = np.take_along_axis(load / _counts_of(phy2log, num_experts), phy2log, axis=1)
        cand_load = slot_load.reshape(rows, num_ranks, -1).sum(axis=2)
        better = cand_load.max(axis=1) < best_load.max(axis=1) * (1 - 1e-12)
        best = np.where(better[:, None], phy2log, best)
        best_load = np.where(better[:, None], cand_load, best_load)
    return best, counts, best_load


def _counts_of(phy2log: IntArray, num_experts: int) -> IntArray:
    rows = phy2log.shape[0]
    flat = (np.arange(rows)[:, None] * num_experts + phy2log).ravel()
    return np.bincount(flat, minlength=rows * num_experts).reshape(rows, num_experts).astype(np.int64)
