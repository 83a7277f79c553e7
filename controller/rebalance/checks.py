"""Checks shared by the planners: inputs that make sense, and placements that keep expert groups in nodes."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from contracts.errors import PlacementError, ValidationError
from contracts.placement import Placement
from controller.rebalance.packing import FloatArray, IntArray


def groups_within_nodes(phy2log: IntArray, group_size: int, num_nodes: int) -> npt.NDArray[np.bool_]:
    """(layers,) True where every expert group's replicas all sit in one node (equal groups per node)."""
    layers, num_slots = phy2log.shape
    node = np.broadcast_to(np.arange(num_slots) // (num_slots // num_nodes), phy2log.shape)
    group = phy2log // group_size
    num_groups = int(group.max(initial=0)) + 1
    lowest = np.full((layers, num_groups), num_nodes)
    highest = np.full((layers, num_groups), -1)
    layer_ids = np.repeat(np.arange(layers), num_slots)
    np.minimum.at(lowest, (layer_ids, group.ravel()), node.ravel())
    np.maximum.at(highest, (layer_ids, group.ravel()), node.ravel())
    one_node = (lowest == highest).all(axis=1)
    balanced = np.array([
        np.all(np.bincount(lowest[layer], minlength=num_nodes) == num_groups // num_nodes) for layer in range(layers)
    ])
    return np.asarray(one_node & balanced, dtype=bool)


LOAD_EXPONENT_LIMIT = 400
"""Loads whose largest entry lies outside ``2**-400 .. 2**400`` are planned scaled (:func:`load_scale_log2`)."""


def load_scale_log2(load: FloatArray) -> int:
    """0, or the power of two that brings the largest entry of ``load`` to [1, 2) where it is outside the range
    of :data:`LOAD_EXPONENT_LIMIT`.

    Loads are relative, and near the ends of float64 their sums overflow (near 1e308) or their
    squares vanish (near 1e-300): the planner's figures would be inf, NaN or 0.  Scaling by a power
    of two is exact, so the plan is the one of any other multiple of the load.
    """
    top = float(load.max(initial=0.0))
    if top <= 0.0:
        return 0
    exponent = math.frexp(top)[1]  # top = m * 2**exponent, 0.5 <= m < 1
    return 0 if -LOAD_EXPONENT_LIMIT < exponent <= LOAD_EXPONENT_LIMIT else 1 - exponent


def validate_plan_inputs(
    load: FloatArray,
    num_ranks: int,
    slots_per_rank: int,
    num_nodes: int,
    num_groups: int,
    previous: Placement | None,
) -> None:
    """Raise ValidationError listing every problem with a planner's inputs."""
    problems: list[str] = []
    if load.ndim != 2 or load.shape[0] < 1 or load.shape[1] < 1:
        raise ValidationError(f"load must be a non-empty layers x experts matrix, got shape {load.shape}")
    if not np.isfinite(load).all():
        problems.append("load has NaN or infinite entries")
    elif (load < 0).any():
        problems.append(f"load must be non-negative, smallest entry is {float(load.min())}")
    layers, num_experts = load.shape
    if num_ranks < 1:
        problems.append(f"num_ranks must be >= 1, got {num_ranks}")
    if slots_per_rank < 1:
        problems.append(f"slots_per_rank must be >= 1, got {slots_per_rank}")
    elif num_ranks >= 1 and num_ranks * slots_per_rank < num_experts:
        problems.append(
            f"{num_ranks} ranks x {slots_per_rank} slots = {num_ranks * slots_per_rank} slots "
            f"cannot hold {num_experts} experts"
        )
    if num_nodes < 1:
        problems.append(f"num_nodes must be >= 1, got {num_nodes}")
    elif num_nodes > 1:
        if num_ranks % num_nodes:
            problems.append(f"{num_ranks} ranks cannot be split evenly over {num_nodes} nodes")
        if num_groups < 1 or num_groups % num_nodes:
            problems.append(f"{num_groups} expert groups cannot be split evenly over {num_nodes} nodes")
        elif num_experts % num_groups:
            problems.append(f"{num_experts} experts cannot be split into {num_groups} equal groups")
    if previous is not None and num_ranks >= 1 and slots_per_rank >= 1:
        if (previous.num_ranks, previous.slots_per_rank) != (num_ranks, slots_per_rank):
            problems.append(f"previous placement is for {previous.num_ranks} ranks x {previous.slots_per_rank} slots "
                            f"per rank, the plan for {num_ranks} x {slots_per_rank}")  # fmt: skip
        elif previous.phy2log.shape != (layers, num_ranks * slots_per_rank):
            problems.append(
                f"previous placement is {previous.phy2log.shape[0]} layers x {previous.phy2log.shape[1]} slots, "
                f"expected {layers} x {num_ranks * slots_per_rank}"
            )
        else:
            try:
                previous.validate(num_layers=layers, num_experts=num_experts, num_ranks=num_ranks)
            except PlacementError as exc:
                problems.extend(f"previous placement: {p}" for p in exc.problems)
    if problems:
        raise ValidationError(problems)


def from_scratch_base(
    layers: int, num_experts: int, num_ranks: int, slots_per_rank: int, num_nodes: int, num_groups: int,
    active: npt.NDArray[np.bool_],
) -> Placement:
    """The placement a plan without a previous one starts from: the contiguous layout, except that with nodes,
    layers without load (which keep it) hold each node's own groups, its spare slots replicating them in turn:
    the contiguous layout's spare slots replicate experts 0, 1, … on the last nodes, outside their group's."""
    base = Placement.contiguous(layers, num_experts, num_ranks, slots_per_rank)
    if num_nodes <= 1:
        return base
    idle = ~active & ~groups_within_nodes(base.phy2log, num_experts // num_groups, num_nodes)
    if not idle.any():
        return base
    per_node = num_experts // num_nodes
    node_rows = Placement.contiguous(1, per_node, num_ranks // num_nodes, slots_per_rank).phy2log[0]
    grouped = np.concatenate([node_rows + node * per_node for node in range(num_nodes)])
    phy2log = base.phy2log.copy()
    phy2log[idle] = grouped
    return Placement(phy2log, num_ranks)
