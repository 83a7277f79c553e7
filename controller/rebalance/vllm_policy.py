"""moeslo's planner behind vLLM's EPLB policy interface (vLLM 0.32, ``vllm.distributed.eplb.policy``).

vLLM calls ``policy.rebalance_experts(weight, num_replicas, num_groups,
num_nodes, num_ranks, old_global_expert_indices)`` at each rearrangement
and moves the expert weights to the ``physical_to_logical_map`` it returns.
:func:`rebalance_phy2log` gives that answer from :func:`plan_rebalance`
with the default policy's semantics:

* hierarchical (expert groups packed to nodes first) when ``num_nodes > 1``
  and the groups divide evenly over the nodes, global otherwise (vLLM's
  default runs its hierarchical code with one node then, which is global);
* given the old map, the plan starts from it and an expert that stays on a
  rank keeps its slot there.  By default it moves experts only where that
  costs no balance (``replan_tolerance`` 0: every layer's busiest rank is
  that of a fresh plan); ``MOESLO_VLLM_EPLB_TOLERANCE`` (e.g. ``0.005``)
  lets the busiest rank be that fraction heavier for far fewer moves;
* never heavier than the policy it replaces: :class:`MoesloEplbPolicy` also
  asks vLLM's ``DefaultEplbPolicy`` and keeps, per layer, whichever plan's
  busiest rank is lighter (:func:`no_heavier_than`).  Our planner puts at
  most one replica of an expert on a rank; where slots, not ranks, are short
  (a skewed load, few spare slots) two copies of a hot expert on one rank
  can balance better, and vLLM's plan wins those layers.

vLLM 0.32's ``EPLBConfig.policy`` accepts only ``"default"``, and
``EplbState.add_model`` looks the class up in ``EPLB_POLICIES`` when the
model loads, after the general plugins ran.  So :func:`register` (the
``vllm.general_plugins`` entry point ``moeslo_eplb_policy``) puts
:class:`MoesloEplbPolicy` under ``EPLB_POLICIES["default"]`` when
``MOESLO_VLLM_EPLB_POLICY=1``; the name stays ``default``, so vLLM's async
EPLB (which rejects other names) keeps working.  The policy is pure and
thread-safe (vLLM's async EPLB calls it from a worker thread).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.errors import PlacementError, ValidationError
from contracts.imbalance import rank_load
from contracts.placement import Placement
from controller.rebalance.moves import align_slots
from controller.rebalance.planner import RebalanceConfig, plan_rebalance

POLICY_ENV = "MOESLO_VLLM_EPLB_POLICY"
"""``1``: vLLM's EPLB rearranges experts with moeslo's planner."""
TOLERANCE_ENV = "MOESLO_VLLM_EPLB_TOLERANCE"
"""Re-plan tolerance (a fraction, default 0): how much heavier than a fresh plan's busiest rank a re-plan may be."""
DEFAULT_CONFIG = RebalanceConfig(replan_tolerance=0.0)

IntArray = npt.NDArray[np.int64]
logger = logging.getLogger("moeslo.vllm_policy")


def is_hierarchical(num_experts: int, num_groups: int, num_nodes: int, num_ranks: int) -> bool:
    """Whether a plan packs expert groups to nodes first (vLLM's condition, plus what makes it well defined)."""
    return (
        num_nodes > 1 and num_groups >= 1 and num_groups % num_nodes == 0
        and num_experts % num_groups == 0 and num_ranks % num_nodes == 0
    )  # fmt: skip


def _previous(old: npt.ArrayLike | None, num_experts: int, num_replicas: int, num_ranks: int) -> Placement | None:
    """The old map as a placement to start from; None when absent or unusable (a fresh plan then)."""
    if old is None:
        return None
    arr = np.asarray(old, dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != num_replicas:
        return None
    placement = Placement(arr, num_ranks)
    try:
        placement.validate(num_layers=arr.shape[0], num_experts=num_experts, num_ranks=num_ranks)
    except PlacementError:
        return None
    return placement


def rebalance_phy2log(
    weight: npt.ArrayLike,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_ranks: int,
    old_global_expert_indices: npt.ArrayLike | None = None,
    *,
    config: RebalanceConfig = DEFAULT_CONFIG,
) -> IntArray:
    """(layers, num_replicas) logical expert of each physical slot, for ``weight`` (layers, logical experts)."""
    load = np.asarray(weight, dtype=np.float64)
    if load.ndim != 2:
        raise ValidationError(f"weight must be layers x logical experts, got shape {load.shape}")
    if num_ranks < 1 or num_replicas % num_ranks:
        raise ValidationError(f"num_replicas {num_replicas} must be a multiple of num_ranks {num_ranks}")
    num_experts = load.shape[1]
    hierarchical = is_hierarchical(num_experts, num_groups, num_nodes, num_ranks)
    previous = _previous(old_global_expert_indices, num_experts, num_replicas, num_ranks)
    if previous is not None and previous.num_layers != load.shape[0]:
        previous = None
    plan = plan_rebalance(
        load, num_ranks=num_ranks, slots_per_rank=num_replicas // num_ranks,
        num_nodes=num_nodes if hierarchical else 1, num_groups=num_groups if hierarchical else 1,
        previous=previous, config=config,
    )  # fmt: skip
    phy2log = plan.placement.phy2log
    if previous is not None:
        phy2log = align_slots(previous.phy2log, phy2log, num_ranks)
    return np.ascontiguousarray(phy2log, dtype=np.int64)


def no_heavier_than(
    ours: IntArray, baseline: IntArray, weight: npt.ArrayLike, num_ranks: int, tolerance: float = 0.0
) -> IntArray:
    """Per layer, ``ours`` unless ``baseline``'s busiest rank is lighter than ours by more than ``tolerance``
    (the re-plan tolerance: ours may be that much heavier for fewer moves); then the baseline's row."""
    load = np.asarray(weight, dtype=np.float64)
    peak = rank_load(ours, load, num_ranks).max(axis=1)
    rival = rank_load(baseline, load, num_ranks).max(axis=1)
    lighter = peak > rival * (1.0 + tolerance) * (1.0 + 1e-12)  # float noise does not swap equal plans
    return np.ascontiguousarray(np.where(lighter[:, None], baseline, ours), dtype=np.int64)


_POLICY_CLASS: list[type[Any]] = []


def policy_class() -> type[Any]:
    """:class:`MoesloEplbPolicy`: a subclass of vLLM's ``AbstractEplbPolicy`` (imports vLLM)."""
    if _POLICY_CLASS:
        return _POLICY_CLASS[0]
    import torch
    from vllm.distributed.eplb.policy.abstract import AbstractEplbPolicy
    from vllm.distributed.eplb.policy.default import DefaultEplbPolicy  # the class, not the registry's entry

    class MoesloEplbPolicy(AbstractEplbPolicy):  # type: ignore[misc]  # vLLM is untyped here
        """moeslo's planner (``controller.rebalance``) as a vLLM EPLB policy, per layer no heavier than vLLM's."""

        config: RebalanceConfig = DEFAULT_CONFIG

        @classmethod
        def rebalance_experts(
            cls,
            weight: torch.Tensor,
            num_replicas: int,
            num_groups: int,
            num_nodes: int,
            num_ranks: int,
            old_global_expert_indices: torch.Tensor | None = None,
        ) -> torch.Tensor:
            old = None if old_global_expert_indices is None else old_global_expert_indices.cpu().numpy()
            load = weight.float().cpu().numpy()
            phy2log = rebalance_phy2log(load, num_replicas, num_groups, num_nodes, num_ranks, old, config=cls.config)
            try:
                theirs = DefaultEplbPolicy.rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks,
                                                             old_global_expert_indices)  # fmt: skip
            except Exception:  # a shape vLLM's policy cannot plan (ours can): ours alone, as it is
                logger.warning("moeslo EPLB policy: vLLM's default policy failed; our plan is used unchecked",
                               exc_info=True)  # fmt: skip
                return torch.from_numpy(phy2log)
            baseline = np.asarray(theirs.cpu().numpy(), dtype=np.int64)
            return torch.from_numpy(no_heavier_than(phy2log, baseline, load, num_ranks, cls.config.replan_tolerance))

    _POLICY_CLASS.append(MoesloEplbPolicy)
    return MoesloEplbPolicy


def enabled(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(POLICY_ENV, "").strip() == "1"


def config_from_env(env: Mapping[str, str] | None = None) -> RebalanceConfig:
    env = os.environ if env is None else env
    raw = env.get(TOLERANCE_ENV, "").strip()
    if not raw:
        return DEFAULT_CONFIG
    try:
        tolerance = float(raw)
    except ValueError:
        tolerance = -1.0
    if not 0.0 <= tolerance < 1.0:
        raise ValidationError(f"{TOLERANCE_ENV}={raw!r} must be a number in [0, 1)")
    return RebalanceConfig(replan_tolerance=tolerance)


def register(env: Mapping[str, str] | None = None) -> bool:
    """The ``vllm.general_plugins`` entry point: our planner under ``EPLB_POLICIES["default"]`` when enabled."""
    if not enabled(env):
        return False
    try:
        config = config_from_env(env)
    except ValidationError as exc:
        logger.error("moeslo EPLB policy not installed: %s", exc)
        return False
    from vllm.distributed.eplb import policy as vllm_policy

    cls = policy_class()
    cls.config = config
    if vllm_policy.EPLB_POLICIES.get("default") is not cls:
        vllm_policy.EPLB_POLICIES["default"] = cls
        logger.info("moeslo: vLLM's EPLB rearranges experts with moeslo's planner (%s=1)", POLICY_ENV)
    return True


__all__ = [
    "DEFAULT_CONFIG",
    "POLICY_ENV",
    "TOLERANCE_ENV",
    "config_from_env",
    "enabled",
    "is_hierarchical",
    "no_heavier_than",
    "policy_class",
    "rebalance_phy2log",
    "register",
]
