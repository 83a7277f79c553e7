"""Binding the plugin inside a vLLM worker: the rows each data-parallel rank counts, and a bind that fails."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.vllm_plugin import PluginSettings, PluginState, bind_model
from engine.vllm_plugin.binding import LabelProbe, VllmLabels, find_moe_layers, rank_weights_for
from harness.vllm_server import vllm_python
from tests.engine.test_vllm_plugin_units import _ListSink, _Model

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = PluginSettings(enabled=True, virtual_ep_ranks=4, flush_interval_s=60.0)


def _probed(labels: VllmLabels) -> PluginState:
    """A plugin state whose label probe read ``labels`` while the model was built."""
    state = PluginState()
    state.label_probe = LabelProbe()
    state.label_probe.close()
    state.label_probe.labels = labels
    return state


def test_each_data_parallel_rank_counts_its_own_rows_while_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's config is current only while the model is built: read during a forward pass it was None, and
    every DP rank took rank 0's slot of ``num_tokens_across_dp`` (rank 1 counted rank 0's rows, or nothing)."""
    import engine.vllm_plugin.binding as binding

    ctx = SimpleNamespace(attn_metadata=object(), is_padding=None,
                          dp_metadata=SimpleNamespace(num_tokens_across_dp_cpu=torch.tensor([3, 5])))  # fmt: skip
    monkeypatch.setattr(binding, "is_forward_context_available", lambda: True)
    monkeypatch.setattr(binding, "get_forward_context", lambda: ctx)
    state = _probed(VllmLabels(model_name="m", engine="1", dp_rank=1))
    model = _Model()
    try:
        assert bind_model(model, SETTINGS, _ListSink, state=state)
        assert state.flusher is not None
        ids = torch.tensor([[0, 1]] * 3 + [[2, 3]] * 5)
        model.layers[0].router.capture_fn(ids)  # the router saw every rank's 8 tokens: rank 1's are rows 3..8
        model.layers[0].router.capture_fn(ids[3:])  # the router saw rank 1's own 5 tokens
        snap = state.flusher.flush()
    finally:
        if state.flusher is not None:
            state.flusher.stop()
    assert snap.engine == "1"
    assert snap.expert_tokens_total[0].tolist() == [0, 0, 10, 10, 0, 0, 0, 0]


class _NoExpertCount(_Model):
    """A MoE model whose layers name no expert count (a config without ``num_logical_experts``)."""

    def __init__(self) -> None:
        super().__init__()
        for layer in self.layers:
            del layer.router.global_num_experts
            layer.moe_config = SimpleNamespace(moe_parallel_config=None)


def test_a_model_the_plugin_cannot_read_runs_uninstrumented(caplog: pytest.LogCaptureFixture) -> None:
    """The bind runs inside vLLM's first forward pass: its exception aborted that pass (and vLLM's start)."""
    from engine.vllm_plugin.binding import install_bind_hook

    model = _NoExpertCount()
    state = PluginState()
    handle = install_bind_hook(lambda m: bind_model(m, SETTINGS, _ListSink, state=state))
    try:
        for _ in range(3):
            assert model(torch.randn(4, 8)).shape == (4, 8)
    finally:
        handle.remove()
    assert state.flusher is None and all(layer.router.capture_fn is None for layer in model.layers)
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1, caplog.text
    assert "names no expert count" in errors[0].getMessage() and "num_logical_experts" in errors[0].getMessage()
    assert "without the plugin's counting" in errors[0].getMessage()


def test_the_host_path_drops_ids_past_the_experts_without_sizing_an_array_to_them() -> None:
    """numpy's bincount sizes its output to the largest id: one id of 2**50 asked for 8 PiB."""
    from engine.vllm_plugin import ExpertLoadCounter

    counter = ExpertLoadCounter([0], 4)
    counter.capture(0, torch.tensor([[1, 2**50], [3, -1], [4, 0]], dtype=torch.int64))
    assert counter.snapshot().tolist() == [[1, 1, 0, 1]]


def test_the_stages_of_a_pipeline_count_each_trigger_request_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage answers each trigger request: counted by each, moe_placement_requests_total doubled."""
    import engine.vllm_plugin.worker as worker
    from exporters.vllm_placement import placement_families

    monkeypatch.setattr(worker, "pipeline_parallel_size", lambda: 2)
    snapshots = []
    for rank in (0, 1):
        monkeypatch.setattr(worker, "pipeline_rank", lambda rank=rank: rank)
        state = _probed(VllmLabels(model_name="m", engine="0"))
        try:
            assert bind_model(_Model(), SETTINGS, _ListSink, state=state)
            assert state.flusher is not None
            state.flusher.request("plan", "refused")
            snapshots.append(state.flusher.flush())
        finally:
            if state.flusher is not None:
                state.flusher.stop()
    requests = next(f for f in placement_families(snapshots) if f.name == "moe_placement_requests")
    assert [(s.labels["action"], s.labels["outcome"], s.value) for s in requests.samples] == [("plan", "refused", 1)]


def test_a_pipeline_stage_publishes_the_engines_layer_count_for_the_expert_series_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each stage capped moe_expert_tokens_total on its own layers: under the cap stage by stage, over it
    together, every stage published its series."""
    import engine.vllm_plugin.worker as worker

    counts = []
    for stages, model_layers in ((2, 6), (2, None), (1, 6)):
        monkeypatch.setattr(worker, "pipeline_parallel_size", lambda stages=stages: stages)
        state = _probed(VllmLabels(model_name="m", engine="0", model_layers=model_layers))
        try:
            assert bind_model(_Model(), SETTINGS, _ListSink, state=state)
            assert state.flusher is not None
            counts.append(state.flusher.flush().engine_moe_layers)
        finally:
            if state.flusher is not None:
                state.flusher.stop()
    assert counts == [6, 6, None]  # the model's layers; else 3 MoE layers a stage x 2; one stage: its own


def _ep_model(applied_strategy: str | None) -> _Model:
    """8 experts on 2 EP ranks; ``applied_strategy``: what vLLM's MoERunner says it applied."""
    model = _Model()
    for layer in model.layers:
        layer.moe_config = SimpleNamespace(num_logical_experts=8, num_experts=8,
                                           moe_parallel_config=SimpleNamespace(ep_size=2, use_ep=True))  # fmt: skip
        if applied_strategy is not None:
            layer.expert_placement_strategy = applied_strategy
    return model


def test_the_rank_map_follows_the_placement_vllm_applied_not_the_one_requested() -> None:
    """`--expert-placement-strategy round_robin` on a model without expert groups (Qwen3-MoE, Mixtral): vLLM
    falls back to linear, the gauges still put expert e on rank e % ranks, and the CV read a hot block of
    experts on one rank as balanced."""
    weights, source = rank_weights_for(find_moe_layers(_ep_model("linear")), 8, "round_robin")()
    assert source == "ep" and np.argmax(weights, axis=1).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    weights, _ = rank_weights_for(find_moe_layers(_ep_model("round_robin")), 8, "linear")()
    assert np.argmax(weights, axis=1).tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    weights, _ = rank_weights_for(find_moe_layers(_ep_model(None)), 8, "round_robin")()  # the layer does not say
    assert np.argmax(weights, axis=1).tolist() == [0, 1, 0, 1, 0, 1, 0, 1]


APPLIED_STRATEGY_SCRIPT = """
from types import SimpleNamespace
from vllm.model_executor.layers.fused_moe.expert_map_manager import ExpertMapManager
from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner
parallel = SimpleNamespace(use_ep=True, ep_size=8, ep_rank=0, tp_size=1, tp_rank=0, dp_size=1,
                           use_all2all_kernels=False, needs_round_robin_routing_tables=False)
manager = ExpertMapManager(max_num_batched_tokens=16, top_k=2, global_num_experts=128, num_redundant_experts=0,
                           num_expert_group=None, moe_parallel_config=parallel, placement_strategy="round_robin",
                           enable_eplb=False)
print("applied", MoERunner.expert_placement_strategy.fget(SimpleNamespace(expert_map_manager=manager)))
"""


@pytest.mark.vllm
def test_vllms_moe_runner_says_which_placement_it_applied() -> None:
    """The attribute the plugin reads is vLLM's, and holds the strategy after vLLM's fallback."""
    python = vllm_python()
    if python is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    done = subprocess.run([str(python), "-c", APPLIED_STRATEGY_SCRIPT], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "applied linear" in done.stdout


def test_a_data_parallel_rank_whose_router_saw_every_rank_counts_none_of_its_padding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's naive DP dispatch gathers every rank's padded batch before routing: rank 1 (3 real tokens
    padded to 8) counted its 5 padding rows as routed tokens, on the CPU and on an accelerator alike."""
    import engine.vllm_plugin.binding as binding

    ctx = SimpleNamespace(attn_metadata=object(), is_padding=torch.tensor([False] * 3 + [True] * 5),
                          dp_metadata=SimpleNamespace(num_tokens_across_dp_cpu=torch.tensor([8, 8])))  # fmt: skip
    monkeypatch.setattr(binding, "is_forward_context_available", lambda: True)
    monkeypatch.setattr(binding, "get_forward_context", lambda: ctx)
    topk_ids = torch.zeros((16, 2), dtype=torch.int64)
    assert binding.vllm_row_filter(topk_ids, dp_rank=1) == (8, 11)  # the CPU: a span of the real rows
    assert binding.vllm_row_filter(topk_ids, dp_rank=0) == (0, 3)
    # An accelerator: a mask over the gathered rows, built on the device (no host sync).
    mask = binding.real_rows_mask(16, 8, 16, ctx.is_padding)
    assert torch.nonzero(mask).view(-1).tolist() == [8, 9, 10]
    assert binding.real_rows_mask(8, 0, 8, ctx.is_padding).tolist() == [True] * 3 + [False] * 5


class _DeviceOnly(torch.Tensor):
    """A tensor whose values the host may not read: what a CUDA graph capture needs of the count (the values a
    capture sees are a dummy run's, and a replay runs only the kernels the capture recorded)."""

    def numpy(self, *args: object, **kwargs: object) -> np.ndarray:  # type: ignore[override]
        raise AssertionError("the host read the padding mask")

    def item(self) -> float:  # type: ignore[override]
        raise AssertionError("the host read the padding mask")


def test_a_cuda_graph_capture_records_a_count_that_its_replays_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM captures its piecewise CUDA graphs (prefill and mixed batches, under its default FULL_AND_PIECEWISE)
    without attention metadata, and the plugin skipped that call: the graphs held no count, and the batches
    they replayed were never counted.  Simulated here: the capture is the call under vLLM's capture context,
    a replay the same call after vLLM wrote the step's padding into its persistent mask."""
    import engine.vllm_plugin.binding as binding
    from engine.vllm_plugin import ExpertLoadCounter

    persistent = torch.zeros(16, dtype=torch.bool)  # vLLM's GPUModelRunner.is_padding
    persistent[:] = True  # a capture's dummy run: every row is padding
    ctx = SimpleNamespace(attn_metadata=None, is_padding=persistent[:8].as_subclass(_DeviceOnly), dp_metadata=None,
                          cudagraph_runtime_mode=SimpleNamespace(name="PIECEWISE"))  # fmt: skip
    monkeypatch.setattr(binding, "is_forward_context_available", lambda: True)
    monkeypatch.setattr(binding, "get_forward_context", lambda: ctx)
    counter = ExpertLoadCounter([0], 8, row_filter=binding.vllm_row_filter)
    topk_ids = torch.tensor([[1, 2]] * 3 + [[0, 7]] * 5)
    counter.capture(0, topk_ids)  # the capture: recorded on the device, counting none of the dummy rows
    assert counter.skipped_calls == 0 and counter.snapshot().sum() == 0
    persistent[:3] = False  # a step of 3 real tokens padded to the captured 8
    counter.capture(0, topk_ids)  # a replay
    assert counter.snapshot()[0].tolist() == [0, 3, 3, 0, 0, 0, 0, 0]
    ctx.cudagraph_runtime_mode = SimpleNamespace(name="NONE")  # vLLM's profile and warm-up runs: not counted
    counter.capture(0, topk_ids)
    assert counter.skipped_calls == 1
    ctx.cudagraph_runtime_mode, ctx.is_padding = SimpleNamespace(name="PIECEWISE"), None
    assert binding.vllm_row_filter(topk_ids) is None  # no mask to decide on at replay: none, never every row
