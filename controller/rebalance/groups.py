"""Hierarchical mode: which expert groups go to which node.

DeepSeek's group-limited routing wants each group's experts inside one node.
Every node gets ``groups / nodes`` groups.  A node's busiest rank carries at
least ``max(node load / ranks per node, heaviest replica in the node)``; we
choose, per layer, the assignment that minimizes the worst node's bound (ties:
the smaller spread of node loads, which lowers CV).  With few partitions
(8 groups in 4 nodes: 105) all are tried; with many, a greedy start plus
pairwise group swaps.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations, permutations

import numpy as np

from controller.rebalance.packing import FloatArray, IntArray, max_replicas, replica_counts

MAX_ENUMERATED_PARTITIONS = 20_000


@lru_cache(maxsize=16)
def _subsets(num_groups: int, per_node: int) -> tuple[tuple[int, ...], ...]:
    return tuple(combinations(range(num_groups), per_node))


def _count_partitions(num_groups: int, num_nodes: int) -> int:
    per_node = num_groups // num_nodes
    total, left = 1, num_groups
    for _ in range(num_nodes):
        # The lowest unassigned group anchors the next node: choose its companions.
        total *= _comb(left - 1, per_node - 1)
        left -= per_node
    return total


def _comb(n: int, r: int) -> int:
    out = 1
    for i in range(r):
        out = out * (n - i) // (i + 1)
    return out


@lru_cache(maxsize=16)
def _partitions(num_groups: int, num_nodes: int) -> tuple[tuple[int, ...], ...]:
    """All ways to split groups into nodes of equal size, as tuples of subset indices."""
    per_node = num_groups // num_nodes
    index = {subset: i for i, subset in enumerate(_subsets(num_groups, per_node))}
    out: list[tuple[int, ...]] = []

    def grow(left: tuple[int, ...], chosen: tuple[int, ...]) -> None:
        if not left:
            out.append(chosen)
            return
        anchor, rest = left[0], left[1:]
        for companions in combinations(rest, per_node - 1):
            subset = (anchor, *companions)
            grow(tuple(g for g in rest if g not in companions), (*chosen, index[subset]))

    grow(tuple(range(num_groups)), ())
    return tuple(out)


def node_bound(load: FloatArray, members: IntArray, ranks_per_node: int, slots_per_node: int) -> FloatArray:
    """(layers, candidates) lower bound of the busiest rank if a node holds the experts ``members[c]``."""
    layers = load.shape[0]
    node_load = load[:, members]  # (layers, candidates, experts per node)
    flat = node_load.reshape(-1, members.shape[1])
    heaviest = heaviest_replica(flat, slots_per_node, ranks_per_node).reshape(layers, -1)
    bound: FloatArray = np.maximum(node_load.sum(axis=2) / ranks_per_node, heaviest)
    return bound


def subset_bound(
    load: FloatArray, subsets: IntArray, group_size: int, ranks_per_node: int, slots_per_node: int
) -> FloatArray:
    """:func:`node_bound` where each candidate node holds whole groups (``subsets[c]``, groups of
    ``group_size`` consecutive experts).  The ``extra + 1`` heaviest experts of a node, and the next one,
    are among its groups' ``extra + 2`` heaviest, so the greedy and the partition run on those alone,
    not on every expert of every candidate node."""
    layers, num_experts = load.shape
    node_experts = subsets.shape[1] * group_size
    extra = slots_per_node - node_experts
    if extra < 0 or extra + 2 > group_size:
        members = (subsets[:, :, None] * group_size + np.arange(group_size)).reshape(len(subsets), -1)
        return node_bound(load, members, ranks_per_node, slots_per_node)
    grouped = load.reshape(layers, num_experts // group_size, group_size)
    group_top = -np.partition(-grouped, extra + 1, axis=2)[:, :, : extra + 2]  # (layers, groups, extra + 2)
    candidates = group_top[:, subsets].reshape(layers * len(subsets), -1)
    parted = -np.partition(-candidates, extra, axis=1)
    top, rest = parted[:, : extra + 1], parted[:, extra + 1 :]
    cap = max_replicas(ranks_per_node, slots_per_node, node_experts)
    heaviest = np.maximum((top / replica_counts(top, 2 * extra + 1, cap)).max(axis=1), rest.max(axis=1))
    node_load = grouped.sum(axis=2)[:, subsets].sum(axis=2)
    bound: FloatArray = np.maximum(node_load / ranks_per_node, heaviest.reshape(layers, -1))
    return bound


def heaviest_replica(load: FloatArray, num_slots: int, num_ranks: int) -> FloatArray:
    """(rows,) the heaviest load per replica after the greedy replication of :func:`replica_counts`
    (at most :func:`max_replicas` per expert).

    Only the ``extra + 1`` heaviest experts of a row can receive one of ``extra`` spare
    slots, so the greedy runs on those alone (the others keep one replica each).
    """
    extra = num_slots - load.shape[1]
    cap = max_replicas(num_ranks, num_slots, load.shape[1])
    if extra + 1 >= load.shape[1]:
        return np.asarray((load / replica_counts(load, num_slots, cap)).max(axis=1), dtype=np.float64)
    parted = -np.partition(-load, extra, axis=1)
    top, rest = parted[:, : extra + 1], parted[:, extra + 1 :]
    heaviest = (top / replica_counts(top, 2 * extra + 1, cap)).max(axis=1)
    return np.asarray(np.maximum(heaviest, rest.max(axis=1)), dtype=np.float64)


def choose_groups(
    load: FloatArray, num_groups: int, num_nodes: int, ranks_per_node: int, slots_per_node: int
) -> tuple[IntArray, FloatArray, FloatArray]:
    """Per layer: the node of each group, and two lower bounds over every possible split.

    Returns ``(group_node (layers, groups), cv_floor (layers,), peak_floor (layers,))``.
    ``cv_floor`` is the smallest CV any split reaches if every node's ranks were
    perfectly balanced (between-node spread cannot be removed); ``peak_floor``
    is a busiest-rank load no split can beat.  With too many splits to try,
    both fall back to weaker bounds (node spread of the chosen split is not a
    bound then, so ``cv_floor`` is 0 and ``peak_floor`` ignores groups).
    """
    layers, num_experts = load.shape
    group_size = num_experts // num_groups
    per_node = num_groups // num_nodes
    group_load = load.reshape(layers, num_groups, group_size).sum(axis=2)
    if _count_partitions(num_groups, num_nodes) <= MAX_ENUMERATED_PARTITIONS:
        return _choose_enumerated(load, group_load, num_groups, num_nodes, ranks_per_node, slots_per_node)
    group_node = np.stack([_greedy_split(group_load[layer], num_nodes, per_node) for layer in range(layers)])
    everything = np.arange(num_experts, dtype=np.int64)[None, :]
    peak_floor = node_bound(load, everything, ranks_per_node * num_nodes, slots_per_node * num_nodes)[:, 0]
    return group_node, np.zeros(layers), peak_floor


def _choose_enumerated(
    load: FloatArray,
    group_load: FloatArray,
    num_groups: int,
    num_nodes: int,
    ranks_per_node: int,
    slots_per_node: int,
) -> tuple[IntArray, FloatArray, FloatArray]:
    layers, num_experts = load.shape
    group_size = num_experts // num_groups
    per_node = num_groups // num_nodes
    subsets = np.asarray(_subsets(num_groups, per_node), dtype=np.int64)  # (C, per_node)
    bound = subset_bound(load, subsets, group_size, ranks_per_node, slots_per_node)  # (layers, C)
    subset_load = group_load[:, subsets].sum(axis=2)  # (layers, C)
    parts = np.asarray(_partitions(num_groups, num_nodes), dtype=np.int64)  # (P, nodes)
    worst = bound[:, parts].max(axis=2)  # (layers, P)
    spread = (subset_load[:, parts] ** 2).sum(axis=2)
    best_worst = worst.min(axis=1, keepdims=True)
    near = worst <= best_worst * (1 + 1e-9)
    choice = np.argmin(np.where(near, spread, np.inf), axis=1)
    group_node = np.empty((layers, num_groups), dtype=np.int64)
    for node in range(num_nodes):
        chosen = subsets[parts[choice, node]]  # (layers, per_node)
        np.put_along_axis(group_node, chosen, node, axis=1)
    cv_floor = _cv(subset_load[:, parts]).min(axis=1)
    return group_node, cv_floor, best_worst[:, 0]


def window_split(
    shares: FloatArray, num_groups: int, num_nodes: int, ranks_per_node: int, slots_per_node: int
) -> IntArray:
    """(rows, groups) node of each group for several windows (``shares``: windows x rows x experts).

    Every split is scored in every window by its busiest-rank bound (in units of that window's
    mean rank load), and the split with the smallest mean over windows wins (ties: the smaller
    worst window).  With too many splits to enumerate, the split of the mean shares.
    """
    windows, rows, num_experts = shares.shape
    mean = shares.mean(axis=0)
    if _count_partitions(num_groups, num_nodes) > MAX_ENUMERATED_PARTITIONS:
        return choose_groups(mean, num_groups, num_nodes, ranks_per_node, slots_per_node)[0]
    group_size = num_experts // num_groups
    per_node = num_groups // num_nodes
    subsets = np.asarray(_subsets(num_groups, per_node), dtype=np.int64)
    parts = np.asarray(_partitions(num_groups, num_nodes), dtype=np.int64)
    flat = shares.reshape(windows * rows, num_experts)
    per_rank = np.maximum(flat.sum(axis=1, keepdims=True), 1e-300) / (ranks_per_node * num_nodes)
    bound = subset_bound(flat, subsets, group_size, ranks_per_node, slots_per_node) / per_rank  # (windows * rows, C)
    worst = bound[:, parts].max(axis=2).reshape(windows, rows, -1)  # (windows, rows, P)
    score = worst.mean(axis=0) + 1e-6 * worst.max(axis=0)
    choice = np.argmin(score, axis=1)
    group_node = np.empty((rows, num_groups), dtype=np.int64)
    for node in range(num_nodes):
        np.put_along_axis(group_node, subsets[parts[choice, node]], node, axis=1)
    return group_node


def split_candidates(
    load: FloatArray, best: IntArray, num_nodes: int, ranks_per_node: int, slots_per_node: int, count: int
) -> tuple[IntArray, FloatArray]:
    """Splits worth packing, per layer: ``best`` first, then the next best by bound, then groups in order.

    The bound ignores how replicas fit ``slots_per_node / ranks_per_node`` slots per rank, so
    the split with the best bound does not always pack best (few experts per rank, no spare
    slots); the caller packs these candidates where the bound leaves room and keeps the best.
    Returns ``(splits (layers, candidates, groups), bounds (layers, candidates))``.
    """
    layers, num_groups = best.shape
    group_size = load.shape[1] // num_groups
    per_node = num_groups // num_nodes
    extra: list[IntArray] = []
    if _count_partitions(num_groups, num_nodes) <= MAX_ENUMERATED_PARTITIONS and count > 2:
        subsets = np.asarray(_subsets(num_groups, per_node), dtype=np.int64)
        members = (subsets[:, :, None] * group_size + np.arange(group_size)).reshape(len(subsets), -1)
        bound = node_bound(load, members, ranks_per_node, slots_per_node)
        parts = np.asarray(_partitions(num_groups, num_nodes), dtype=np.int64)
        order = np.argsort(bound[:, parts].max(axis=2), axis=1, kind="stable")[:, : count - 1]
        for rank in range(order.shape[1]):
            split = np.empty((layers, num_groups), dtype=np.int64)
            for node in range(num_nodes):
                np.put_along_axis(split, subsets[parts[order[:, rank], node]], node, axis=1)
            extra.append(split)
    extra.append(np.broadcast_to(np.arange(num_groups) // per_node, (layers, num_groups)).astype(np.int64))
    splits = np.stack([best, *extra], axis=1)
    bounds = np.stack([split_bound(load, splits[:, c], ranks_per_node, slots_per_node)
                       for c in range(splits.shape[1])], axis=1)
    return splits, bounds


def split_bound(load: FloatArray, group_node: IntArray, ranks_per_node: int, slots_per_node: int) -> FloatArray:
    """(layers,) the busiest-rank bound of a given group -> node split (the worst node's :func:`node_bound`)."""
    layers, num_experts = load.shape
    num_groups = group_node.shape[1]
    expert_node = np.repeat(group_node, num_experts // num_groups, axis=1)
    members = np.argsort(expert_node, axis=1, kind="stable")
    num_nodes = int(expert_node.max(initial=0)) + 1
    node_load = np.take_along_axis(load, members, axis=1).reshape(layers * num_nodes, -1)
    heaviest = heaviest_replica(node_load, slots_per_node, ranks_per_node)
    bound = np.maximum(node_load.sum(axis=1) / ranks_per_node, heaviest).reshape(layers, num_nodes)
    out: FloatArray = bound.max(axis=1)
    return out


def _cv(node_load: FloatArray) -> FloatArray:
    mean = node_load.mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mean > 0, node_load.std(axis=-1) / np.where(mean > 0, mean, 1.0), 0.0)


def _greedy_split(group_load: FloatArray, num_nodes: int, per_node: int) -> IntArray:
    """Heaviest group to the lightest node with room, then pairwise swaps while the max node drops."""
    node = np.full(group_load.size, -1, dtype=np.int64)
    totals = np.zeros(num_nodes)
    fill = np.zeros(num_nodes, dtype=np.int64)
    for group in np.argsort(-group_load, kind="stable"):
        target = int(np.argmin(np.where(fill < per_node, totals, np.inf)))
        node[group] = target
        totals[target] += group_load[group]
        fill[target] += 1
    for _ in range(group_load.size * num_nodes):
        peak = int(np.argmax(totals))
        best_gain, best_pair = 0.0, (-1, -1)
        for a in np.flatnonzero(node == peak):
            for b in np.flatnonzero(node != peak):
                d = float(group_load[a] - group_load[b])
                gain = min(d, float(totals[peak] - totals[node[b]]) - d)
                if gain > best_gain * (1 + 1e-12) and gain > 0:
                    best_gain, best_pair = gain, (int(a), int(b))
        if best_pair[0] < 0:
            break
        out_group, in_group = best_pair
        other = int(node[in_group])
        moved = group_load[out_group] - group_load[in_group]
        node[out_group] = other
        node[in_group] = peak
        totals[peak] -= moved
        totals[other] += moved
    return node


def closest_split(
    load: FloatArray,
    old_group_node: IntArray,
    num_nodes: int,
    ranks_per_node: int,
    slots_per_node: int,
    *,
    tolerance: float,
    max_cv: float,
) -> IntArray | None:
    """Per layer, the group split that moves the fewest groups off their node in ``old_group_node``.

    Only splits whose busiest-rank bound is within ``tolerance`` of the best
    split's, and whose between-node CV is at most ``max_cv`` (unless the best
    split's is above it too), qualify; nodes are numbered to match ``old_group_node``.  Ties
    go to the smaller spread of node loads.  None when there are too many
    splits or nodes to enumerate.
    """
    layers, num_experts = load.shape
    num_groups = old_group_node.shape[1]
    if _count_partitions(num_groups, num_nodes) > MAX_ENUMERATED_PARTITIONS or num_nodes > 6:
        return None
    group_size = num_experts // num_groups
    per_node = num_groups // num_nodes
    subsets = np.asarray(_subsets(num_groups, per_node), dtype=np.int64)
    members = (subsets[:, :, None] * group_size + np.arange(group_size)).reshape(len(subsets), -1)
    bound = node_bound(load, members, ranks_per_node, slots_per_node)
    subset_load = load.reshape(layers, num_groups, group_size).sum(axis=2)[:, subsets].sum(axis=2)
    parts = np.asarray(_partitions(num_groups, num_nodes), dtype=np.int64)  # (P, nodes)
    worst = bound[:, parts].max(axis=2)  # (layers, P)
    spread = (subset_load[:, parts] ** 2).sum(axis=2)
    node_cv = _cv(subset_load[:, parts])
    best_worst = worst.min(axis=1, keepdims=True)
    best = np.argmin(np.where(worst <= best_worst * (1 + 1e-9), spread, np.inf), axis=1)
    best_cv = node_cv[np.arange(layers), best]
    # Where even the best split misses max_cv, the CV objective is out of reach and balance decides.
    cv_ok = (node_cv <= max_cv) | (best_cv > max_cv)[:, None]
    qualifies = (worst <= best_worst * (1 + tolerance)) & cv_ok
    # overlap[l, p, n, m] = groups that split p puts on node n and the old split had on node m.
    in_part = np.zeros((len(parts), num_groups, num_nodes))
    for node in range(num_nodes):
        in_part[np.arange(len(parts))[:, None], subsets[parts[:, node]], node] = 1.0
    old = (old_group_node[:, :, None] == np.arange(num_nodes)).astype(np.float64)
    overlap = np.einsum("pgn,lgm->lpnm", in_part, old)
    perms = np.asarray(list(permutations(range(num_nodes))), dtype=np.int64)  # (K, nodes)
    stay = overlap[:, :, np.arange(num_nodes)[None, :], perms].sum(axis=3)  # (layers, P, K)
    best_perm = np.argmax(stay, axis=2)
    staying = stay.max(axis=2)
    # Fewest groups moved first; the spread (scaled below 0.5) only breaks ties.
    key = np.where(qualifies, staying - spread / (2.0 * spread.max(axis=1, keepdims=True) + 1e-300), -np.inf)
    choice = np.argmax(key, axis=1)
    group_node = np.empty((layers, num_groups), dtype=np.int64)
    rows = np.arange(layers)
    perm = perms[best_perm[rows, choice]]  # (layers, nodes): split node n -> old node perm[n]
    for node in range(num_nodes):
        np.put_along_axis(group_node, subsets[parts[choice, node]], perm[:, node : node + 1], axis=1)
    return group_node
