"""Wiring inside a vLLM process: bind routers on first forward, flush counts to a sink.

:func:`activate` is called by the plugin entry point (``exporters.vllm_metrics``)
in every vLLM process.  Only a process that runs the model ever binds: there
a :class:`Flusher` thread copies the counts out every ``flush_interval_s``,
builds an :class:`~engine.vllm_plugin.snapshot.ExpertLoadSnapshot` and hands
it to the sink the exporter made.  The hot path (the router callback) only
adds to a device tensor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Protocol

import torch

from engine.stats import FloatArray, IntArray
from engine.vllm_plugin.binding import (
    LabelProbe,
    MoeLayerView,
    VllmLabels,
    current_vllm_labels,
    find_moe_layers,
    install_bind_hook,
    is_first_tp_rank,
    moe_layer_labels,
    monolithic_moe_layers,
    pipeline_parallel_size,
    pipeline_rank,
    rank_weights_for,
    vllm_row_filter,
)
from engine.vllm_plugin.counter import ExpertLoadCounter, RowFilter
from engine.vllm_plugin.placement_log import PlacementLog
from engine.vllm_plugin.settings import PluginSettings
from engine.vllm_plugin.snapshot import ExpertLoadSnapshot, Rearrangement, SnapshotBuilder

logger = logging.getLogger("moeslo.vllm_plugin")


class SnapshotSink(Protocol):
    """Where snapshots go (an exporter)."""

    def publish(self, snapshot: ExpertLoadSnapshot) -> None: ...


@dataclass(frozen=True, slots=True, eq=False)
class WindowView:
    """The routing window one counting worker holds."""

    layer_ids: tuple[int, ...]
    expert_tokens: IntArray
    """(layers, experts) tokens routed within the window."""
    active_flushes: int
    """Flush intervals in the window that saw routed tokens (a lower bound on the steps in it)."""
    rank_weights: FloatArray
    """(experts, ranks) or (layers, experts, ranks): the rank map of the gauges."""
    rank_source: str
    expert_tokens_total: IntArray
    """(layers, experts) tokens routed since the worker started (never reset: readings difference into
    windows that do not overlap)."""


class Flusher:
    """Copies counts out on a daemon thread every ``interval_s`` and publishes a snapshot."""

    def __init__(
        self, counter: ExpertLoadCounter, builder: SnapshotBuilder, sink: SnapshotSink, *, interval_s: float,
        records_placement: bool = True,
    ) -> None:  # fmt: skip
        """``records_placement``: this worker keeps its engine's placement log (the first pipeline stage:
        every stage answers each trigger request, and the engine's requests and swaps count once); a later
        stage logs only the replicas its own layers moved."""
        self.counter = counter
        self.records_placement = records_placement
        self.builder = builder
        builder.records_placement = records_placement
        self.sink = sink
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="moeslo-vllm-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def flush(self) -> ExpertLoadSnapshot:
        """The periodic flush: publish, and move the routing window on by one interval."""
        with self._lock:
            return self._flush_locked(new_slot=True)

    def window(self) -> WindowView:
        """Flush now and return the routing window (the trigger's load and rank map)."""
        with self._lock:
            snapshot = self._flush_locked()
            weights, source = self.builder.rank_weights()
            tokens = self.builder.window_expert_tokens
            assert tokens is not None
            return WindowView(
                layer_ids=snapshot.layer_ids, expert_tokens=tokens.copy(),
                active_flushes=self.builder.window_active_flushes, rank_weights=weights, rank_source=source,
                expert_tokens_total=snapshot.expert_tokens_total.copy(),
            )  # fmt: skip

    def request(self, action: str, outcome: str) -> None:
        """Count a trigger request (``moe_placement_requests_total``)."""
        with self._lock:
            if self.records_placement:
                self._log().request(action, outcome)
            self._flush_locked()

    def rearrange(self, run: Callable[[], Rearrangement | None]) -> None:
        """Around the trigger's rearrangement: ``run`` has vLLM rearrange and returns what to record (None: vLLM
        kept its map).  The flush thread waits meanwhile (it must not see the map half-way); the counts so far
        close the old map's window; a map committed at once restarts the window and is recorded here, one that
        vLLM's async EPLB commits later at the flush that sees it change (:meth:`SnapshotBuilder.build`)."""
        with self._lock:
            self._flush_locked()
            expected = run()
            if expected is None:
                return
            self.builder.expected = expected
            self._flush_locked()
            if self.builder.expected is expected and not expected.pending:
                # Committed, and each expert is on the ranks it was on (the plan moved slots within ranks).
                self.builder.expected = None
                self.builder.record(expected)
                self.builder.end_commit()
                self.builder.mark_rearrangement()
                self._flush_locked()

    def _log(self) -> PlacementLog:
        return self.builder.log()

    def _flush_locked(self, *, new_slot: bool = False) -> ExpertLoadSnapshot:
        # Flushes a trigger request makes add to the current interval: the window stays window_s long
        # (counted per flush, a controller polling each second halved it).
        snapshot = self.builder.build(self.counter.snapshot(), new_slot=new_slot)
        self.sink.publish(snapshot)
        return snapshot

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception:  # a metrics failure must never take the worker down
                logger.exception("moeslo: publishing expert load failed")


class PluginState:
    """What the plugin set up in this process (for tests and the bench)."""

    def __init__(self) -> None:
        self.hook: torch.utils.hooks.RemovableHandle | None = None
        self.label_probe: LabelProbe | None = None
        self.counter: ExpertLoadCounter | None = None
        self.flusher: Flusher | None = None


def bind_model(
    model: torch.nn.Module,
    settings: PluginSettings,
    make_sink: Callable[[], SnapshotSink],
    *,
    row_filter: RowFilter | None = None,
    state: PluginState | None = None,
) -> bool:
    """Bind every MoE router in ``model``; False when it holds none (keep looking).

    ``row_filter`` defaults to vLLM's forward context, for this engine's data-parallel rank."""
    layers = find_moe_layers(model)
    if monolithic := monolithic_moe_layers(model):
        logger.warning("moeslo: %d MoE layer(s) use a monolithic kernel, which routes inside itself; not counted",
                       monolithic)  # fmt: skip
    if not layers:
        return monolithic > 0  # found the model: stop looking (each call warned and rescanned it)
    state = state if state is not None else PluginState()
    if not is_first_tp_rank():
        logger.info("moeslo: TP rank > 0, the first TP rank counts this model's routing")
        return True
    labels = _labels(settings, state)
    model_name, engine, strategy = labels.model_name, labels.engine, labels.placement_strategy
    if row_filter is None:
        row_filter = partial(vllm_row_filter, dp_rank=labels.dp_rank)
    device = next(model.parameters(), torch.zeros(0)).device
    counter = ExpertLoadCounter(
        [v.layer_id for v in layers], max(v.num_experts for v in layers), device=device, row_filter=row_filter
    )
    stages = pipeline_parallel_size()
    if stages > 1:
        logger.warning("moeslo: under pipeline parallelism the layer label is the model's layer index, not the "
                       "MoE-layer order (0, 1, ...) our engine and single-stage vLLM servers use")  # fmt: skip
    builder = SnapshotBuilder(
        model_name=model_name,
        engine=engine,
        layer_ids=moe_layer_labels(counter.layer_ids, pipeline_stages=stages),
        window_flushes=settings.window_flushes,
        rank_weights=rank_weights_for(layers, settings.virtual_ep_ranks, strategy),
        engine_moe_layers=None if stages <= 1 else labels.model_layers or len(layers) * stages,
    )
    flusher = Flusher(counter, builder, make_sink(), interval_s=settings.flush_interval_s,
                      records_placement=pipeline_rank() == 0)  # fmt: skip
    _bind_routers(layers, counter)  # last: a bind that fails before it leaves vLLM's routers as they were
    flusher.start()
    state.counter, state.flusher = counter, flusher
    if state.label_probe is not None:
        state.label_probe.close()
    logger.info(
        "moeslo: counting routed tokens of %d MoE layers x %d experts (model_name=%s, engine=%s; "
        "labels layer=%s are model layers %s)",
        len(layers), counter.num_experts, model_name, engine, list(builder.layer_ids), list(counter.layer_ids),
    )  # fmt: skip
    return True


def _bind_routers(layers: list[MoeLayerView], counter: ExpertLoadCounter) -> None:
    """Hand each router the counter's callback (all of them, or none on an error)."""
    previous = [getattr(view.router, "capture_fn", None) for view in layers]
    if any(fn is not None for fn in previous):
        # A router holds one callback: vLLM's routed-experts capture (--enable-return-routed-experts) was
        # bound first, and counting here ends it.
        logger.warning("moeslo: the MoE routers already had a capture callback (vLLM's routed-experts capture?); "
                       "the plugin's counting replaces it: the two cannot run together")  # fmt: skip
    try:
        for view in layers:
            view.router.set_capture_fn(counter.capture_fn(view.layer_id))
    except Exception:
        for view, fn in zip(layers, previous, strict=True):
            view.router.set_capture_fn(fn)
        raise


def _labels(settings: PluginSettings, state: PluginState) -> VllmLabels:
    """vLLM's served model name, as on its own series (vllm:*, moeslo_ttft_*) that dashboards and alerts join
    on, and its DP rank; the setting only stands in where vLLM's config could not be read."""
    probed = state.label_probe.labels if state.label_probe is not None else None
    return probed or current_vllm_labels() or VllmLabels(model_name=settings.model_name or "unknown", engine="0")


def activate(settings: PluginSettings, make_sink: Callable[[], SnapshotSink]) -> PluginState:
    """Arm the bind hook in this process (no-op until a model runs here)."""
    state = PluginState()
    state.label_probe = LabelProbe()
    state.hook = install_bind_hook(lambda module: bind_model(module, settings, make_sink, state=state))
    return state
