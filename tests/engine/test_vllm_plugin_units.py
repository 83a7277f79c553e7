"""The vLLM plugin's pure parts: settings, rank maps, counting, windows, binding to a router seam."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from contracts.errors import ValidationError
from contracts.imbalance import balancedness, imbalance_cv
from engine.vllm_plugin import (
    ExpertLoadCounter,
    ExpertLoadSnapshot,
    LoadWindow,
    PluginSettings,
    PluginState,
    SnapshotBuilder,
    bind_model,
    contiguous_rank_weights,
    count_all_rows,
    eplb_rank_weights,
    rank_loads,
)
from engine.vllm_plugin.binding import find_moe_layers, install_bind_hook
from engine.vllm_plugin.snapshot import Rearrangement
from exporters.vllm_metrics import snapshot_families


def test_settings_default_off_and_gather_every_problem() -> None:
    assert PluginSettings.from_env({}).enabled is False
    on = PluginSettings.from_env({"MOESLO_VLLM_PLUGIN": "1", "MOESLO_VLLM_EP_RANKS": "4", "MOESLO_VLLM_FLUSH_S": "0.5",
                                  "MOESLO_VLLM_WINDOW_S": "10"})
    assert (on.enabled, on.virtual_ep_ranks, on.flush_interval_s, on.window_flushes) == (True, 4, 0.5, 20)
    with pytest.raises(ValidationError) as err:
        PluginSettings.from_env({"MOESLO_VLLM_EP_RANKS": "x", "MOESLO_VLLM_FLUSH_S": "-1"})
    assert "MOESLO_VLLM_EP_RANKS='x' is not an integer" in str(err.value)
    assert "MOESLO_VLLM_FLUSH_S='-1' must be between 0.1 and 60 seconds" in str(err.value)
    told = PluginSettings.from_env({"MOESLO_TTFT_ALLOWANCES": "2000:0.1"}).ttft_allowances
    assert [a.labels()["reference_prompt_tokens"] for a in told] == ["1000", "2000"]
    with pytest.raises(ValidationError, match="MOESLO_TTFT_ALLOWANCES: TTFT allowance '2000' must read"):
        PluginSettings.from_env({"MOESLO_TTFT_ALLOWANCES": "2000"})


@pytest.mark.parametrize("raw", ["0.001", "0.09", "60.5", "1e10", "0", "nan", "inf"])
def test_a_flush_interval_outside_its_range_is_a_bad_setting(raw: str) -> None:
    """1 ms flooded the worker with snapshots (and a 60 s window with 60,000 slots); 1e10 s overflowed the
    flush thread's wait, which then died without a word."""
    with pytest.raises(ValidationError) as err:
        PluginSettings.from_env({"MOESLO_VLLM_PLUGIN": "1", "MOESLO_VLLM_FLUSH_S": raw})
    assert err.value.problems == (f"MOESLO_VLLM_FLUSH_S={raw!r} must be between 0.1 and 60 seconds",)


def test_the_flush_interval_range_includes_its_ends() -> None:
    for raw, flush_s in (("0.1", 0.1), ("60", 60.0), ("0.25", 0.25)):
        assert PluginSettings.from_env({"MOESLO_VLLM_FLUSH_S": raw}).flush_interval_s == flush_s


def test_the_plugin_switch_reads_the_words_the_other_switches_read_and_refuses_the_rest() -> None:
    for word, enabled in (("true", True), ("ON", True), ("1", True), ("off", False), ("0", False), ("", False)):
        assert PluginSettings.from_env({"MOESLO_VLLM_PLUGIN": word}).enabled is enabled, word
    for typo in ("yes", "auto", "2"):
        with pytest.raises(ValidationError, match=f"MOESLO_VLLM_PLUGIN='{typo}' is not 1 or 0"):
            PluginSettings.from_env({"MOESLO_VLLM_PLUGIN": typo})


def test_contiguous_layout_matches_vllm_expert_map() -> None:
    # vLLM: rank r holds base + (r < rem) experts starting at r*base + min(r, rem).
    w = contiguous_rank_weights(10, 4)
    assert w.sum(axis=1).tolist() == [1.0] * 10
    assert w.sum(axis=0).tolist() == [3.0, 3.0, 2.0, 2.0]
    assert np.argmax(w, axis=1).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 3, 3]
    rr = contiguous_rank_weights(6, 4, "round_robin")
    assert np.argmax(rr, axis=1).tolist() == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValidationError, match="unknown expert placement strategy"):
        contiguous_rank_weights(4, 2, "zigzag")


def test_eplb_weights_split_replicas_evenly() -> None:
    # 3 experts, 4 slots on 2 ranks; expert 0 has replicas in slots 0 and 3.
    l2p = [[0, 3], [1, -1], [2, -1]]
    w = eplb_rank_weights(l2p, num_physical=4, num_ranks=2)
    assert w.tolist() == [[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]]
    loads = rank_loads([[10, 4, 6]], w)
    assert loads.tolist() == [[9.0, 11.0]]


def test_counter_counts_kept_rows_and_drops_invalid_ids() -> None:
    def no_padding_after_two(ids: torch.Tensor) -> torch.Tensor:
        keep = torch.zeros(ids.shape[0], dtype=torch.bool)
        keep[:2] = True
        return keep

    counter = ExpertLoadCounter([3, 1], 4, row_filter=no_padding_after_two)
    counter.capture(1, torch.tensor([[0, 1], [1, 2], [3, 3]], dtype=torch.int32))
    counter.capture(3, torch.tensor([[2, -1], [9, 0]]))
    assert counter.layer_ids == (1, 3)
    assert counter.snapshot().tolist() == [[1, 2, 1, 0], [1, 0, 1, 0]]
    skip = ExpertLoadCounter([0], 4, row_filter=lambda ids: None)
    skip.capture(0, torch.tensor([[1, 2]]))
    assert skip.snapshot().sum() == 0 and skip.skipped_calls == 1


def test_window_forgets_old_flushes() -> None:
    window = LoadWindow(2)
    a, b, c = (np.full((1, 2), v, dtype=np.int64) for v in (1, 10, 100))
    assert window.add(a).tolist() == [[1, 1]]
    assert window.add(b).tolist() == [[11, 11]]
    assert window.add(c).tolist() == [[110, 110]]


def test_a_window_of_more_flushes_than_slots_keeps_several_flushes_to_a_slot() -> None:
    """Each slot is a layers x experts array in every worker: a day of 1 s flushes is 86,400 of them
    unless flushes share slots."""
    day = LoadWindow(86_400)
    assert (day.flushes_per_slot, day.slots) == (87, 994)
    window = LoadWindow(6, max_slots=3)
    ones = np.ones((1, 2), dtype=np.int64)
    sums = [int(window.add(ones * (i + 1))[0, 0]) for i in range(10)]
    # Slots of two flushes; past three slots the oldest goes whole: 1+..+6, then 3+..+7 and 3+..+8, ...
    assert sums == [1, 3, 6, 10, 15, 21, 25, 33, 35, 45]
    assert len(window._deltas) == 3 and window.active_flushes == 6
    window.add(ones * 0, new_slot=False)  # a trigger request's flush joins the newest slot
    assert window.active_flushes == 6


def test_flushes_between_the_periodic_ones_do_not_shorten_the_window() -> None:
    """A controller polling /moeslo/eplb each second flushed each time; counted per flush, a burst left a
    60 s window after 30 s."""
    window = LoadWindow(3)
    burst, quiet = np.full((1, 2), 100, dtype=np.int64), np.zeros((1, 2), dtype=np.int64)
    window.add(burst)
    for _ in range(10):  # trigger requests within the same interval
        assert window.add(quiet, new_slot=False).tolist() == [[100, 100]]
    assert window.add(quiet).tolist() == [[100, 100]]
    assert window.add(quiet).tolist() == [[100, 100]]
    assert window.add(quiet).tolist() == [[0, 0]]  # three periodic intervals later: gone


def test_snapshot_builder_and_json_round_trip() -> None:
    weights = contiguous_rank_weights(4, 2)
    builder = SnapshotBuilder(model_name="m", engine="0", layer_ids=(0, 1), window_flushes=1,
                              rank_weights=lambda: (weights, "virtual"))
    builder.build(np.array([[4, 0, 0, 0], [1, 1, 1, 1]]))
    snap = builder.build(np.array([[4, 0, 2, 2], [2, 2, 2, 2]]))
    # Window of one flush: the last delta only ([0,0,2,2] and [1,1,1,1]).
    assert snap.window_rank_tokens.tolist() == [[0.0, 4.0], [2.0, 2.0]]
    assert snap.imbalance_cv.tolist() == imbalance_cv([[0, 4], [2, 2]]).tolist()
    assert snap.balancedness.tolist() == balancedness([[0, 4], [2, 2]]).tolist()
    assert snap.rank_tokens_total.tolist() == [8.0, 8.0]
    back = ExpertLoadSnapshot.from_json(snap.to_json())
    assert back.layer_ids == (0, 1) and back.expert_tokens_total.tolist() == snap.expert_tokens_total.tolist()
    assert back.rank_source == "virtual"


def test_a_rearrangement_vllm_makes_itself_restarts_the_window_and_counts_once() -> None:
    """vLLM's periodic EPLB rearrangements moved the rank map under the window: its old routing was re-read on the new
    map, and the measured CV fell at once to the plan's in-sample figure with no token routed on the new placement."""
    maps = {"now": np.stack([contiguous_rank_weights(4, 2)] * 2)}
    builder = SnapshotBuilder(model_name="m", engine="0", layer_ids=(0, 1), window_flushes=10,
                              rank_weights=lambda: (maps["now"], "eplb"))  # fmt: skip
    routed = np.array([[60, 20, 10, 10], [60, 20, 10, 10]], dtype=np.int64)
    counts = routed.copy()
    assert builder.build(counts).window_rank_tokens.sum() == 200 and builder.placement_log is None

    def commit(layer: int) -> ExpertLoadSnapshot:
        """vLLM's async EPLB commits one layer per step: the experts of rank 0 and rank 1 trade places."""
        maps["now"] = maps["now"].copy()
        maps["now"][layer] = maps["now"][layer][:, ::-1]
        return builder.build(counts)

    first = commit(0)
    assert first.window_rank_tokens.sum() == 0  # routing on the old map is not the new map's
    assert first.placement is not None and first.placement["swaps"] == 1 and first.placement["experts_moved"] == 4
    assert first.placement["balance"]["measured_before"]["cv_max"] > 0.5
    counts = counts + routed  # a flush between the layers' steps: routed on a half-committed map
    assert builder.build(counts).placement["swaps"] == 1  # type: ignore[index]
    counts = counts + routed  # the next layer commits a few steps later, in the same rearrangement
    assert commit(1).placement["swaps"] == 1 and builder.placement_log.experts_moved == 8  # type: ignore[union-attr]
    counts = counts + routed
    settled = builder.build(counts)  # routing went on, the map held: that rearrangement is over
    assert settled.window_rank_tokens.sum() == 200 and settled.placement["swaps"] == 1
    assert settled.placement["balance"]["measured_after"]["cv_max"] == pytest.approx(imbalance_cv([[20, 80]])[0])
    assert builder.build(counts).window_rank_tokens.sum() == 200  # no routing, no change: the window stays
    assert commit(0).placement["swaps"] == 2  # vLLM's next rearrangement


def _four_layer_builder() -> tuple[SnapshotBuilder, dict[str, np.ndarray], np.ndarray]:
    maps = {"now": np.stack([contiguous_rank_weights(8, 2)] * 4)}
    builder = SnapshotBuilder(model_name="m", engine="0", layer_ids=(0, 1, 2, 3), window_flushes=10,
                              rank_weights=lambda: (maps["now"], "eplb"))  # fmt: skip
    return builder, maps, np.array([[60, 20, 10, 10, 5, 5, 5, 5]] * 4, dtype=np.int64)


def _flip(maps: dict[str, np.ndarray], layers: tuple[int, ...]) -> None:
    maps["now"] = maps["now"].copy()
    for layer in layers:
        maps["now"][layer] = maps["now"][layer][:, ::-1]


def test_rearrangements_far_apart_count_twice_whatever_layers_they_change() -> None:
    """vLLM's periodic rearrangements are thousands of steps apart: one that changes only higher layers than the
    last is not that one's commit going on (a rule with no bound on the routing between merged them)."""
    builder, maps, routed = _four_layer_builder()
    counts = routed.copy()
    builder.build(counts)
    _flip(maps, (0, 1))
    assert builder.build(counts).placement["swaps"] == 1  # type: ignore[index]
    for _ in range(10):
        counts = counts + routed
        builder.build(counts)
    _flip(maps, (2, 3))
    assert builder.build(counts + routed).placement["swaps"] == 2  # type: ignore[index]


def test_an_async_commit_counts_once_across_many_unchanged_layers() -> None:
    """vLLM commits every layer a step each, the unchanged ones too: changes of layers 0 and 7 of eight, seven
    routed flushes apart, are one rearrangement."""
    maps = {"now": np.stack([contiguous_rank_weights(8, 2)] * 8)}
    builder = SnapshotBuilder(model_name="m", engine="0", layer_ids=tuple(range(8)), window_flushes=10,
                              rank_weights=lambda: (maps["now"], "eplb"))  # fmt: skip
    routed = np.array([[60, 20, 10, 10, 5, 5, 5, 5]] * 8, dtype=np.int64)
    counts = routed.copy()
    builder.build(counts)
    _flip(maps, (0,))
    builder.build(counts)
    for _ in range(7):
        counts = counts + routed
        builder.build(counts)
    _flip(maps, (7,))
    assert builder.build(counts + routed).placement["swaps"] == 1  # type: ignore[index]


def test_a_trigger_commit_cut_short_does_not_swallow_the_next_rearrangement() -> None:
    """The trigger's async commit of layers 0-1 of four, then an elastic-EP reshape (vLLM drains its commit): the
    next change of layers 2-3 is another rearrangement, counted with its moves."""
    builder, maps, routed = _four_layer_builder()
    counts = routed.copy()
    builder.build(counts)
    target = maps["now"][:, :, ::-1].copy()
    builder.expected = Rearrangement(8, {}, target=target, pending=True)
    for layer in (0, 1):
        maps["now"] = maps["now"].copy()
        maps["now"][layer] = target[layer]
        counts = counts + routed
        builder.build(counts)
    maps["now"] = np.stack([contiguous_rank_weights(8, 4)] * 4)
    counts = counts + routed
    builder.build(counts)
    _flip(maps, (2, 3))
    log = builder.build(counts + routed).placement
    assert log is not None and log["swaps"] == 2 and log["experts_moved"] == 8 + 16


class _Router:
    """Stands in for vLLM's BaseRouter: the seam is set_capture_fn, called with logical ids."""

    def __init__(self, num_experts: int) -> None:
        self.global_num_experts = num_experts
        self.capture_fn = None

    def set_capture_fn(self, fn):  # type: ignore[no-untyped-def]
        self.capture_fn = fn

    def route(self, logits: torch.Tensor, k: int) -> torch.Tensor:
        ids = torch.topk(logits, k, dim=-1).indices
        if self.capture_fn is not None:
            self.capture_fn(ids)
        return ids


class _MoeLayer(torch.nn.Module):
    def __init__(self, layer_id: int, num_experts: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.gate = torch.nn.Linear(8, num_experts, bias=False)
        self.router = _Router(num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.router.route(self.gate(x), 2)
        return x


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_MoeLayer(i, 8) for i in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class _DenseFirstModel(_Model):
    """MoE layers at model layers 1, 3 and 5, dense ones between (as DeepSeek-V3's first three, or Qwen3-MoE's
    ``mlp_only_layers``)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_MoeLayer(i, 8) for i in (1, 3, 5)])


class _ListSink:
    def __init__(self) -> None:
        self.snapshots: list[ExpertLoadSnapshot] = []

    def publish(self, snapshot: ExpertLoadSnapshot) -> None:
        self.snapshots.append(snapshot)


def test_first_forward_binds_every_router_then_unhooks() -> None:
    torch.manual_seed(0)
    model = _Model()
    assert [v.layer_id for v in find_moe_layers(model)] == [0, 1, 2]
    sink = _ListSink()
    state = PluginState()
    settings = PluginSettings(enabled=True, virtual_ep_ranks=4, flush_interval_s=60.0, model_name="tiny")
    handle = install_bind_hook(lambda m: bind_model(m, settings, lambda: sink, row_filter=count_all_rows, state=state))
    try:
        model(torch.randn(5, 8))  # binds during this call: the routers already count it
        model(torch.randn(7, 8))
        assert state.counter is not None and state.flusher is not None
        snap = state.flusher.flush()
    finally:
        handle.remove()
        if state.flusher is not None:
            state.flusher.stop()
    assert snap.model_name == "tiny" and snap.layer_ids == (0, 1, 2)
    assert snap.expert_tokens_total.sum(axis=1).tolist() == [(5 + 7) * 2] * 3
    assert snap.rank_tokens_total.sum() == (5 + 7) * 2 * 3
    assert sink.snapshots[-1] is snap
    # The hook removed itself: a fresh model is not bound.
    other = _Model()
    other(torch.randn(2, 8))
    assert all(layer.router.capture_fn is None for layer in other.layers)


def _bound_model_name(settings: PluginSettings, served: str | None) -> str:
    """The ``model_name`` label bind_model gives a model, vLLM's config naming it ``served`` (None: unreadable)."""
    from engine.vllm_plugin.binding import LabelProbe, VllmLabels

    state = PluginState()
    state.label_probe = LabelProbe()
    state.label_probe.close()
    state.label_probe.labels = None if served is None else VllmLabels(model_name=served, engine="0")
    try:
        assert bind_model(_Model(), settings, _ListSink, row_filter=count_all_rows, state=state)
        assert state.flusher is not None
        return state.flusher.flush().model_name
    finally:
        if state.flusher is not None:
            state.flusher.stop()


def test_the_model_name_setting_stands_in_only_where_vllm_names_none() -> None:
    """vLLM's served name is on its own series (vllm:*, moeslo_ttft_*): the moe_* series carry it too, so
    dashboards and alerts join them; the setting used to replace it everywhere."""
    named = PluginSettings(enabled=True, flush_interval_s=60.0, model_name="from-setting")
    assert _bound_model_name(named, "served") == "served"
    assert _bound_model_name(named, None) == "from-setting"
    assert _bound_model_name(PluginSettings(enabled=True, flush_interval_s=60.0), None) == "unknown"


def test_the_layer_label_is_the_moe_layer_order_as_in_the_engine() -> None:
    """Our engine labels MoE layers 0, 1, ... (as vLLM's EPLB rows and the rebalancer's plans count them);
    the plugin labelled them with the model's layer index, so one layer had two numbers."""
    model = _DenseFirstModel()
    assert [v.layer_id for v in find_moe_layers(model)] == [1, 3, 5]
    settings = PluginSettings(enabled=True, virtual_ep_ranks=4, flush_interval_s=60.0)
    state = PluginState()
    try:
        assert bind_model(model, settings, _ListSink, row_filter=count_all_rows, state=state)
        assert state.counter is not None and state.flusher is not None
        model(torch.randn(5, 8))
        snap = state.flusher.flush()
        window = state.flusher.window()
    finally:
        if state.flusher is not None:
            state.flusher.stop()
    assert snap.layer_ids == window.layer_ids == (0, 1, 2)
    assert snap.expert_tokens_total.sum(axis=1).tolist() == [5 * 2] * 3  # each model layer in its row
    families = {f.name: f for f in snapshot_families([snap])}
    assert sorted({s.labels["layer"] for s in families["moe_layer_imbalance_cv"].samples}) == ["0", "1", "2"]
    # A pipeline stage cannot tell the MoE layers of the stages before it: the model's index, unique across stages.
    from engine.vllm_plugin.binding import moe_layer_labels

    assert moe_layer_labels((1, 3, 5), pipeline_stages=2) == (1, 3, 5)
    assert moe_layer_labels((1, 3, 5), pipeline_stages=1) == (0, 1, 2)


def test_a_capture_callback_already_bound_is_named_when_replaced(caplog: pytest.LogCaptureFixture) -> None:
    model = _Model()
    for layer in model.layers:
        layer.router.set_capture_fn(lambda ids: None)  # as vLLM's routed-experts capture binds it
    settings = PluginSettings(enabled=True, virtual_ep_ranks=4, flush_interval_s=60.0, model_name="tiny")
    state = PluginState()
    try:
        assert bind_model(model, settings, _ListSink, row_filter=count_all_rows, state=state)
    finally:
        if state.flusher is not None:
            state.flusher.stop()
    assert "already had a capture callback" in caplog.text


def _binds_over_passes(model: torch.nn.Module, passes: int) -> list[tuple[type, bool]]:
    """Each ``bind_model`` call the hook made over ``passes`` forward passes: the module's type and the answer."""
    settings = PluginSettings(enabled=True, virtual_ep_ranks=4, flush_interval_s=60.0, model_name="tiny")
    calls: list[tuple[type, bool]] = []

    def bind(module: torch.nn.Module) -> bool:
        calls.append((type(module), bind_model(module, settings, _ListSink, row_filter=count_all_rows)))
        return calls[-1][1]

    handle = install_bind_hook(bind)
    try:
        for _ in range(passes):
            model(torch.randn(2, 8))
    finally:
        handle.remove()
    return calls


def test_a_model_of_monolithic_kernels_is_said_once_and_unhooks(caplog: pytest.LogCaptureFixture) -> None:
    """Bound nowhere, the hook stayed, and every module call warned again (1,200 lines in 100 passes)."""
    model = _Model()
    for layer in model.layers:
        layer.is_monolithic = True
    assert _binds_over_passes(model, 5) == [(_Model, True)]
    assert caplog.text.count("monolithic kernel") == 1 and "3 MoE layer(s)" in caplog.text


def test_a_dense_model_is_scanned_once() -> None:
    """Bound nowhere, the hook rescanned every block's tree on each call: 300 scans in 100 passes."""
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(2)))
    # The whole model once; its blocks are in its tree.
    assert _binds_over_passes(model, 100) == [(torch.nn.Sequential, False)]


def test_host_path_counts_a_row_span_and_drops_invalid_ids() -> None:
    counter = ExpertLoadCounter([0], 4, row_filter=lambda ids: (1, 3))
    counter.capture(0, torch.tensor([[0, 0], [1, 2], [3, -1], [2, 2]], dtype=torch.int32))
    counter.capture(0, torch.tensor([[0, 0], [9, 1], [1, 1]], dtype=torch.int32))
    assert counter.snapshot().tolist() == [[0, 4, 1, 1]]


class _EplbState:
    def __init__(self, l2p: list[list[int]]) -> None:
        self.logical_to_physical_map = torch.tensor(l2p)


def test_rank_map_prefers_eplb_then_ep_layout_then_virtual_ep() -> None:
    from engine.vllm_plugin.binding import MoeLayerView, rank_weights_for

    router = _Router(4)
    ep_view = MoeLayerView(layer_id=0, router=router, num_experts=4, num_physical=4, ep_size=2, use_ep=True)
    weights, source = rank_weights_for([ep_view], virtual_ranks=8, strategy="round_robin")()
    assert source == "ep" and np.argmax(weights, axis=1).tolist() == [0, 1, 0, 1]
    router.eplb_state = _EplbState([[0, 5], [1, -1], [2, -1], [3, 4]])  # type: ignore[attr-defined]
    eplb_view = MoeLayerView(layer_id=0, router=router, num_experts=4, num_physical=6, ep_size=2, use_ep=True)
    weights, source = rank_weights_for([eplb_view], virtual_ranks=8, strategy="linear")()
    assert source == "eplb" and weights.shape == (1, 4, 2)
    # 6 slots over 2 ranks: slots 0-2 on rank 0, 3-5 on rank 1.
    assert weights[0].tolist() == [[0.5, 0.5], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    no_ep = MoeLayerView(layer_id=0, router=_Router(16), num_experts=16, num_physical=16, ep_size=1, use_ep=False)
    weights, source = rank_weights_for([no_ep], virtual_ranks=4, strategy="linear")()
    assert source == "virtual" and weights.sum(axis=0).tolist() == [4.0] * 4
    # More virtual ranks than experts: ranks holding nothing would read as imbalance; as many as experts.
    few = MoeLayerView(layer_id=0, router=_Router(8), num_experts=8, num_physical=8, ep_size=1, use_ep=False)
    weights, source = rank_weights_for([few], virtual_ranks=16, strategy="linear")()
    assert source == "virtual" and weights.shape == (8, 8) and weights.sum(axis=0).tolist() == [1.0] * 8


def test_callback_survives_a_fullgraph_compile_and_counts_at_run_time() -> None:
    calls: list[int] = []

    def real_rows(ids: torch.Tensor) -> tuple[int, int]:
        calls.append(int(ids.shape[0]))  # runs when the graph runs, not when it is traced
        return (0, int(ids.shape[0]))

    counter = ExpertLoadCounter([0], 8, row_filter=real_rows)
    capture = counter.capture_fn(0)

    def moe_step(x: torch.Tensor) -> torch.Tensor:
        capture(torch.topk(x, 2, dim=-1).indices)
        return x * 2

    compiled = torch.compile(moe_step, fullgraph=True, backend="eager")
    for tokens in (5, 5, 7):
        compiled(torch.randn(tokens, 8))
    assert calls == [5, 5, 7]
    assert counter.snapshot().sum() == (5 + 5 + 7) * 2
