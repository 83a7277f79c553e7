"""Packing for several windows of load at once: one placement that balances every window.

A placement is applied to the load to come, not the load it was planned from.
Given ``T`` recent windows (each row's load normalised to shares, so every
window weighs the same), every replica carries a *vector* of ``T`` loads, and
a rank's load is the sum of its replicas' vectors.  Four steps, vectorised
across rows like :mod:`~controller.rebalance.packing`:

1. :func:`window_counts` -- the greedy replica counts of the *largest* share each
   expert has in any window: an expert that is hot in one window and cold in
   another gets replicas before one that is merely as hot on average;
2. :func:`vector_lpt` -- replicas, heaviest on average first, each to the rank
   (with a free slot, without that expert) whose load vector it is least aligned
   with (the smallest dot product: the least growth of the sum of squares);
3. :func:`refine_windows` -- swaps between the ranks furthest from the mean and
   any other rank, while the summed squared deviation of every rank in every
   window (the windows' CVs squared) drops.  Each round every row applies its
   best swap for each of its ``top`` worst ranks that touches no rank already
   changed that round (the objective is a sum over ranks, so such swaps add up);
4. :func:`refine_overload` -- the same swaps, while the summed squared *overload*
   (deviation above the mean only) drops: a window's max is set by its overloaded
   ranks, and step 3 also pays for underloaded ones.

Scores are in units of the mean rank load of each window (1.0 = balanced).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from controller.rebalance.packing import (
    BoolArray,
    FloatArray,
    IntArray,
    apply_swaps,
    max_replicas,
    replica_counts,
    spread_copies,
)

_Array = TypeVar("_Array", bound=npt.NDArray[Any])
REFINE_TOP = 8
"""Ranks per row whose best swap each refine round looks for (the furthest from the mean)."""


def window_shares(windows: FloatArray) -> FloatArray:
    """(windows, rows, experts) loads scaled so each window's row sums to 1 (rows without load stay 0)."""
    totals = windows.sum(axis=2, keepdims=True)
    out: FloatArray = np.divide(windows, totals, out=np.zeros_like(windows), where=totals > 0)
    return out


def window_counts(shares: FloatArray, num_slots: int, num_ranks: int) -> IntArray:
    """(rows, experts) replica counts: greedy on each expert's largest share in any window, at most one
    replica per rank (:func:`~controller.rebalance.packing.max_replicas`)."""
    return replica_counts(shares.max(axis=0), num_slots, max_replicas(num_ranks, num_slots, shares.shape[2]))


@dataclass
class VectorPacking:
    """Packing state of a batch of rows under ``T`` windows; like :class:`~controller.rebalance.packing.Packing`."""

    experts: IntArray
    """(rows, slots) logical expert (row-local id) of each replica."""
    weights: FloatArray
    """(rows, slots, windows) load each replica carries in each window, in mean-rank units."""
    item_bin: IntArray
    """(rows, slots) rank each replica sits on."""
    bin_items: IntArray
    """(rows, ranks, slots_per_rank) replica indices on each rank."""
    rank_load: FloatArray
    """(rows, ranks, windows) summed replica load per rank and window."""
    has_expert: npt.NDArray[np.int16]
    """(rows, ranks, experts) replicas of each expert on each rank."""

    def phy2log(self) -> IntArray:
        rows, ranks, k = self.bin_items.shape
        return np.take_along_axis(self.experts, self.bin_items.reshape(rows, ranks * k), axis=1)


def replica_vectors(shares: FloatArray, counts: IntArray, num_ranks: int) -> tuple[IntArray, FloatArray]:
    """Per row: each replica's expert and its (windows,) load in mean-rank units, heaviest on average first."""
    _, rows, num_experts = shares.shape
    num_slots = int(counts[0].sum()) if rows else 0
    experts = np.empty((rows, num_slots), dtype=np.int64)
    for row in range(rows):
        experts[row] = np.repeat(np.arange(num_experts, dtype=np.int64), counts[row])
    per_replica = np.moveaxis(shares, 0, 2) / counts[:, :, None] * num_ranks  # (rows, experts, windows)
    weights = np.take_along_axis(per_replica, experts[:, :, None], axis=1)
    order = np.argsort(-weights.mean(axis=2), axis=1, kind="stable")
    return np.take_along_axis(experts, order, axis=1), np.take_along_axis(weights, order[:, :, None], axis=1)


def vector_lpt(experts: IntArray, weights: FloatArray, num_ranks: int, num_experts: int) -> VectorPacking:
    """Each replica, in the given order, to the free rank its load vector is least aligned with."""
    rows, num_slots, _ = weights.shape
    k = num_slots // num_ranks
    row_ids = np.arange(rows)
    flat_row = row_ids * num_ranks  # (row, rank) -> row * ranks + rank: one index array, not two
    rank_load = np.zeros((rows, num_ranks, weights.shape[2]))
    fill = np.zeros(rows * num_ranks, dtype=np.int64)
    full = np.zeros((rows, num_ranks))  # +inf on a rank whose k slots are taken
    # Copies of each expert per rank, expert-major so a step reads one contiguous (rows, ranks) slice.  Only
    # an expert with two replicas or more in some row can meet a copy of itself: other steps skip it.
    copies = np.zeros((rows, num_experts, num_ranks), dtype=np.int16)
    replicas = np.take_along_axis(_replicas_per_expert(experts, num_experts), experts, axis=1)
    shared: BoolArray = np.asarray((replicas > 1).any(axis=0))  # per step: some row's expert has copies
    item_bin = np.empty((rows, num_slots), dtype=np.int64)
    bin_items = np.empty((rows, num_ranks, k), dtype=np.int64)
    # Above any dot product: a rank with a copy of the expert only when every free rank has one.
    copy_penalty = (2.0 * weights.sum(axis=(1, 2)) * weights.max(axis=(1, 2), initial=0.0) + 1.0)[:, None]
    load_flat = rank_load.reshape(rows * num_ranks, -1)
    for item in range(num_slots):
        w = weights[:, item]
        score = np.einsum("nrt,nt->nr", rank_load, w) + full
        if shared[item]:
            expert = experts[:, item]
            score += copies[row_ids, expert] * copy_penalty
        rank = np.argmin(score, axis=1)
        where = flat_row + rank
        slot = fill[where]
        item_bin[:, item] = rank
        bin_items.reshape(rows * num_ranks, k)[where, slot] = item
        fill[where] = slot + 1
        full.reshape(-1)[where[slot + 1 >= k]] = np.inf
        load_flat[where] += w
        if shared[item]:
            copies[row_ids, expert, rank] += 1
    has = np.zeros((rows, num_ranks, num_experts), dtype=np.int16)
    np.add.at(has, (np.repeat(row_ids, num_slots), item_bin.ravel(), experts.ravel()), 1)
    return VectorPacking(experts.copy(), weights.copy(), item_bin, bin_items, rank_load, has)


def _replicas_per_expert(experts: IntArray, num_experts: int) -> IntArray:
    """(rows, experts) how many replicas each expert has in each row."""
    rows = experts.shape[0]
    offset = (np.arange(rows) * num_experts)[:, None]
    return np.bincount((experts + offset).ravel(), minlength=rows * num_experts).reshape(rows, num_experts)


# long: one vectorised local-search loop over every row at once; its state is shared across the rounds.
def refine_windows(
    packing: VectorPacking, *, target: FloatArray | None = None, max_rounds: int | None = None, top: int = REFINE_TOP
) -> int:
    """Swap replicas while the summed squared deviation of rank load over all windows drops.

    For a swap of replica ``a`` (rank ``p``) with ``x`` (rank ``q``) and ``d = w_a - w_x``
    the objective changes by ``2 [(L_q - L_p) . d + |d|^2]``; each round scores every
    ``x`` against the replicas of the ``top`` ranks furthest from the mean.  A replica
    only moves to a rank holding fewer copies of its expert than the rank it leaves.
    A row stops when none of those swaps helps, or when its busiest (rank, window) is at
    or below ``target[row]``.  Returns the number of swaps made.
    """
    rows, ranks, k = packing.bin_items.shape
    num_slots = ranks * k
    windows = packing.rank_load.shape[2]
    m = min(top, max(ranks // 2, 1))
    max_rounds = 4 * num_slots if max_rounds is None else max_rounds
    eps = 1e-12 * ranks * windows
    active = np.arange(rows)
    swaps = 0
    for _ in range(max_rounds):
        if target is not None and active.size:
            active = active[packing.rank_load[active].max(axis=(1, 2)) > target[active]]
        if active.size == 0:
            break
        load = packing.rank_load[active]  # (n, R, T)
        dev = _sum_windows((load - load.mean(axis=1, keepdims=True)) ** 2)
        ps = np.argsort(-dev, axis=1, kind="stable")[:, :m]  # (n, m)
        delta, a_item, x_item = _best_swaps(packing, active, ps)
        improving = delta < -eps  # (n, m)
        if not improving.any():
            break
        swaps += _apply_disjoint(packing, active, ps, delta, a_item, x_item, improving, ranks)
        active = active[improving.any(axis=1)]
    return swaps


def _rows(array: _Array, active: IntArray) -> _Array:
    """``array[active]``, without the copy when every row is active (the first, busiest rounds)."""
    return array if active.size == array.shape[0] else cast(_Array, array[active])


def _sum_windows(values: FloatArray) -> FloatArray:
    """``values.sum(axis=-1)`` for a short last (window) axis, added slice by slice: numpy's reduction over a
    few contiguous elements pays its per-element setup once per output, about four times the cost."""
    out = values[..., 0].copy()
    for t in range(1, values.shape[-1]):
        out += values[..., t]
    return out


def _per_replica(values: _Array, index: IntArray) -> _Array:
    """(n, S, T): ``values[i, index[i, s]]``, e.g. the load of each replica's rank (one flat take: cheaper
    than ``take_along_axis``)."""
    n, width, windows = values.shape
    flat = (index + width * np.arange(n)[:, None]).ravel()
    return cast(_Array, np.take(values.reshape(n * width, windows), flat, axis=0).reshape(n, -1, windows))


def _on_ranks(packing: VectorPacking, active: IntArray, ps: IntArray) -> IntArray:
    """(n, m, k) the replicas on ranks ``ps`` of rows ``active`` (one flat gather, no copy of the rows first)."""
    ranks, k = packing.bin_items.shape[1:]
    out: IntArray = packing.bin_items.reshape(-1, k)[active[:, None] * ranks + ps]
    return out


def _best_swaps(packing: VectorPacking, active: IntArray, ps: IntArray) -> tuple[FloatArray, IntArray, IntArray]:
    """For each row and each rank in ``ps``: the best swap's objective change / 2 and its two replicas.

    ``delta/2 = w_a.(L_q - 2 w_x) + L_p.w_x + (|w_x|^2 - L_q.w_x) + (|w_a|^2 - L_p.w_a)`` is one
    product of a (replica a, rank p) vector with a replica-x vector, scored in float32 for speed;
    the chosen swap's change is then recomputed exactly.  A replica of ``p`` paired with
    another replica of ``p`` changes nothing (``|d|^2`` exactly, which float32 can round below zero):
    :func:`_valid_best` masks those pairs.
    """
    n, m = ps.shape
    k = packing.bin_items.shape[2]
    num_slots = packing.experts.shape[1]
    w = _rows(packing.weights, active)  # (n, S, T)
    q = _rows(packing.item_bin, active)  # (n, S)
    load = _rows(packing.rank_load, active)
    lq = _per_replica(load, q)  # (n, S, T): load of each replica's rank
    on_p = _on_ranks(packing, active, ps).reshape(n, m * k)
    w_a = _per_replica(w, on_p)  # (n, mk, T)
    lp = np.repeat(_per_replica(load, ps), k, axis=1)  # (n, mk, T)
    windows = w.shape[2]
    left = np.empty((n, m * k, 2 * windows + 2), dtype=np.float32)
    left[:, :, :windows], left[:, :, windows : 2 * windows] = w_a, lp
    left[:, :, 2 * windows], left[:, :, 2 * windows + 1] = 1.0, _sum_windows((w_a - lp) * w_a)
    # Built transposed, so matmul's right operand is contiguous (BLAS); a transposed view is much slower.
    right = np.empty((n, 2 * windows + 2, num_slots), dtype=np.float32)
    right[:, :windows] = np.swapaxes(lq - 2.0 * w, 1, 2)
    right[:, windows : 2 * windows] = np.swapaxes(w, 1, 2)
    right[:, 2 * windows], right[:, 2 * windows + 1] = _sum_windows((w - lq) * w), 1.0
    flat = np.matmul(left, right).reshape(n * m, k * num_slots)
    local = np.repeat(np.arange(n), m)
    on_p = on_p.reshape(n * m, k)
    best = _valid_best(packing, active, local, ps.ravel(), on_p, flat)  # copies may not pile up
    a = on_p[np.arange(n * m), best // num_slots]
    x = best % num_slots
    d = w[local, a] - w[local, x]
    exact = ((lq[local, x] - lp[local, (np.arange(n * m) % m) * k]) * d).sum(axis=1) + (d * d).sum(axis=1)
    valid = np.isfinite(flat[np.arange(n * m), best]) & ~_piles_copies(packing, active[local], ps.ravel(), a, x)
    value = np.where(valid, exact, np.inf)
    return value.reshape(n, m), a.reshape(n, m), x.reshape(n, m)


def _apply(packing: VectorPacking, rows: IntArray, p: IntArray, a: IntArray, x: IntArray) -> None:
    slot_a = np.argmax(packing.bin_items[rows, p] == a[:, None], axis=1)
    apply_swaps(packing, rows, p, slot_a, x)


def overload(packing: VectorPacking) -> FloatArray:
    """(rows,) the summed squared overload: how far each rank sits above the mean, squared, over every window."""
    load = packing.rank_load
    over = np.maximum(load - load.mean(axis=1, keepdims=True), 0.0)
    out: FloatArray = (over * over).sum(axis=(1, 2))
    return out


# long: one vectorised local-search loop over every row at once, like refine_windows.
def refine_overload(packing: VectorPacking, *, max_rounds: int | None = None, top: int = REFINE_TOP) -> int:
    """Swap replicas while the summed squared *overload* (:func:`overload`) drops.

    A rank's max is set by the ranks above the mean; a rank below it costs nothing.
    The squared deviation of :func:`refine_windows` also pays for underloaded ranks,
    so it trades overload for underload; this pass, started from its result, removes
    overload only.  Each round scores every replica ``x`` against the replicas of the
    ``top`` most overloaded ranks with the objective's second-order expansion (exact
    while no rank crosses the mean), then checks the chosen swap's exact change.
    Returns the number of swaps made.
    """
    rows, ranks, k = packing.bin_items.shape
    windows = packing.rank_load.shape[2]
    m = min(top, max(ranks // 2, 1))
    max_rounds = 4 * ranks * k if max_rounds is None else max_rounds
    eps = 1e-12 * ranks * windows
    active = np.arange(rows)
    swaps = 0
    for _ in range(max_rounds):
        if active.size == 0:
            break
        load = packing.rank_load[active]
        excess = load - load.mean(axis=1, keepdims=True)  # (n, R, T)
        ps = np.argsort(-_sum_windows(np.maximum(excess, 0.0) ** 2), axis=1, kind="stable")[:, :m]
        delta, a_item, x_item = _overload_swaps(packing, active, ps, excess)
        improving = delta < -eps
        if not improving.any():
            break
        swaps += _apply_disjoint(packing, active, ps, delta, a_item, x_item, improving, ranks)
        active = active[improving.any(axis=1)]
    return swaps


def _overload_swaps(
    packing: VectorPacking, active: IntArray, ps: IntArray, excess: FloatArray
) -> tuple[FloatArray, IntArray, IntArray]:
    """For each row and rank in ``ps``: the best swap's exact change of overload, and its two replicas.

    With ``f(e) = max(e, 0)^2`` per (rank, window), gradient ``g`` and curvature ``h``, a
    swap moving ``d = w_a - w_x`` from ``p`` to ``q`` changes the objective by about
    ``sum_t (g_q - g_p) d + (h_p + h_q) d^2 / 2``: one product of an (a, p) feature vector
    with an x feature vector, as in :func:`_best_swaps`.
    """
    n, m = ps.shape
    k = packing.bin_items.shape[2]
    num_slots = packing.experts.shape[1]
    w = _rows(packing.weights, active)  # (n, S, T)
    q = _rows(packing.item_bin, active)
    grad, curv = 2.0 * np.maximum(excess, 0.0), 2.0 * (excess > 0)
    g_q, h_q = _per_replica(grad, q), _per_replica(curv, q)
    on_p = _on_ranks(packing, active, ps).reshape(n, m * k)
    w_a = _per_replica(w, on_p)  # (n, mk, T)
    g_p, h_p = np.repeat(_per_replica(grad, ps), k, axis=1), np.repeat(_per_replica(curv, ps), k, axis=1)
    # Features in float32 and the right operand built transposed (contiguous for BLAS), as in _best_swaps;
    # the chosen swap's change is recomputed exactly below.
    t = w.shape[2]
    left = np.empty((n, m * k, 4 * t + 2), dtype=np.float32)
    left[:, :, :t], left[:, :, t : 2 * t] = w_a, g_p - h_p * w_a
    left[:, :, 2 * t : 3 * t], left[:, :, 3 * t : 4 * t] = h_p / 2, w_a * w_a / 2
    left[:, :, 4 * t], left[:, :, 4 * t + 1] = _sum_windows((h_p * w_a / 2 - g_p) * w_a), 1.0
    right = np.empty((n, 4 * t + 2, num_slots), dtype=np.float32)
    right[:, :t], right[:, t : 2 * t] = np.swapaxes(g_q - h_q * w, 1, 2), np.swapaxes(w, 1, 2)
    right[:, 2 * t : 3 * t], right[:, 3 * t : 4 * t] = np.swapaxes(w * w, 1, 2), np.swapaxes(h_q, 1, 2)
    right[:, 4 * t], right[:, 4 * t + 1] = 1.0, _sum_windows((h_q * w / 2 - g_q) * w)
    # A swap inside one rank changes nothing (its expansion is h d^2 >= 0 but for float32 rounding):
    # _valid_best never picks one.
    flat = np.matmul(left, right).reshape(n * m, k * num_slots)
    local, p_flat = np.repeat(np.arange(n), m), ps.ravel()
    best = _valid_best(packing, active, local, p_flat, on_p.reshape(n * m, k), flat)
    a = on_p.reshape(n * m, k)[np.arange(n * m), best // num_slots]
    x = best % num_slots
    d = w[local, a] - w[local, x]
    e_p, e_q = excess[local, p_flat], excess[local, q[local, x]]

    def f(e: FloatArray) -> FloatArray:
        return np.maximum(e, 0.0) ** 2

    exact = (f(e_p - d) - f(e_p) + f(e_q + d) - f(e_q)).sum(axis=1)
    valid = np.isfinite(flat[np.arange(n * m), best]) & ~_piles_copies(packing, active[local], p_flat, a, x)
    value = np.where(valid, exact, np.inf)
    return value.reshape(n, m), a.reshape(n, m), x.reshape(n, m)


def _piles_copies(packing: VectorPacking, rows: IntArray, p: IntArray, a: IntArray, x: IntArray) -> BoolArray:
    """Whether swapping replica ``a`` (on rank ``p``) with ``x`` moves a replica to a rank holding at least as
    many copies of its expert as the rank it leaves.  :func:`_valid_best` checks only the swaps its float32
    scores call improving, and the exact change of one it did not check can still improve."""
    has, q = packing.has_expert, packing.item_bin[rows, x]
    e_a, e_x = packing.experts[rows, a], packing.experts[rows, x]
    out: BoolArray = (has[rows, p, e_x] >= has[rows, q, e_x]) | (has[rows, q, e_a] >= has[rows, p, e_a])
    return out


def _valid_best(packing: VectorPacking, active: IntArray, local: IntArray, p_flat: IntArray, on_p: IntArray,
                flat: FloatArray) -> IntArray:  # fmt: skip
    """Per candidate row of ``flat``: its best swap that piles no copies up, re-picking while invalid."""
    num_slots = packing.experts.shape[1]
    e, q, has = packing.experts[active], packing.item_bin[active], packing.has_expert
    rows = active[local]
    # A swap inside rank p changes nothing, but float32 rounding can score it below zero: never pick one.
    candidates, k = on_p.shape
    # One flat index per pair (row i, slot j, replica x on p): cheaper than three broadcast index arrays.
    within = on_p[:, None, :] + (np.arange(candidates * k) * num_slots).reshape(candidates, k, 1)
    flat.reshape(-1)[within.ravel()] = np.inf
    best = np.argmin(flat, axis=1)
    check = np.arange(flat.shape[0])
    for _ in range(flat.shape[1]):
        slot_a, x = best[check] // num_slots, best[check] % num_slots
        e_a, e_x = e[local[check], on_p[check, slot_a]], e[local[check], x]
        q_x = q[local[check], x]
        r, pf = rows[check], p_flat[check]
        bad = (has[r, pf, e_x] >= has[r, q_x, e_x]) | (has[r, q_x, e_a] >= has[r, pf, e_a])
        bad &= flat[check, best[check]] < 0
        check = check[bad]
        if check.size == 0:
            break
        flat[check, best[check]] = np.inf
        best[check] = np.argmin(flat[check], axis=1)
    out: IntArray = best
    return out


def solve_rows_windows(shares: FloatArray, num_ranks: int, num_slots: int) -> tuple[IntArray, IntArray]:
    """From-scratch plan of every row against every window: (phy2log, replica counts)."""
    num_experts = shares.shape[2]
    counts = window_counts(shares, num_slots, num_ranks)
    experts, weights = replica_vectors(shares, counts, num_ranks)
    packing = vector_lpt(experts, weights, num_ranks, num_experts)
    # Packing can fill a rank's last free slots with a second copy of an expert; the swap passes
    # never pile copies up, but they do not take one off either.
    spread_copies(packing)
    refine_windows(packing)
    refine_overload(packing)
    return packing.phy2log(), counts


def _apply_disjoint(
    packing: VectorPacking,
    active: IntArray,
    ps: IntArray,
    delta: FloatArray,
    a_item: IntArray,
    x_item: IntArray,
    improving: npt.NDArray[np.bool_],
    ranks: int,
) -> int:
    """Apply each row's improving swaps, best first, skipping any that touches a rank already changed this round
    (its scored delta no longer holds); the number applied.

    Which swaps go is decided on the round's starting state: a swap whose replica an earlier one moved touches
    that swap's ranks and is skipped anyway.  The chosen swaps touch disjoint ranks, so one batched
    :func:`_apply` gives what applying them one by one would (and costs one set of numpy calls, not ``m``).
    """
    n, m = ps.shape
    touched = np.zeros((n, ranks), dtype=bool)
    order = np.argsort(delta, axis=1, kind="stable")
    local = np.arange(n)
    q_all = packing.item_bin.reshape(-1)[active[:, None] * packing.item_bin.shape[1] + x_item]  # (n, m)
    chosen = np.zeros((n, m), dtype=bool)
    for j in range(m):
        pick = order[:, j]
        p, q = ps[local, pick], q_all[local, pick]
        go = improving[local, pick] & ~touched[local, p] & ~touched[local, q]
        touched[local[go], p[go]] = True
        touched[local[go], q[go]] = True
        chosen[local[go], pick[go]] = True
    row, col = np.nonzero(chosen)
    if row.size:
        _apply(packing, active[row], ps[row, col], a_item[row, col], x_item[row, col])
    return int(row.size)
