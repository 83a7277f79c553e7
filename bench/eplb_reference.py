"""DeepSeek's EPLB ``rebalance_experts``, reimplemented as the benchmark's baseline.

Algorithm and interface from deepseek-ai/EPLB (``eplb.py``, MIT License,
Copyright (c) 2025 DeepSeek), the policy that vLLM
(``vllm/distributed/eplb``) and SGLang ship.  Written here in torch on the CPU,
step for step as the original, so that its timing is comparable:

1. hierarchical mode (``num_groups % num_nodes == 0``): pack expert groups to
   nodes by greedy balanced packing (equal group count per node);
2. within each node, replicate experts greedily (largest load per replica gets
   the next replica);
3. pack the physical experts of each node onto its GPUs by greedy balanced
   packing (heaviest first, to the lightest GPU with room).

Otherwise the global policy is the same with one group and one node.  Returns
``(phy2log, log2phy, logcnt)`` like the original.
"""

from __future__ import annotations

from typing import Any

import torch


def balanced_packing(weight: torch.Tensor, num_packs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack ``n`` items per row into ``num_packs`` packs of exactly ``n / num_packs`` items.

    Returns ``(pack_index, rank_in_pack)``, both ``[rows, n]``.
    """
    num_layers, num_items = weight.shape
    assert num_items % num_packs == 0
    per_pack = num_items // num_packs
    if per_pack == 1:
        pack_index = torch.arange(num_items, dtype=torch.int64).expand(weight.shape)
        return pack_index, torch.zeros_like(weight, dtype=torch.int64)
    order = weight.float().sort(-1, descending=True).indices.cpu()
    pack_index = torch.full_like(weight, fill_value=-1, dtype=torch.int64, device="cpu")
    rank_in_pack = torch.full_like(pack_index, fill_value=-1)
    for row in range(num_layers):
        pack_weights: list[Any] = [0.0] * num_packs
        pack_items = [0] * num_packs
        for item in order[row]:
            pack = min((p for p in range(num_packs) if pack_items[p] < per_pack), key=pack_weights.__getitem__)
            pack_index[row, item] = pack
            rank_in_pack[row, item] = pack_items[pack]
            pack_weights[pack] += weight[row, item]  # a 0-d tensor, as in the original
            pack_items[pack] += 1
    return pack_index, rank_in_pack


def replicate_experts(weight: torch.Tensor, num_phy: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy replication: each extra physical expert goes to the largest load per replica."""
    rows, num_log = weight.shape
    assert num_phy >= num_log
    phy2log = torch.arange(num_phy, dtype=torch.int64).repeat(rows, 1)
    rank = torch.zeros(rows, num_phy, dtype=torch.int64)
    logcnt = torch.ones(rows, num_log, dtype=torch.int64)
    row_ids = torch.arange(rows, dtype=torch.int64)
    for phy in range(num_log, num_phy):
        hottest = (weight / logcnt).max(dim=-1).indices
        phy2log[:, phy] = hottest
        rank[:, phy] = logcnt[row_ids, hottest]
        logcnt[row_ids, hottest] += 1
    return phy2log, rank, logcnt


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(perm)
    inv.scatter_(1, perm, torch.arange(perm.size(1), dtype=torch.int64).expand(perm.shape))
    return inv


def rebalance_experts_hierarchical(
    weight: torch.Tensor, num_physical_experts: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_layers, num_logical = weight.shape
    assert num_logical % num_groups == 0 and num_groups % num_nodes == 0
    assert num_gpus % num_nodes == 0 and num_physical_experts % num_gpus == 0
    group_size = num_logical // num_groups
    groups_per_node = num_groups // num_nodes
    phy_per_gpu = num_physical_experts // num_gpus

    # Step 1: groups to nodes.
    tokens_per_group = weight.reshape(num_layers, num_groups, group_size).sum(-1)
    group_pack, group_rank = balanced_packing(tokens_per_group, num_nodes)
    log2mlog = (
        ((group_pack * groups_per_node + group_rank) * group_size).unsqueeze(-1)
        + torch.arange(group_size, dtype=torch.int64)
    ).flatten(-2)
    mlog2log = _inverse(log2mlog)

    # Step 2: replicas within each node.
    tokens_per_mlog = weight.gather(-1, mlog2log).view(-1, num_logical // num_nodes)
    phy2mlog, phyrank, mlogcnt = replicate_experts(tokens_per_mlog, num_physical_experts // num_nodes)

    # Step 3: physical experts of each node to its GPUs.
    tokens_per_phy = (tokens_per_mlog / mlogcnt).gather(-1, phy2mlog)
    pack_index, rank_in_pack = balanced_packing(tokens_per_phy, num_gpus // num_nodes)
    phy2pphy = pack_index * phy_per_gpu + rank_in_pack
    pphy2phy = _inverse(phy2pphy)
    pphy2mlog = phy2mlog.gather(-1, pphy2phy)
    pphy2mlog = (
        pphy2mlog.view(num_layers, num_nodes, -1)
        + torch.arange(0, num_logical, num_logical // num_nodes).view(1, -1, 1)
    ).flatten(-2)
    pphy2log = mlog2log.gather(-1, pphy2mlog)
    pphyrank = phyrank.gather(-1, pphy2phy).view(num_layers, -1)
    logcnt = mlogcnt.view(num_layers, -1).gather(-1, log2mlog)
    return pphy2log, pphyrank, logcnt


def rebalance_experts(
    weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EPLB's entry point: ``(phy2log [layers, replicas], log2phy [layers, experts, X], logcnt)``."""
    num_layers, num_logical = weight.shape
    weight = weight.float().cpu()
    if num_groups % num_nodes == 0:
        phy2log, phyrank, logcnt = rebalance_experts_hierarchical(
            weight, num_replicas, num_groups, num_nodes, num_gpus
        )
    else:
        phy2log, phyrank, logcnt = rebalance_experts_hierarchical(weight, num_replicas, 1, 1, num_gpus)
    max_count = int(logcnt.max().item())
    log2phy = torch.full((num_layers, num_logical, max_count), -1, dtype=torch.int64)
    log2phy.view(num_layers, -1).scatter_(
        -1, phy2log * max_count + phyrank, torch.arange(num_replicas, dtype=torch.int64).expand(num_layers, -1)
    )
    return phy2log, log2phy, logcnt
