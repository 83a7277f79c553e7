"""A stand-in for vLLM's ``EplbState`` (the attributes and calls the trigger uses) and a counting plugin, no vLLM."""

from __future__ import annotations

import types
from typing import Any, ClassVar

import numpy as np
import torch

from controller.rebalance.vllm_policy import rebalance_phy2log
from engine.vllm_plugin import ExpertLoadCounter, Flusher, SnapshotBuilder, eplb_rank_weights
from engine.vllm_plugin.eplb_control import VllmEnv

LAYERS, EXPERTS, SLOTS, RANKS = 2, 8, 10, 2


class PlannerPolicy:
    """What vLLM's policy classes look like: a classmethod ``rebalance_experts``."""

    calls: ClassVar[list[tuple[Any, ...]]] = []

    @classmethod
    def rebalance_experts(cls, weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int,
                          num_ranks: int, old: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        cls.calls.append((tuple(weight.shape), num_replicas, num_groups, num_nodes, num_ranks))
        return torch.from_numpy(rebalance_phy2log(weight.numpy(), num_replicas, num_groups, num_nodes, num_ranks,
                                                  None if old is None else old.numpy()))  # fmt: skip


class StandinEplbState:
    """vLLM's ``EplbState`` as far as the trigger sees it; ``rearrange`` asks the policy and commits its map."""

    def __init__(self) -> None:
        p2l = torch.tensor(np.tile(np.arange(SLOTS) % EXPERTS, (LAYERS, 1)), dtype=torch.int64)
        model = types.SimpleNamespace(num_physical_experts=SLOTS, num_local_physical_experts=SLOTS // RANKS,
                                      num_logical_experts=EXPERTS, num_expert_groups=1,
                                      num_redundant_experts=SLOTS - EXPERTS)  # fmt: skip
        self.model_state = types.SimpleNamespace(physical_to_logical_map=p2l, model=model,
                                                 last_expert_load=torch.ones((LAYERS, EXPERTS), dtype=torch.int64))
        self.model_states = {"m": self.model_state}
        self.policy: Any = PlannerPolicy
        self.is_async = False
        self.expert_rearrangement_step = 750
        self.expert_rearrangement_step_interval = 1000
        self.expert_load_window_size = 32
        self.rearranged_with: list[str] = []

    def _update_layer_should_record(self) -> None:
        return None

    def step(self) -> None:
        """One engine step (synchronous EPLB commits within ``rearrange``: nothing to do)."""
        return None

    def rearrange(self, use_last_expert_load: bool = False) -> None:
        ms = self.model_state
        self.rearranged_with.append(self.policy.__name__)
        new = self.policy.rebalance_experts(ms.last_expert_load, SLOTS, 1, 1, RANKS, ms.physical_to_logical_map)
        ms.physical_to_logical_map.copy_(new)

    def l2p(self) -> np.ndarray:
        """(layers, experts, max replicas) with -1 padding, as EplbState keeps it."""
        p2l = self.model_state.physical_to_logical_map.numpy()
        out = np.full((LAYERS, EXPERTS, SLOTS - EXPERTS + 1), -1, dtype=np.int64)
        for layer in range(LAYERS):
            for expert in range(EXPERTS):
                slots = np.flatnonzero(p2l[layer] == expert)
                out[layer, expert, : slots.size] = slots
        return out


class AsyncStandinEplbState(StandinEplbState):
    """vLLM 0.32's async EPLB (its default, ``use_async=True``; ``eplb_state.py``): ``rearrange`` only records the
    load and flags the model (``rebalanced``); vLLM's worker thread asks the policy, and the steps after commit the
    new map one layer per step (``_move_to_workspace``), the last clearing the flag."""

    def __init__(self) -> None:
        super().__init__()
        self.is_async = True
        self.model_state.rebalanced = False
        self._new: torch.Tensor | None = None
        self._layer = 0

    def rearrange(self, use_last_expert_load: bool = False) -> None:
        self.model_state.rebalanced = True

    def step(self) -> None:
        """One engine step: the worker thread's plan (first step), then the next layer's map committed."""
        ms = self.model_state
        if not ms.rebalanced:
            return
        if self._new is None:
            self.rearranged_with.append(self.policy.__name__)
            self._new = self.policy.rebalance_experts(ms.last_expert_load, SLOTS, 1, 1, RANKS,
                                                      ms.physical_to_logical_map.clone())  # fmt: skip
            self._layer = 0
        ms.physical_to_logical_map[self._layer].copy_(self._new[self._layer])
        self._layer += 1
        if self._layer == LAYERS:
            ms.rebalanced, self._new = False, None


class StandinEnv(VllmEnv):
    def default_policy(self) -> Any:
        return PlannerPolicy

    def node_count(self, num_ranks: int) -> int:
        return 1

    def ep_rank(self) -> int:
        return 0


def runner(
    state: StandinEplbState | None, data_parallel_size: int = 1, pipeline_parallel_size: int = 1
) -> types.SimpleNamespace:
    parallel = types.SimpleNamespace(data_parallel_size=data_parallel_size,
                                     pipeline_parallel_size=pipeline_parallel_size)
    return types.SimpleNamespace(eplb_state=state, parallel_config=parallel)


def counting_flusher(state: StandinEplbState | None) -> tuple[Flusher, ExpertLoadCounter, list[Any]]:
    """The plugin's counting half (no thread): rank weights from the state's map, or a 2-rank contiguous layout."""
    from engine.vllm_plugin import contiguous_rank_weights

    def weights() -> tuple[np.ndarray, str]:
        if state is None:
            return contiguous_rank_weights(EXPERTS, RANKS), "virtual"
        l2p = state.l2p()
        return np.stack([eplb_rank_weights(l2p[i], SLOTS, RANKS) for i in range(LAYERS)]), "eplb"

    counter = ExpertLoadCounter(list(range(LAYERS)), EXPERTS)
    published: list[Any] = []
    builder = SnapshotBuilder(model_name="m", engine="0", layer_ids=counter.layer_ids, window_flushes=100,
                              rank_weights=weights)  # fmt: skip
    flusher = Flusher(counter, builder, types.SimpleNamespace(publish=published.append), interval_s=60)
    return flusher, counter, published


def route(counter: ExpertLoadCounter, hot: tuple[int, ...] = (2, 3), tokens: int = 200) -> None:
    """Skewed routing: the hot experts (both on rank 0 in the initial map) get most of the tokens."""
    rng = np.random.default_rng(len(hot) + tokens)
    p = np.full(EXPERTS, 1.0)
    p[list(hot)] = 8.0
    for layer in range(LAYERS):
        ids = rng.choice(EXPERTS, size=(tokens, 2), p=p / p.sum())
        counter.capture(layer, torch.from_numpy(ids.astype(np.int32)))
