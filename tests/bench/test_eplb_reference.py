"""The EPLB reimplementation used as the benchmark baseline gives valid placements, and ours is no worse."""

from __future__ import annotations

import numpy as np
import pytest

from contracts.imbalance import max_over_mean, rank_load
from controller.rebalance import plan_rebalance

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("groups", "nodes"), [(1, 1), (4, 2)])
def test_eplb_reference_is_valid_and_not_better_than_ours(groups: int, nodes: int) -> None:
    from bench.eplb_reference import rebalance_experts

    rng = np.random.default_rng(11)
    load = rng.pareto(1.1, (6, 32)) * 100 + 1
    phy2log, log2phy, logcnt = rebalance_experts(torch.from_numpy(load), 48, groups, nodes, 8)
    p2l = phy2log.numpy()
    assert p2l.shape == (6, 48)
    counts = np.stack([np.bincount(row, minlength=32) for row in p2l])
    assert (counts >= 1).all() and np.array_equal(counts, logcnt.numpy())
    # log2phy inverts phy2log.
    for layer in range(6):
        for expert in range(32):
            slots = log2phy[layer, expert][log2phy[layer, expert] >= 0].numpy()
            assert (p2l[layer, slots] == expert).all() and slots.size == counts[layer, expert]
    ours = plan_rebalance(load, num_ranks=8, slots_per_rank=6, num_nodes=nodes, num_groups=groups)
    eplb_mom = max_over_mean(rank_load(p2l, load, 8))
    assert ours.imbalance_after.max_over_mean.mean() <= eplb_mom.mean() + 1e-12
    assert ours.imbalance_after.max_over_mean.max() <= eplb_mom.max() + 1e-12
