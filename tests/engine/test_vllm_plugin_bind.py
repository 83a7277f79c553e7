"""Binding the plugin inside a vLLM worker: the rows each data-parallel rank counts, and a bind that fails."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.vllm_plugin import PluginSettings, PluginState, bind_model
from engine.vllm_plugin.binding import LabelProbe, VllmLabels
from tests.engine.test_vllm_plugin_units import _ListSink, _Model

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
