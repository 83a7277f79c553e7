"""Our planner behind vLLM's EPLB policy interface, without vLLM: the semantics of ``rebalance_experts``."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.errors import ValidationError
from contracts.imbalance import max_over_mean, rank_load
from controller.rebalance import RebalanceConfig
from controller.rebalance.vllm_policy import (
    DEFAULT_CONFIG,
    config_from_env,
    enabled,
    is_hierarchical,
    rebalance_phy2log,
    register,
)

RNG = np.random.default_rng(0)
LOAD = RNG.zipf(1.6, size=(3, 16)).astype(np.float64)


def _covers(phy2log: np.ndarray, experts: int) -> bool:
    return all(set(row.tolist()) == set(range(experts)) for row in phy2log)


def test_fresh_plan_has_vllm_shape_and_covers_every_expert() -> None:
    plan = rebalance_phy2log(LOAD, 20, 1, 1, 4)
    assert plan.shape == (3, 20) and plan.dtype == np.int64 and _covers(plan, 16)
    contiguous = np.tile(np.arange(20) % 16, (3, 1))
    assert (max_over_mean(rank_load(plan, LOAD, 4)) <= max_over_mean(rank_load(contiguous, LOAD, 4)) + 1e-12).all()


def test_hierarchical_only_when_groups_divide_nodes() -> None:
    assert is_hierarchical(16, 4, 2, 4)
    assert not is_hierarchical(16, 1, 2, 4)  # one group cannot spread over two nodes: global, as vLLM falls back
    assert not is_hierarchical(16, 4, 1, 4)  # one node: global
    plan = rebalance_phy2log(LOAD, 16, 4, 2, 4)
    # Hierarchical: each expert group's replicas stay within one node (8 slots per node).
    for row in plan:
        for node in range(2):
            groups = set((row[node * 8:(node + 1) * 8] // 4).tolist())
            assert len(groups) == 2
    assert _covers(rebalance_phy2log(LOAD, 16, 1, 2, 4), 16)  # the global fallback


def test_replan_keeps_slots_of_experts_that_stay_on_their_rank() -> None:
    old = rebalance_phy2log(LOAD, 20, 1, 1, 4)
    shifted = LOAD.copy()
    shifted[:, 0] *= 3
    new = rebalance_phy2log(shifted, 20, 1, 1, 4, old)
    assert _covers(new, 16)
    for layer in range(3):
        for rank in range(4):
            span = slice(rank * 5, (rank + 1) * 5)
            stay = set(old[layer, span].tolist()) & set(new[layer, span].tolist())
            for expert in stay:  # an expert that stays on a rank keeps (one of) its slot(s) there
                old_slots = set(np.flatnonzero(old[layer, span] == expert).tolist())
                new_slots = set(np.flatnonzero(new[layer, span] == expert).tolist())
                assert old_slots & new_slots
    # Balance first (tolerance 0): no worse than a fresh plan's busiest rank.
    fresh = rebalance_phy2log(shifted, 20, 1, 1, 4)
    peak = rank_load(new, shifted, 4).max(axis=1)
    assert (peak <= rank_load(fresh, shifted, 4).max(axis=1) * (1 + 1e-9)).all()


def test_zero_load_keeps_the_old_map_and_a_bad_old_map_is_ignored() -> None:
    old = np.tile(np.arange(20) % 16, (3, 1))[:, ::-1].copy()
    assert np.array_equal(rebalance_phy2log(np.zeros((3, 16)), 20, 1, 1, 4, old), old)
    broken = np.zeros((3, 20), dtype=np.int64)  # experts missing: a fresh plan instead
    assert _covers(rebalance_phy2log(LOAD, 20, 1, 1, 4, broken), 16)


def test_bad_arguments_are_validation_errors() -> None:
    with pytest.raises(ValidationError, match="multiple of num_ranks"):
        rebalance_phy2log(LOAD, 18, 1, 1, 4)
    with pytest.raises(ValidationError, match="layers x logical experts"):
        rebalance_phy2log(np.ones(16), 16, 1, 1, 4)


def test_settings_come_from_the_environment() -> None:
    assert not enabled({}) and enabled({"MOESLO_VLLM_EPLB_POLICY": "1"})
    assert config_from_env({}) is DEFAULT_CONFIG and DEFAULT_CONFIG.replan_tolerance == 0.0
    assert config_from_env({"MOESLO_VLLM_EPLB_TOLERANCE": "0.005"}) == RebalanceConfig(replan_tolerance=0.005)
    with pytest.raises(ValidationError, match=r"MOESLO_VLLM_EPLB_TOLERANCE='x' must be a number in \[0, 1\)"):
        config_from_env({"MOESLO_VLLM_EPLB_TOLERANCE": "x"})
    assert register({}) is False  # disabled: vLLM is never imported
