"""Expert weights of one EP rank, replica selection, and placement transfers.

A rank holds ``slots_per_rank`` physical slots per MoE layer; slot ``s`` of
the placement lives on rank ``s // slots_per_rank``.  A logical expert with
several replicas has its tokens split among them in turn (the driver's
:class:`ReplicaTable` picks each assignment's slot and the ranks follow it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from contracts.placement import Placement
from engine.checkpoint import CheckpointReader, expert_tensor_name
from engine.config import ModelConfig

ExpertWeights = tuple[torch.Tensor, torch.Tensor]
"""(gate_up (2I, H), down (H, I)) of one expert, in the checkpoint's (out, in) layout."""


def load_expert(reader: CheckpointReader, layer: int, expert: int) -> ExpertWeights:
    hidden, inter = reader.config.hidden_size, reader.config.moe_intermediate_size
    gate = reader.get(expert_tensor_name(layer, expert, "gate_proj"), (inter, hidden))
    up = reader.get(expert_tensor_name(layer, expert, "up_proj"), (inter, hidden))
    down = reader.get(expert_tensor_name(layer, expert, "down_proj"), (hidden, inter))
    return torch.cat([gate, up], dim=0), down


class ReplicaTable:
    """Per MoE layer: logical expert -> its physical slots, as lookup tensors."""

    def __init__(self, placement: Placement, num_experts: int) -> None:
        counts = placement.replica_counts(num_experts)
        width = int(counts.max())
        self.counts = torch.from_numpy(counts)
        table = np.zeros((placement.num_layers, num_experts, width), dtype=np.int64)
        for layer in range(placement.num_layers):
            fill = np.zeros(num_experts, dtype=np.int64)
            for slot, expert in enumerate(placement.phy2log[layer]):
                table[layer, expert, fill[expert]] = slot
                fill[expert] += 1
        self.log2phy = torch.from_numpy(table)
        self.single_replica = bool(width == 1)
        self._done = torch.zeros((placement.num_layers, num_experts), dtype=torch.long)
        """Per (layer, expert): its assignments so far under this placement."""

    def physical(self, layer: int, expert_ids: torch.Tensor) -> torch.Tensor:
        """Physical slot for each (token, k) assignment of ``expert_ids`` (T, k).

        An expert's assignments take its replicas in turn, carrying on where the
        layer's previous call left off, so even one decoding sequence splits
        each expert's tokens evenly over its replicas in every layer.
        """
        table = self.log2phy[layer]
        if self.single_replica:
            return table[expert_ids, 0]
        flat = expert_ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=table.shape[0])
        done = self._done[layer]
        # An assignment's turn: the expert's tokens before it in this call plus those of earlier calls.
        starts = torch.cumsum(counts, 0) - counts - done
        turn = torch.empty_like(flat)
        turn[order] = torch.arange(flat.shape[0]) - starts[flat[order]]
        done += counts
        replica = turn % self.counts[layer][flat]
        return table[flat, replica].reshape(expert_ids.shape)


class ExpertShard:
    """The expert slots of one rank, for every MoE layer."""

    def __init__(
        self,
        config: ModelConfig,
        placement: Placement,
        rank: int,
        load: Callable[[int, int], ExpertWeights],
    ) -> None:
        """``load(moe_layer_index, expert)`` returns one expert's weights."""
        self.config = config
        self.rank = rank
        self.placement = placement
        self.w13: list[torch.Tensor] = []
        self.w2: list[torch.Tensor] = []
        for layer in range(placement.num_layers):
            cache: dict[int, ExpertWeights] = {}
            for expert in placement.experts_on_rank(layer, rank).tolist():
                if expert not in cache:
                    cache[expert] = load(layer, expert)
            w13, w2 = self._build_layer(layer, placement, cache)
            self.w13.append(w13)
            self.w2.append(w2)

    def _build_layer(self, layer: int, placement: Placement, source: dict[int, ExpertWeights]) -> ExpertWeights:
        experts = placement.experts_on_rank(layer, self.rank).tolist()
        # Stored (slots, in, out), so a slot's matmul reads its weight rows in order.
        w13 = torch.stack([source[e][0].t() for e in experts]).contiguous()
        w2 = torch.stack([source[e][1].t() for e in experts]).contiguous()
        return w13, w2

    def weights_of(self, layer: int, expert: int) -> ExpertWeights:
        """Weights of a logical expert this rank holds (its first local replica)."""
        local = self.placement.experts_on_rank(layer, self.rank).tolist().index(expert)
        return self.w13[layer][local].t(), self.w2[layer][local].t()

    def compute(
        self,
        layer: int,
        x: torch.Tensor,
        weights: torch.Tensor,
        physical: torch.Tensor,
        out: torch.Tensor,
        counts: torch.Tensor | None = None,
    ) -> None:
        """Add this rank's share of the expert outputs into ``out``.

        ``counts`` (assignments per physical slot, all ranks' slots) may be passed when the caller has it.
        The assignments are sorted by slot and computed as one grouped GEMM pair over the slots
        (:func:`grouped_swiglu`).
        """
        spr = self.placement.slots_per_rank
        top_k = physical.shape[1]
        if self.placement.num_ranks == 1:
            flat_slot = physical.reshape(-1)
            order = torch.argsort(flat_slot, stable=True)
            token = torch.div(order, top_k, rounding_mode="floor")
            flat_weight = weights.reshape(-1)[order]
            if counts is None:
                counts = torch.bincount(flat_slot, minlength=spr)
        else:
            local = physical - self.rank * spr
            mask = (local >= 0) & (local < spr)
            pairs = mask.nonzero()
            if pairs.shape[0] == 0:
                return
            flat_slot = local[mask]
            order = torch.argsort(flat_slot, stable=True)
            token = pairs[:, 0][order]
            flat_weight = weights[mask][order]
            counts = torch.bincount(flat_slot, minlength=spr)
        ys = grouped_swiglu(x[token], self.w13[layer], self.w2[layer], counts[:spr])
        ys *= flat_weight.unsqueeze(1)
        out.index_add_(0, token, ys)

    def prepare(self, new: Placement, received: dict[tuple[int, int], ExpertWeights]) -> list[ExpertWeights]:
        """The slots of every layer under ``new``, built aside from local and ``received`` weights."""
        layers = []
        for layer in range(new.num_layers):
            source: dict[int, ExpertWeights] = {}
            for expert in set(new.experts_on_rank(layer, self.rank).tolist()):
                if (layer, expert) in received:
                    source[expert] = received[(layer, expert)]
                else:
                    source[expert] = self.weights_of(layer, expert)
            layers.append(self._build_layer(layer, new, source))
        return layers

    def commit(self, new: Placement, layers: list[ExpertWeights]) -> None:
        """Switch to ``new`` in one step, so a failure before it leaves the old slots whole."""
        self.w13, self.w2, self.placement = [w for w, _ in layers], [w for _, w in layers], new


GROUPED_MM_MAX_ROWS = 1024
"""Up to this many assignments, one grouped GEMM kernel; above (prefill), a GEMM per slot with tokens."""


def grouped_swiglu(xs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """SwiGLU experts over rows sorted by slot: rows ``sum(counts[:s])..`` go through slot ``s``.

    ``w13`` is (slots, hidden, 2*inter), ``w2`` (slots, inter, hidden).  Decode-sized batches use
    ``torch._grouped_mm`` (one kernel for every slot, no host sync); prefill-sized ones loop over
    the slots that have rows, where a GEMM per slot is big enough to amortize the loop.
    """
    if xs.shape[0] <= GROUPED_MM_MAX_ROWS:
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        gate, up = torch._grouped_mm(xs, w13, offs=offsets).chunk(2, dim=-1)
        return torch._grouped_mm(F.silu(gate) * up, w2, offs=offsets)
    ys = torch.empty_like(xs)
    start = 0
    for slot, count in enumerate(counts.tolist()):
        if count == 0:
            continue
        end = start + count
        gate, up = (xs[start:end] @ w13[slot]).chunk(2, dim=-1)
        ys[start:end] = (F.silu(gate) * up) @ w2[slot]
        start = end
    return ys


@dataclass(frozen=True, slots=True)
class Transfer:
    """One expert's weights going from one rank to another."""

    layer: int
    expert: int
    src: int
    dst: int


def plan_transfers(old: Placement, new: Placement) -> list[Transfer]:
    """Weights that must change rank to go from ``old`` to ``new``, in one order every rank agrees on.

    Only experts a rank does not hold yet travel; the source is one of the
    ranks that already holds it, chosen to spread sends.
    """
    transfers: list[Transfer] = []
    for layer in range(new.num_layers):
        holders: dict[int, list[int]] = {}
        for rank in range(old.num_ranks):
            for expert in set(old.experts_on_rank(layer, rank).tolist()):
                holders.setdefault(expert, []).append(rank)
        for dst in range(new.num_ranks):
            have = set(old.experts_on_rank(layer, dst).tolist())
            for expert in sorted(set(new.experts_on_rank(layer, dst).tolist()) - have):
                sources = holders[expert]
                transfers.append(Transfer(layer, expert, sources[(expert + dst) % len(sources)], dst))
    return transfers
