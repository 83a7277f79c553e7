"""Planning against a history of windows: a placement for the load to come, not just the load just seen.

A placement planned on one window is near-perfect on that window and is then
applied to the next, whose hot experts have moved.  :func:`plan_over_windows`
plans against several recent windows at once (:mod:`~controller.rebalance.robust`):
each window is normalised to shares, replica counts follow each expert's
largest share in any window (volatile hot experts get replicas first), and the
packing balances every window together, ending with swaps that lower only the
ranks above each window's mean (the max is theirs).  Rank load is linear in
expert load, so a placement balanced in every window is balanced on any mix of them.  With one window it is
:func:`~controller.rebalance.planner.plan_rebalance` exactly.

The plan's figures (``rank_load``, ``imbalance_before`` / ``imbalance_after``,
lower bounds) are on the summed windows, the load the placement will have
carried over the whole history; ``window_imbalance`` gives each window's.
Hierarchical mode chooses the group split on the mean of the shares, then packs
every node against every window.  Re-planning from a previous placement keeps
it per layer where it is within ``replan_tolerance`` of the new plan (scored
as the mean over windows of max/mean), and otherwise renumbers the new plan's
nodes, then its ranks inside each node, to overlap it most.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from contracts.errors import ValidationError
from contracts.imbalance import Imbalance, count_replicas, max_over_mean, rank_load
from contracts.placement import Placement
from controller.rebalance.checks import (
    from_scratch_base,
    groups_within_nodes,
    load_scale_log2,
    validate_plan_inputs,
)
from controller.rebalance.groups import choose_groups, window_split
from controller.rebalance.moves import align_slots, max_over_mean_lower_bound, rank_moves, renumber_plan
from controller.rebalance.out_of_sample import HeldOutGain, held_out_gain
from controller.rebalance.packing import FloatArray, IntArray, max_replicas, replica_counts
from controller.rebalance.planner import RebalanceConfig, RebalancePlan, plan_rebalance
from controller.rebalance.robust import solve_rows_windows, window_shares


def stack_windows(windows: Sequence[npt.ArrayLike]) -> FloatArray:
    """(windows, layers, experts) from a sequence of equally shaped loads; ValidationError lists every problem."""
    if len(windows) == 0:
        raise ValidationError("at least one window of load is needed")
    arrays = [np.asarray(w, dtype=np.float64) for w in windows]
    problems: list[str] = []
    for i, arr in enumerate(arrays):
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
            problems.append(f"window {i}: load must be a non-empty layers x experts matrix, got shape {arr.shape}")
        elif arr.shape != arrays[0].shape:
            problems.append(
                f"window {i} is {arr.shape[0]} layers x {arr.shape[1]} experts, window 0 is "
                f"{arrays[0].shape[0]} x {arrays[0].shape[1]}"
            )
        elif not np.isfinite(arr).all():
            problems.append(f"window {i}: load has NaN or infinite entries")
        elif (arr < 0).any():
            problems.append(f"window {i}: load must be non-negative, smallest entry is {float(arr.min())}")
    if problems:
        raise ValidationError(problems)
    return np.stack(arrays)


def window_scores(phy2log: IntArray, windows: FloatArray, num_ranks: int) -> FloatArray:
    """(layers,) mean over windows of each window's max/mean rank load (windows without load count as 1)."""
    scores: FloatArray = max_over_mean(window_rank_loads(phy2log, windows, num_ranks)).mean(axis=0)
    return scores


def window_rank_loads(phy2log: IntArray, windows: FloatArray, num_ranks: int) -> FloatArray:
    """(windows, layers, ranks): :func:`~contracts.imbalance.rank_load` of every window, with the replica
    counts and the gather index built once for all of them."""
    num_windows, layers, num_experts = windows.shape
    counts = count_replicas(phy2log, num_experts)
    per_replica = np.divide(windows, counts, out=np.zeros_like(windows), where=counts > 0)
    index = (phy2log + (np.arange(layers) * num_experts)[:, None]).ravel()
    slot_load = per_replica.reshape(num_windows, layers * num_experts)[:, index]
    # Window by window, so each rank's slots add up in rank_load's order (one 4-D sum rounds differently).
    per_rank = phy2log.shape[1] // num_ranks
    out: FloatArray = np.stack([w.reshape(layers, num_ranks, per_rank).sum(axis=2) for w in slot_load])
    return out


def plan_over_windows(
    windows: Sequence[npt.ArrayLike],
    *,
    num_ranks: int,
    slots_per_rank: int,
    num_nodes: int = 1,
    num_groups: int = 1,
    previous: Placement | None = None,
    config: RebalanceConfig | None = None,
) -> RebalancePlan:
    """Plan one placement for every window in ``windows`` (each layers x experts, oldest first)."""
    stack = stack_windows(windows)
    kw = {"num_ranks": num_ranks, "slots_per_rank": slots_per_rank, "num_nodes": num_nodes, "num_groups": num_groups}
    if stack.shape[0] == 1:
        return plan_rebalance(stack[0], previous=previous, config=config, **kw)
    config = config or RebalanceConfig()
    scale_log2 = load_scale_log2(stack)
    stack = np.ldexp(stack, scale_log2)  # exact: a power of two, so the windows' sum stays finite
    total = stack.sum(axis=0)
    validate_plan_inputs(total, num_ranks, slots_per_rank, num_nodes, num_groups, previous)
    layers, num_experts = total.shape
    active = total.sum(axis=1) > 0
    base = previous or from_scratch_base(layers, num_experts, num_ranks, slots_per_rank, num_nodes, num_groups, active)
    phy2log = base.phy2log.copy()
    rows = np.flatnonzero(active)
    lower = np.ones(layers)
    cv_lower: FloatArray | None = None
    if rows.size:
        shares = window_shares(stack[:, rows])
        if num_nodes > 1:
            new, peak_floor, cv_floor = _plan_nodes(shares, total[rows], num_ranks, slots_per_rank, num_nodes,
                                                    num_groups)
            lower[rows] = np.maximum(peak_floor / (total[rows].sum(axis=1) / num_ranks), 1.0)
            cv_lower = np.zeros(layers)
            cv_lower[rows] = cv_floor
        else:
            new = solve_rows_windows(shares, num_ranks, num_ranks * slots_per_rank)[0]
            num_slots = num_ranks * slots_per_rank
            counts = replica_counts(total[rows], num_slots, max_replicas(num_ranks, num_slots, num_experts))
            lower[rows] = max_over_mean_lower_bound(total[rows], counts, num_ranks)
        scratch = window_scores(new, shares, num_ranks)
        if previous is not None:
            # Renumbered last: the contiguous layout, where it wins, keeps most replicas where they are too.
            new, scratch = _no_worse_than_contiguous(new, shares, num_ranks, slots_per_rank, num_nodes, num_groups)
            new = renumber_plan(base.phy2log[rows], new, num_ranks, num_nodes)
        else:
            new = align_slots(base.phy2log[rows], new, num_ranks)  # no slot shuffle inside a rank counts as a move
        tolerance = config.replan_tolerance if previous is not None else 1e-12
        keep = window_scores(base.phy2log[rows], shares, num_ranks) <= scratch * (1 + tolerance)
        if num_nodes > 1:
            keep &= groups_within_nodes(base.phy2log[rows], num_experts // num_groups, num_nodes)
        phy2log[rows] = np.where(keep[:, None], base.phy2log[rows], new)
    plan = _plan(phy2log, base, stack, total, active, lower, cv_lower, num_ranks, previous is not None, num_nodes)
    return replace(plan, load_scale_log2=scale_log2)


def _no_worse_than_contiguous(new: IntArray, shares: FloatArray, num_ranks: int, slots_per_rank: int,
                              num_nodes: int, num_groups: int) -> tuple[IntArray, FloatArray]:  # fmt: skip
    """Per row, the contiguous layout where it scores better than the plan (and keeps groups in nodes).

    A plan from scratch starts from the contiguous layout and keeps it where the planner does no
    better; a re-plan takes the same candidate, so it stays within tolerance of the plan from scratch.
    """
    rows, width = new.shape
    num_experts = shares.shape[-1]
    fresh = Placement.contiguous(rows, num_experts, num_ranks, slots_per_rank).phy2log
    assert fresh.shape[1] == width
    planned, contiguous = window_scores(new, shares, num_ranks), window_scores(fresh, shares, num_ranks)
    better = contiguous < planned
    if num_nodes > 1:
        better &= groups_within_nodes(fresh, num_experts // num_groups, num_nodes)
    return np.where(better[:, None], fresh, new), np.where(better, contiguous, planned)


def _plan(
    phy2log: IntArray, base: Placement, stack: FloatArray, total: FloatArray, active: npt.NDArray[np.bool_],
    lower: FloatArray, cv_lower: FloatArray | None, num_ranks: int, replanning: bool, num_nodes: int,
) -> RebalancePlan:
    counts = count_replicas(phy2log, total.shape[1])
    kept = (phy2log == base.phy2log).all(axis=1)
    return RebalancePlan(
        placement=Placement(phy2log, num_ranks),
        previous=base,
        replica_counts=counts,
        rank_load=rank_load(phy2log, total, num_ranks),
        imbalance_before=Imbalance.of(rank_load(base.phy2log, total, num_ranks)),
        imbalance_after=Imbalance.of(rank_load(phy2log, total, num_ranks)),
        lower_bound=lower,
        cv_lower_bound=cv_lower,
        moves=rank_moves(base.phy2log, phy2log, num_ranks),
        replanned=np.asarray(kept & replanning, dtype=bool),
        active=active,
        mode="hierarchical" if num_nodes > 1 else "global",
        window_imbalance=tuple(Imbalance.of(loads) for loads in window_rank_loads(phy2log, stack, num_ranks)),
        window_active=tuple(window.sum(axis=1) > 0 for window in stack),
    )


def _plan_nodes(
    shares: FloatArray, total: FloatArray, num_ranks: int, slots_per_rank: int, num_nodes: int, num_groups: int
) -> tuple[IntArray, FloatArray, FloatArray]:
    """Hierarchical: groups to nodes on the mean shares, then every node packed against every window.

    Returns ``(phy2log, busiest-rank floor of the summed load, CV floor of the summed load)``.
    """
    windows, rows, num_experts = shares.shape
    group_size = num_experts // num_groups
    ranks_per_node = num_ranks // num_nodes
    slots_per_node = ranks_per_node * slots_per_rank
    group_node = window_split(shares, num_groups, num_nodes, ranks_per_node, slots_per_node)
    _, cv_floor, peak_floor = choose_groups(total, num_groups, num_nodes, ranks_per_node, slots_per_node)
    expert_node = np.repeat(group_node, group_size, axis=1)
    members = np.argsort(expert_node, axis=1, kind="stable").reshape(rows, num_nodes, -1)  # node's experts by id
    node_shares = np.take_along_axis(shares, members.reshape(1, rows, -1), axis=2).reshape(
        windows, rows * num_nodes, -1
    )
    local, _ = solve_rows_windows(node_shares, ranks_per_node, slots_per_node)
    phy2log: IntArray = np.take_along_axis(members, local.reshape(rows, num_nodes, slots_per_node), axis=2)
    return phy2log.reshape(rows, -1).astype(np.int64), peak_floor, cv_floor


@dataclass
class LoadHistory:
    """A bounded history of per-window expert loads of one engine, oldest first (time is passed in).

    An engine reports a sliding window of routed tokens.  :meth:`observe` starts a new entry when
    ``window_every_s`` has passed since the newest one started, and otherwise refreshes the newest
    with the latest reading, so entries are readings about ``window_every_s`` apart.  A busy engine
    steps through its whole window between entries; a quiet one does not, and its readings overlap.
    With the engine's cumulative counts (``total``) an entry keeps only the part of its reading
    routed after the previous entry's last reading (the tokens routed since, where those are fewer
    than the window's): entries share no token, so a plan made without the newest is judged on
    load it did not see.  A newest entry cut that way counts once the tokens it holds span half of
    ``window_every_s`` (a sliver would weigh as much as a whole window); counts that fall (the
    engine restarted) cut nothing.  Loads are logical (per expert), so they stay valid across
    placement changes; a change of shape (another model) starts the history afresh.
    """

    max_windows: int = 8
    window_every_s: float = 30.0
    _windows: deque[FloatArray] = field(init=False, repr=False)
    _newest_s: float = field(default=float("-inf"), init=False, repr=False)
    _newest_total: FloatArray | None = field(default=None, init=False, repr=False)
    """The engine's cumulative counts at the newest entry's last reading."""
    _base_total: FloatArray | None = field(default=None, init=False, repr=False)
    """The same at the previous entry's last reading: what the newest entry must not hold."""
    _last_s: float = field(default=float("-inf"), init=False, repr=False)
    _base_s: float = field(default=float("-inf"), init=False, repr=False)
    _newest_young: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_windows < 1:
            raise ValidationError(f"max_windows must be >= 1, got {self.max_windows}")
        self._windows = deque(maxlen=self.max_windows)

    def observe(self, now_s: float, expert_tokens: npt.ArrayLike, total: npt.ArrayLike | None = None) -> None:
        """One reading: the engine's window of routed tokens and, where it reports them, its totals."""
        load = np.asarray(expert_tokens, dtype=np.float64)
        counts = None if total is None else np.asarray(total, dtype=np.float64)
        if self._windows and self._windows[-1].shape != load.shape:
            self._windows.clear()
        last = self._newest_total
        restarted = last is not None and (counts is None or last.shape != counts.shape or bool((counts < last).any()))
        new_entry = restarted or not self._windows or now_s - self._newest_s >= self.window_every_s
        if new_entry:
            self._base_total = None if restarted else last
            self._newest_s, self._base_s = now_s, self._last_s
        entry, cut = load, False
        if counts is not None and self._base_total is not None:
            since = counts - self._base_total
            if since.sum() < load.sum():  # the window reaches back into the previous entry
                entry, cut = since, True
        if new_entry:
            self._windows.append(entry)
        else:
            self._windows[-1] = entry
        self._newest_total, self._last_s = counts, now_s
        self._newest_young = cut and now_s - self._base_s < self.window_every_s / 2

    @property
    def last_reading_s(self) -> float:
        """When :meth:`observe` last read the engine (-inf: never)."""
        return self._last_s

    def windows(self) -> list[FloatArray]:
        entries = list(self._windows)
        return entries[:-1] if self._newest_young else entries

    def __len__(self) -> int:
        return len(self.windows())


def plan_from_history(
    windows: Sequence[FloatArray], current: Placement, *, config: RebalanceConfig | None = None
) -> tuple[RebalancePlan, HeldOutGain | None]:
    """The plan to apply (every window, re-planned from ``current``) and its out-of-sample prediction.

    With two windows or more, a second plan is made without the latest window and scored,
    against ``current``, on that window (:func:`~controller.rebalance.out_of_sample.held_out_gain`):
    the gain a plan makes on load it did not see, which the trigger judges.  None with one window.
    """
    def plan(some: Sequence[FloatArray]) -> RebalancePlan:
        return plan_over_windows(some, num_ranks=current.num_ranks, slots_per_rank=current.slots_per_rank,
                                 previous=current, config=config)

    if len(windows) < 2:
        return plan(windows), None
    blind = plan(windows[:-1])
    return plan(windows), held_out_gain(current.phy2log, blind.placement.phy2log, windows[-1], current.num_ranks)
