"""The rebalancing policy: expert load in, placement plan out (pure, no I/O, deterministic).

Objectives, in order: the busiest rank's load per layer as low as possible;
then few expert moves (weight transfers) from the current placement.
Global mode packs all experts over all ranks; hierarchical mode (``num_nodes >
1``) first gives each node whole expert groups, then packs every node alone, so
a group's experts never leave their node.  Layers without load keep their
current placement (contiguous when there is none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from contracts.imbalance import Imbalance, count_replicas, imbalance_cv, rank_load
from contracts.placement import Placement
from contracts.slo_defaults import MAX_IMBALANCE_CV
from controller.rebalance.checks import (
    from_scratch_base,
    groups_within_nodes,
    load_scale_log2,
    validate_plan_inputs,
)
from controller.rebalance.groups import choose_groups, closest_split, split_candidates
from controller.rebalance.moves import align_slots, max_over_mean_lower_bound, rank_moves, relabel_ranks, slot_moves
from controller.rebalance.packing import FloatArray, IntArray, max_replicas, replica_counts, solve_rows
from controller.rebalance.repair import repair_counts, repair_rows


@dataclass(frozen=True, kw_only=True)
class RebalanceConfig:
    """Knobs of the planner; the defaults suit DeepSeek-V3-sized layers."""

    replan_tolerance: float = 0.005
    """A re-plan stops moving experts once every layer's busiest rank is within this
    fraction of a from-scratch plan's; layers that cannot get there take the
    from-scratch plan (renumbered to keep what it can)."""
    max_cv: float = MAX_IMBALANCE_CV
    """Hierarchical re-plans move fewer groups only where the CV stays at or below this, unless
    the best split misses it too (then balance alone decides)."""
    replan_replica_slack: float = 1.2
    """A re-plan adds replicas only to experts whose load per replica would exceed this
    multiple of a from-scratch plan's heaviest replica (each added replica is a transfer)."""


@dataclass(frozen=True, eq=False)
class RebalancePlan:
    """A placement with its predicted figures; every array is per layer first."""

    placement: Placement
    previous: Placement
    """The placement the moves are counted from (the current one, or contiguous)."""
    replica_counts: IntArray
    """(layers, experts) replicas per logical expert."""
    rank_load: FloatArray
    """(layers, ranks) predicted load per rank, kept by the planner while it packs."""
    imbalance_before: Imbalance
    imbalance_after: Imbalance
    lower_bound: FloatArray
    """(layers,) max/mean that no placement in this mode can beat."""
    cv_lower_bound: FloatArray | None
    """(layers,) hierarchical mode: CV no group split can beat (None in global mode)."""
    moves: IntArray
    """(layers,) replicas each layer must copy onto a rank that did not hold them."""
    replanned: npt.NDArray[np.bool_]
    """(layers,) True where the plan started from the previous placement."""
    active: npt.NDArray[np.bool_]
    """(layers,) True where the layer had load (others kept their placement)."""
    mode: str
    window_imbalance: tuple[Imbalance, ...] = ()
    """A plan over several windows: its imbalance on each window (empty for a one-window plan)."""
    window_active: tuple[npt.NDArray[np.bool_], ...] = ()
    """Per window, its layers with load: a layer idle in one window has no balance there to summarise."""
    load_scale_log2: int = 0
    """``rank_load`` is in units of the load times ``2**load_scale_log2``: 0 unless the load's largest
    entry is outside ``2**-400 .. 2**400`` (:func:`~controller.rebalance.checks.load_scale_log2`)."""

    @property
    def total_moves(self) -> int:
        return int(self.moves.sum())

    def slot_moves(self) -> list[dict[str, int]]:
        return slot_moves(self.previous.phy2log, self.placement.phy2log, self.placement.num_ranks)

    def to_json(self) -> dict[str, Any]:
        """Loadable by ``Placement.from_json``; adds moves, imbalance and bounds."""
        out = self.placement.to_json()
        out.update(
            mode=self.mode,
            replica_counts=self.replica_counts.tolist(),
            predicted_rank_load=self.rank_load.tolist(),
            moves=self.slot_moves(),
            moves_per_layer=self.moves.tolist(),
            total_moves=self.total_moves,
            imbalance_before=self.imbalance_before.to_json(self.active),
            imbalance_after=self.imbalance_after.to_json(self.active),
            lower_bound_max_over_mean=self.lower_bound.tolist(),
            active_layers=self.active.tolist(),
            replanned_layers=self.replanned.tolist(),
        )
        if self.cv_lower_bound is not None:
            out["cv_lower_bound"] = self.cv_lower_bound.tolist()
        if self.load_scale_log2:
            out["load_scale_log2"] = self.load_scale_log2
        if self.window_imbalance:
            out["windows"] = len(self.window_imbalance)
            masks = self.window_active or (self.active,) * len(self.window_imbalance)
            out["imbalance_after_per_window"] = [  # null for a window with no load: it has no balance
                w.summary(mask) if mask.any() else None for w, mask in zip(self.window_imbalance, masks, strict=True)
            ]
        return out


def plan_rebalance(
    load: npt.ArrayLike,
    *,
    num_ranks: int,
    slots_per_rank: int,
    num_nodes: int = 1,
    num_groups: int = 1,
    previous: Placement | None = None,
    config: RebalanceConfig | None = None,
) -> RebalancePlan:
    """Plan a placement for ``load`` (layers x logical experts, e.g. token counts over a window)."""
    config = config or RebalanceConfig()
    weights = np.asarray(load, dtype=np.float64)
    validate_plan_inputs(weights, num_ranks, slots_per_rank, num_nodes, num_groups, previous)
    scale_log2 = load_scale_log2(weights)
    weights = np.ldexp(weights, scale_log2)  # exact: a power of two
    layers, num_experts = weights.shape
    active = weights.sum(axis=1) > 0
    base = previous or from_scratch_base(layers, num_experts, num_ranks, slots_per_rank, num_nodes, num_groups, active)
    phy2log = base.phy2log.copy()
    predicted = rank_load(base.phy2log, weights, num_ranks)
    replanned = np.zeros(layers, dtype=bool)
    lower = np.ones(layers)
    cv_lower: FloatArray | None = None
    rows = np.flatnonzero(active)
    if rows.size:
        result, lower[rows], cv_floor = _plan_rows(
            weights[rows], base.phy2log[rows], previous is not None, num_ranks, slots_per_rank, num_nodes, num_groups,
            config,
        )
        if cv_floor is not None:
            cv_lower = np.zeros(layers)
            cv_lower[rows] = cv_floor
        new_p2l, new_load, new_replanned = result
        if previous is None:  # experts a rank keeps stay in their slots: a shuffle inside a rank is no move
            new_p2l = align_slots(base.phy2log[rows], new_p2l, num_ranks)
        # Keep the current placement where the plan does not beat it (the greedy replica
        # counts are not always best, e.g. when every expert can have the same count).
        keep = predicted[rows].max(axis=1) <= new_load.max(axis=1) * (1 + 1e-12)
        if num_nodes > 1:
            keep &= groups_within_nodes(base.phy2log[rows], num_experts // num_groups, num_nodes)
        phy2log[rows] = np.where(keep[:, None], base.phy2log[rows], new_p2l)
        predicted[rows] = np.where(keep[:, None], predicted[rows], new_load)
        replanned[rows] = np.where(keep, previous is not None, new_replanned)
    counts_out = count_replicas(phy2log, num_experts)
    return RebalancePlan(
        placement=Placement(phy2log, num_ranks),
        previous=base,
        replica_counts=counts_out,
        rank_load=predicted,
        imbalance_before=Imbalance.of(rank_load(base.phy2log, weights, num_ranks)),
        imbalance_after=Imbalance.of(predicted),
        lower_bound=lower,
        cv_lower_bound=cv_lower,
        moves=rank_moves(base.phy2log, phy2log, num_ranks),
        replanned=replanned,
        active=active,
        mode="hierarchical" if num_nodes > 1 else "global",
        load_scale_log2=scale_log2,
    )


def _plan_rows(
    weights: FloatArray, base: IntArray, replanning: bool, num_ranks: int, slots_per_rank: int, num_nodes: int,
    num_groups: int, config: RebalanceConfig,
) -> tuple[tuple[IntArray, FloatArray, npt.NDArray[np.bool_]], FloatArray, FloatArray | None]:
    """A plan for layers with load: (phy2log, predicted rank load, replanned), the max/mean floor, the CV floor.

    The CV floor is known for hierarchical plans only (None for global ones).
    """
    if num_nodes > 1:
        result, peak_floor, cv_floor = _plan_hierarchical(
            weights, base, replanning, num_ranks, slots_per_rank, num_nodes, num_groups, config,
        )
        mean = weights.sum(axis=1) / num_ranks
        return result, np.maximum(peak_floor / mean, 1.0), cv_floor
    flat_p2l, flat_load, flat_replanned, _ = _plan_flat(
        weights, base, replanning, num_ranks, num_ranks * slots_per_rank, config,
    )
    num_slots = num_ranks * slots_per_rank
    counts = replica_counts(weights, num_slots, max_replicas(num_ranks, num_slots, weights.shape[1]))
    return (flat_p2l, flat_load, flat_replanned), max_over_mean_lower_bound(weights, counts, num_ranks), None


_FlatResult = tuple[IntArray, FloatArray, npt.NDArray[np.bool_], FloatArray]
"""(phy2log, predicted rank load, started from the base?, busiest rank of a from-scratch plan) per row."""


def _plan_flat(
    load: FloatArray, base: IntArray, repair: bool, num_ranks: int, num_slots: int, config: RebalanceConfig
) -> _FlatResult:
    """Rows planned independently; ``base`` uses row-local expert ids (-1: foreign, must be refilled)."""
    scratch, counts, scratch_load = solve_rows(load, num_ranks, num_slots)
    replanned = np.zeros(load.shape[0], dtype=bool)
    if not repair:
        return scratch, scratch_load, replanned, scratch_load.max(axis=1)
    # Renumber the from-scratch ranks to overlap the current placement most: free in balance, saves moves.
    filled_base = np.where(base >= 0, base, load.shape[1])
    scratch, source = relabel_ranks(filled_base, scratch, num_ranks)
    scratch_load = np.take_along_axis(scratch_load, source, axis=1)
    target = scratch_load.max(axis=1) * (1 + config.replan_tolerance)
    cap = max_replicas(num_ranks, num_slots, load.shape[1])
    new_counts = repair_counts(load, base, counts, config.replan_replica_slack, max_count=cap)
    repaired = repair_rows(load, base, new_counts, num_ranks, target)
    good = repaired.rank_load.max(axis=1) <= target
    out = np.where(good[:, None], align_slots(filled_base, repaired.phy2log(), num_ranks), scratch)
    out_load = np.where(good[:, None], repaired.rank_load, scratch_load)
    return out, out_load, good, scratch_load.max(axis=1)


def _plan_hierarchical(
    load: FloatArray,
    base: IntArray,
    repair: bool,
    num_ranks: int,
    slots_per_rank: int,
    num_nodes: int,
    num_groups: int,
    config: RebalanceConfig,
) -> tuple[tuple[IntArray, FloatArray, npt.NDArray[np.bool_]], FloatArray, FloatArray]:
    num_experts = load.shape[1]
    group_size = num_experts // num_groups
    ranks_per_node = num_ranks // num_nodes
    slots_per_node = ranks_per_node * slots_per_rank
    group_node, cv_floor, peak_floor = choose_groups(
        load, num_groups, num_nodes, ranks_per_node, slots_per_node
    )
    shape = (num_nodes, ranks_per_node, slots_per_node)
    group_node, (p2l, rank_load_) = _pack_best_split(load, base, group_node, peak_floor, shape, config)
    best_split = np.repeat(group_node, group_size, axis=1)  # (layers, experts) -> node
    if not repair:
        return (p2l, rank_load_, np.zeros(load.shape[0], dtype=bool)), peak_floor, cv_floor
    old_split, renumbered = _kept_and_renumbered_splits(base, best_split, num_nodes, group_size, slots_per_node)
    p2l, rank_load_, replanned, scratch_peak = _solve_split(load, base, renumbered, True, shape, config)
    kept = renumbered.copy()
    intact = (old_split >= 0).all(axis=1)
    if intact.any():
        closest = closest_split(
            load[intact], old_split[intact], num_nodes, ranks_per_node, slots_per_node,
            tolerance=config.replan_tolerance, max_cv=config.max_cv,
        )
        if closest is not None:
            kept[intact] = np.repeat(closest, group_size, axis=1)
    differs = (kept != renumbered).any(axis=1)
    if differs.any():
        # A split closer to the old one moves fewer groups between nodes; take it where the plan
        # stays within the tolerance of a from-scratch plan on the best split and keeps the CV objective.
        rows = np.flatnonzero(differs)
        k_p2l, k_load, k_replanned, _ = _solve_split(load[rows], base[rows], kept[rows], True, shape, config)
        good = k_load.max(axis=1) <= scratch_peak[rows] * (1 + config.replan_tolerance)
        best_cv = imbalance_cv(rank_load_[rows])
        good &= (imbalance_cv(k_load) <= np.maximum(best_cv, config.max_cv)) | (best_cv > config.max_cv)
        rows = rows[good]
        p2l[rows], rank_load_[rows], replanned[rows] = k_p2l[good], k_load[good], k_replanned[good]
    return (p2l, rank_load_, replanned), peak_floor, cv_floor


SPLIT_CANDIDATES = 4
"""Splits by bound a layer may try (the best included) where the best one's packing misses its
bound; groups in order are tried too."""
SPLIT_SEARCH_GAP = 5e-3
"""Other splits are packed only where the best one's busiest rank is more than this fraction above
its bound (no other split can gain more than that).  On DeepSeek-V3 loads at 32 ranks x 288 slots in 4 nodes the
gap is 0.01-0.15 %; with a few experts per rank and no spare slots it can be tens of percent."""


def _pack_best_split(
    load: FloatArray, base: IntArray, group_node: IntArray, floor: FloatArray, shape: tuple[int, int, int],
    config: RebalanceConfig,
) -> tuple[IntArray, tuple[IntArray, FloatArray]]:
    """The group split that packs best from scratch, per layer: ``(group -> node, (phy2log, rank load))``.

    ``group_node`` (the best split by bound, ``floor``) is packed first.  The bound ignores how the
    replicas fit the slots of each rank, so where the packing misses it by more than
    ``SPLIT_SEARCH_GAP`` the next candidates whose bound is below the packed peak are packed
    too, and a layer takes one only when its busiest rank is lower and its CV stays within
    ``max(CV so far, max_cv)``.  The contiguous layout, where it keeps groups in nodes, is the
    last candidate (it costs no packing): a re-plan and a from-scratch plan then start from
    the same best, and the re-plan's tolerance is measured against it.
    """
    num_nodes, ranks_per_node, slots_per_node = shape
    layers, num_experts = load.shape
    group_size = num_experts // group_node.shape[1]
    p2l, rank_load_, _, _ = _solve_split(load, base, np.repeat(group_node, group_size, axis=1), False, shape, config)
    chosen = group_node.copy()
    peak = rank_load_.max(axis=1)
    search = np.flatnonzero(peak > floor * (1 + SPLIT_SEARCH_GAP))
    if search.size:
        _pack_candidates(load, base, group_node, search, shape, config, (chosen, p2l, rank_load_))
    contiguous = Placement.contiguous(layers, num_experts, num_nodes * ranks_per_node,
                                      slots_per_node // ranks_per_node).phy2log
    c_load = rank_load(contiguous, load, num_nodes * ranks_per_node)
    take = groups_within_nodes(contiguous, group_size, num_nodes) & (
        c_load.max(axis=1) <= rank_load_.max(axis=1) * (1 + 1e-12)
    )
    p2l[take], rank_load_[take] = contiguous[take], c_load[take]
    # Groups in order: what the contiguous layout holds where it keeps groups whole.
    chosen[take] = np.arange(group_node.shape[1]) // (group_node.shape[1] // num_nodes)
    return chosen, (p2l, rank_load_)


def _pack_candidates(
    load: FloatArray, base: IntArray, group_node: IntArray, search: IntArray, shape: tuple[int, int, int],
    config: RebalanceConfig, best: tuple[IntArray, IntArray, FloatArray],
) -> None:
    """Pack the candidate splits of the layers ``search`` whose bound is below their packed peak, and
    write into ``best = (split, phy2log, rank load)`` those that pack better (see :func:`_pack_best_split`).

    Where no candidate's bound is below the packed peak (with too many splits to enumerate, the only
    candidate besides the best split is groups in order), every layer keeps the best split.
    """
    chosen, p2l, rank_load_ = best
    num_nodes, ranks_per_node, slots_per_node = shape
    group_size = load.shape[1] // group_node.shape[1]
    peak = rank_load_[search].max(axis=1)
    splits, bounds = split_candidates(
        load[search], group_node[search], num_nodes, ranks_per_node, slots_per_node, SPLIT_CANDIDATES
    )
    # (layer, candidate) pairs worth packing, all in one batch: those bounded below the packed peak.
    at, cands = np.nonzero(bounds[:, 1:] < peak[:, None] * (1 - 1e-9))
    if at.size == 0:
        return
    rows, cands = search[at], cands + 1
    split = np.repeat(splits[at, cands], group_size, axis=1)
    c_p2l, c_load, _, _ = _solve_split(load[rows], base[rows], split, False, shape, config)
    c_peak = c_load.max(axis=1)
    ok = imbalance_cv(c_load) <= np.maximum(imbalance_cv(rank_load_[rows]), config.max_cv)
    for i in np.argsort(np.where(ok, c_peak, np.inf), kind="stable"):  # best first: each layer takes its best
        row = rows[i]
        if ok[i] and c_peak[i] < rank_load_[row].max() * (1 - 1e-9):
            p2l[row], rank_load_[row], chosen[row] = c_p2l[i], c_load[i], splits[at[i], cands[i]]


def _solve_split(
    load: FloatArray,
    base: IntArray,
    expert_node: IntArray,
    repair: bool,
    shape: tuple[int, int, int],
    config: RebalanceConfig,
) -> tuple[IntArray, FloatArray, npt.NDArray[np.bool_], FloatArray]:
    """Plan every (layer, node) as its own row, for a given expert -> node split."""
    num_nodes, ranks_per_node, slots_per_node = shape
    layers, num_experts = load.shape
    # members[layer, node] = the node's experts in id order (stable sort by node).
    members = np.argsort(expert_node, axis=1, kind="stable").reshape(layers, num_nodes, -1)
    per_node = members.shape[2]
    local_of = np.empty((layers, num_experts), dtype=np.int64)  # global id -> index inside its node
    local_ids = np.tile(np.arange(per_node, dtype=np.int64), num_nodes)
    np.put_along_axis(local_of, members.reshape(layers, -1), np.broadcast_to(local_ids, (layers, num_experts)),
                      axis=1)
    row_load = np.take_along_axis(load, members.reshape(layers, -1), axis=1).reshape(layers, num_nodes, -1)
    base_rows = base.reshape(layers, num_nodes * slots_per_node)
    base_local = np.take_along_axis(local_of, base_rows, axis=1).reshape(layers, num_nodes, slots_per_node)
    owner = np.take_along_axis(expert_node, base_rows, axis=1).reshape(layers, num_nodes, slots_per_node)
    base_local = np.where(owner == np.arange(num_nodes)[None, :, None], base_local, -1)
    flat, flat_load, flat_replanned, flat_peak = _plan_flat(
        row_load.reshape(layers * num_nodes, per_node),
        base_local.reshape(layers * num_nodes, slots_per_node),
        repair, ranks_per_node, slots_per_node, config,
    )
    local = flat.reshape(layers, num_nodes, slots_per_node)
    phy2log: IntArray = np.take_along_axis(members, local, axis=2).reshape(layers, -1).astype(np.int64)
    replanned = np.asarray(flat_replanned.reshape(layers, num_nodes).all(axis=1), dtype=bool)
    scratch_peak = flat_peak.reshape(layers, num_nodes).max(axis=1)
    return phy2log, flat_load.reshape(layers, num_nodes * ranks_per_node), replanned, scratch_peak


def _kept_and_renumbered_splits(
    base: IntArray, best_split: IntArray, num_nodes: int, group_size: int, slots_per_node: int
) -> tuple[IntArray, IntArray]:
    """(the base placement's group -> node split, -1 rows where it is not a valid group split;
    the best split with its nodes renumbered to overlap the base placement most)."""
    layers, num_experts = best_split.shape
    num_groups = num_experts // group_size
    old_split = np.full((layers, num_groups), -1, dtype=np.int64)
    renumbered = best_split.copy()
    base_node = np.arange(base.shape[1]) // slots_per_node
    held = np.zeros((layers, num_nodes, num_experts), dtype=np.int64)
    np.add.at(held, (np.repeat(np.arange(layers), base.shape[1]), np.tile(base_node, layers), base.ravel()), 1)
    for layer in range(layers):
        old_node = np.argmax(held[layer], axis=0)  # where each expert has (most of) its replicas
        overlap = np.zeros((num_nodes, num_nodes), dtype=np.int64)
        np.add.at(overlap, (best_split[layer], old_node), 1)
        new_ids, old_ids = linear_sum_assignment(-overlap)
        rename = np.empty(num_nodes, dtype=np.int64)
        rename[new_ids] = old_ids
        renumbered[layer] = rename[best_split[layer]]
        groups_old = old_node.reshape(-1, group_size)
        intact = (groups_old == groups_old[:, :1]).all() and np.all(
            np.bincount(groups_old[:, 0], minlength=num_nodes) == groups_old.shape[0] // num_nodes
        )
        if intact:
            old_split[layer] = groups_old[:, 0]
    return old_split, renumbered
