"""The vLLM plugin's entry point and the publishing half: expert load as ``moe_*`` metrics.

Installed as the ``vllm.general_plugins`` entry point ``moeslo``; vLLM calls
:func:`register` in each of its processes (API server, engine core,
workers).  It does nothing unless ``MOESLO_VLLM_PLUGIN=1``.  The counting
happens in the worker (``engine.vllm_plugin``); the metrics must appear on
the API server's ``/metrics``, another process, so there are two routes:

* **multiprocess Prometheus** (``PROMETHEUS_MULTIPROC_DIR`` set when the worker
  binds the model, as vLLM sets it with ``--api-server-count > 1``, which data
  parallelism defaults to, or as a deployment sets it): the worker owns
  ordinary ``prometheus_client`` metrics, which land in the shared directory,
  and vLLM's ``MultiProcessCollector`` serves them (:class:`MultiprocessSink`;
  gauges use ``mostrecent``).  vLLM sets the directory after it loaded the
  plugins, in the process it forks the engine cores from, so the worker
  switches its prometheus_client to the directory's files itself.
* **single API server, in-memory registry** (vLLM's default): the API
  server's plugin makes a directory, passes it to its children in
  ``MOESLO_VLLM_METRICS_DIR`` and registers a :class:`SnapshotCollector` in
  the global registry vLLM serves; workers write JSON snapshots there
  (:class:`SnapshotFileSink`).  The first process cannot tell yet whether
  vLLM will run several API servers; when it does, that collector stays idle
  (vLLM then serves the multiprocess directory alone) and the workers,
  seeing ``PROMETHEUS_MULTIPROC_DIR``, take the route above.

Names and labels are those of ``docs/metrics.md`` (the embedded engine's):
``model_name`` and ``engine`` on every series.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from contracts.catalogue import (
    BALANCEDNESS_ACROSS_LAYERS,
    BASE_LABELS,
    EXPERT_LABEL,
    EXPERT_TOKENS,
    IMBALANCE_CV_ACROSS_LAYERS,
    LAYER_BALANCEDNESS,
    LAYER_IMBALANCE_CV,
    LAYER_IMBALANCE_CV_NOISE,
    LAYER_LABEL,
    MOE_HELP,
    RANK_LABEL,
    RANK_TOKENS,
    STAT_LABEL,
)
from contracts.errors import ValidationError
from engine.vllm_plugin import ExpertLoadSnapshot, PluginSettings, PluginState, SnapshotSink, activate
from engine.vllm_plugin.eplb_control import EplbControl, install_worker_method
from engine.vllm_plugin.settings import METRICS_DIR_ENV
from exporters.prometheus import DEFAULT_MAX_EXPERT_SERIES
from exporters.vllm_placement import PlacementMetrics, placement_families
from exporters.vllm_stages import STAGES_FOLDER, StageBoard, engine_summaries, layer_figures, summaries

logger = logging.getLogger("moeslo.vllm_plugin")

ARMED: dict[str, PluginState] = {}
"""What :func:`register` armed in this process, under ``"state"`` (empty when disabled)."""


class _ToVllmHandlers(logging.Handler):
    """Hands a record to whatever handlers vLLM's logger has at the time, from vLLM's level.

    Looked up on each record, not copied once: vLLM configures its logging again in each process
    it spawns (and ``dictConfig`` replaces the handlers).  Past vLLM's handlers a record goes on up
    its chain as vLLM's own do (to the root's handlers where ``VLLM_CONFIGURE_LOGGING=0`` leaves
    logging to the user), else where Python's last resort puts it."""

    def emit(self, record: logging.LogRecord) -> None:
        theirs = logging.getLogger("vllm")
        if record.levelno < theirs.getEffectiveLevel():
            return
        theirs.callHandlers(record)  # vLLM's handlers, and on up its chain (root) as vLLM's own lines go


def follow_vllm_logging() -> None:
    """Our ``moeslo`` loggers write where, and from the level, vLLM's own do.

    vLLM configures only its ``vllm`` logger (its handler and ``VLLM_LOGGING_LEVEL``); ours would
    otherwise reach Python's last-resort handler, which drops every info line (the plugin's
    "counting routed tokens" among them) and prints warnings without time or process.  A
    ``moeslo`` logger the user configured already is left alone."""
    ours = logging.getLogger("moeslo")
    if ours.handlers or "vllm" not in sys.modules:  # not in a vLLM process (a test calling register)
        return
    ours.addHandler(_ToVllmHandlers())
    ours.setLevel(logging.DEBUG)  # the handler applies vLLM's level, whatever it is by then
    ours.propagate = False


def register() -> None:
    """The ``vllm.general_plugins`` entry point (vLLM may call it more than once per process)."""
    if ARMED:
        return
    follow_vllm_logging()
    try:
        settings = PluginSettings.from_env()
    except ValidationError as exc:
        logger.error("moeslo vLLM plugin disabled: %s", exc)
        return
    if not settings.enabled:
        return
    if settings.prometheus_multiproc_dir is None and settings.metrics_dir is None:
        # First process of the tree (vLLM's API server): make the hand-over directory.  Where vLLM goes on to
        # run several API servers it sets PROMETHEUS_MULTIPROC_DIR after this, and the workers take that route.
        directory = tempfile.mkdtemp(prefix="moeslo-vllm-")
        atexit.register(shutil.rmtree, directory, True)
        os.environ[METRICS_DIR_ENV] = directory
        REGISTRY.register(SnapshotCollector(directory, max_age_s=stale_after_s(settings),
                                            expert_series=settings.expert_series))  # fmt: skip
    state = ARMED["state"] = activate(settings, lambda: make_sink(settings.expert_series, stale_after_s(settings)))
    # The trigger's worker method (exporters.vllm_eplb_http calls it through collective_rpc).
    install_worker_method(EplbControl(lambda: state.flusher))


def stale_after_s(settings: PluginSettings) -> float:
    """Snapshots older than this come from a worker that is gone."""
    return max(30.0, 10 * settings.flush_interval_s)


def expert_series_on(setting: bool | None, layers: int, experts: int) -> bool:
    """Whether ``moe_expert_tokens_total`` is published: forced, or up to the embedded engine's cap, over the
    engine's MoE layers (all its pipeline stages: :attr:`ExpertLoadSnapshot.series_layers`).

    Above it (DeepSeek-V3: 58 x 256 = 14,848 series) the series cost a Prometheus more than they
    tell, and building them ran in vLLM's API server's event loop for about 300 ms a scrape."""
    return setting if setting is not None else layers * experts <= DEFAULT_MAX_EXPERT_SERIES


def make_sink(expert_series: bool | None = None, max_age_s: float = 30.0) -> SnapshotSink:
    """Pick the route for this worker process (called once, when it binds the model).

    Decided by ``PROMETHEUS_MULTIPROC_DIR`` now, not by how prometheus_client started: with several API
    servers vLLM sets the directory after loading the plugins, and the engine cores it forks keep a
    prometheus_client imported without it (see :func:`use_multiprocess_values`)."""
    shared = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if shared:
        use_multiprocess_values()
        return MultiprocessSink(expert_series=expert_series,
                                stages=StageBoard(Path(shared) / STAGES_FOLDER, max_age_s=max_age_s))  # fmt: skip
    directory = os.environ.get(METRICS_DIR_ENV)
    if directory:
        return SnapshotFileSink(directory)
    logger.warning("moeslo: neither PROMETHEUS_MULTIPROC_DIR nor %s is set; expert load is not published",
                   METRICS_DIR_ENV)  # fmt: skip
    return NullSink()


def use_multiprocess_values() -> None:
    """Switch this process's prometheus_client to the files of ``PROMETHEUS_MULTIPROC_DIR``.

    prometheus_client picks its value class once, when imported; a process forked from one that imported it
    before the directory was set would keep its values in memory, where vLLM's API servers (which serve the
    directory) never see them.  Ours are made after this.  The switch is the process's: an unlabelled metric
    made earlier keeps its values in memory, but a labelled one's later label sets land in the directory too
    (vLLM serves those; where a worker process holds such metrics of its own, they would appear)."""
    if values.ValueClass.__name__ != "MmapedValue":
        values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]  # untyped in prometheus_client


class NullSink:
    def publish(self, snapshot: ExpertLoadSnapshot) -> None:
        return None


class SnapshotFileSink:
    """Writes each snapshot to ``<dir>/worker-<pid>.json`` (atomically, by rename)."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / f"worker-{os.getpid()}.json"

    def publish(self, snapshot: ExpertLoadSnapshot) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(snapshot.to_json())
        os.replace(tmp, self.path)


class SnapshotCollector:
    """Serves the workers' latest snapshots from ``directory`` as metric families, on each scrape."""

    def __init__(self, directory: str | Path, *, max_age_s: float = 30.0, expert_series: bool | None = None) -> None:
        self.directory = Path(directory)
        self.max_age_s = max_age_s
        self.expert_series = expert_series

    def describe(self) -> list[Metric]:
        return []  # families appear only once a worker has counted; nothing to pre-declare

    def collect(self) -> Iterator[Metric]:
        snapshots = self._read()
        return iter([*snapshot_families(snapshots, self.expert_series), *placement_families(snapshots)])

    def _read(self) -> list[ExpertLoadSnapshot]:
        now = time.time()
        out = []
        for path in sorted(self.directory.glob("worker-*.json")):
            try:
                if now - path.stat().st_mtime > self.max_age_s:
                    continue
                out.append(ExpertLoadSnapshot.from_json(path.read_text()))
            except (OSError, ValueError, KeyError) as exc:
                logger.warning("moeslo: skipping unreadable snapshot %s: %s", path, exc)
        return out


def snapshot_families(snapshots: Iterable[ExpertLoadSnapshot], expert_series: bool | None = None) -> list[Metric]:
    """The ``moe_*`` families of some workers' snapshots (per expert: :func:`expert_series_on`); the
    across-layer summaries are one per engine, over the layers of all its workers (pipeline stages)."""
    snapshots = list(snapshots)
    experts = CounterMetricFamily(EXPERT_TOKENS, MOE_HELP[EXPERT_TOKENS],
                                  labels=[*BASE_LABELS, LAYER_LABEL, EXPERT_LABEL])  # fmt: skip
    ranks = CounterMetricFamily(RANK_TOKENS, MOE_HELP[RANK_TOKENS], labels=[*BASE_LABELS, RANK_LABEL])
    gauges = {
        name: GaugeMetricFamily(name, MOE_HELP[name], labels=[*BASE_LABELS, LAYER_LABEL])
        for name in (LAYER_IMBALANCE_CV, LAYER_IMBALANCE_CV_NOISE, LAYER_BALANCEDNESS)
    }
    families = {
        name: GaugeMetricFamily(name, MOE_HELP[name], labels=[*BASE_LABELS, STAT_LABEL])
        for name in (IMBALANCE_CV_ACROSS_LAYERS, BALANCEDNESS_ACROSS_LAYERS)
    }
    rank_sums: dict[tuple[str, str, str], float] = {}
    for snap in snapshots:
        base = [snap.model_name, snap.engine]
        if expert_series_on(expert_series, snap.series_layers, snap.expert_tokens_total.shape[1]):
            for row, layer in enumerate(snap.layer_ids):
                for expert, count in enumerate(snap.expert_tokens_total[row]):
                    experts.add_metric([*base, str(layer), str(expert)], int(count))
        for rank, load in enumerate(snap.rank_tokens_total):
            key = (snap.model_name, snap.engine, str(rank))
            rank_sums[key] = rank_sums.get(key, 0.0) + float(load)
        # A layer with no routing in the window has no balance: NaN, as on the embedded engine and the
        # multiprocess route (a missing series would raise the metrics-absent ticket).
        loaded = snap.window_rank_tokens.sum(axis=1) > 0
        for name, per_layer in ((LAYER_IMBALANCE_CV, snap.imbalance_cv),
                                (LAYER_IMBALANCE_CV_NOISE, snap.imbalance_cv_noise),
                                (LAYER_BALANCEDNESS, snap.balancedness)):  # fmt: skip
            for layer, value, routed in zip(snap.layer_ids, per_layer, loaded, strict=True):
                gauges[name].add_metric([*base, str(layer)], float(value) if routed else math.nan)
    for (model_name, engine), values_of in engine_summaries(snapshots).items():
        for name, stats in values_of.items():
            for stat, value in stats.items():
                families[name].add_metric([model_name, engine, stat], value)
    for key, load in rank_sums.items():
        ranks.add_metric(list(key), load)
    if not snapshots:
        return []
    return [*([experts] if experts.samples else []), ranks, *gauges.values(), *families.values()]


class MultiprocessSink:
    """Ordinary prometheus_client metrics in the worker; multiprocess mode puts them on vLLM's /metrics."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, expert_series: bool | None = None,
        stages: StageBoard | None = None,
    ) -> None:  # fmt: skip
        """``stages``: where the pipeline stages of an engine meet (None: this worker's layers are all)."""
        self.expert_series = expert_series
        self.stages = stages
        # A private registry: the values go to the shared directory either way, and
        # the names must not clash with anything in the worker's global registry.
        registry = registry if registry is not None else CollectorRegistry()
        self.expert_tokens = Counter(EXPERT_TOKENS, MOE_HELP[EXPERT_TOKENS],
                                     [*BASE_LABELS, LAYER_LABEL, EXPERT_LABEL], registry=registry)  # fmt: skip
        self.rank_tokens = Counter(RANK_TOKENS, MOE_HELP[RANK_TOKENS], [*BASE_LABELS, RANK_LABEL],
                                   registry=registry)  # fmt: skip
        self.gauges = {
            name: Gauge(name, MOE_HELP[name], [*BASE_LABELS, LAYER_LABEL], registry=registry,
                        multiprocess_mode="mostrecent")
            for name in (LAYER_IMBALANCE_CV, LAYER_IMBALANCE_CV_NOISE, LAYER_BALANCEDNESS)
        }
        self.summaries = {
            name: Gauge(name, MOE_HELP[name], [*BASE_LABELS, STAT_LABEL], registry=registry,
                        multiprocess_mode="mostrecent")
            for name in (IMBALANCE_CV_ACROSS_LAYERS, BALANCEDNESS_ACROSS_LAYERS)
        }
        self.placement = PlacementMetrics(registry)
        self._published_experts: np.ndarray[tuple[int, int], np.dtype[np.int64]] | None = None
        self._published_ranks: np.ndarray[tuple[int], np.dtype[np.float64]] | None = None

    def publish(self, snapshot: ExpertLoadSnapshot) -> None:
        self.placement.publish(snapshot)
        base = (snapshot.model_name, snapshot.engine)
        if expert_series_on(self.expert_series, snapshot.series_layers, snapshot.expert_tokens_total.shape[1]):
            self._publish_experts(base, snapshot)
        ranks = snapshot.rank_tokens_total
        old_ranks = self._published_ranks
        if old_ranks is None or old_ranks.shape != ranks.shape:
            old_ranks = np.zeros_like(ranks)
        for rank, load in enumerate(ranks - old_ranks):
            if load > 0:
                self.rank_tokens.labels(*base, str(rank)).inc(float(load))
        self._published_ranks = ranks.copy()
        # A layer with no routing in the window (it restarts at a rearrangement) has no balance: NaN, where its
        # zeros read as a perfectly balanced layer (and a multiprocess gauge cannot be removed).
        loaded = snapshot.window_rank_tokens.sum(axis=1) > 0
        for name, per_layer in ((LAYER_IMBALANCE_CV, snapshot.imbalance_cv),
                                (LAYER_IMBALANCE_CV_NOISE, snapshot.imbalance_cv_noise),
                                (LAYER_BALANCEDNESS, snapshot.balancedness)):  # fmt: skip
            for layer, value, routed in zip(snapshot.layer_ids, per_layer, loaded, strict=True):
                self.gauges[name].labels(*base, str(layer)).set(float(value) if routed else math.nan)
        across = summaries(layer_figures(snapshot)) if self.stages is None else self.stages.summaries(snapshot)
        for name, stats in across.items():
            for stat, value in stats.items():
                self.summaries[name].labels(*base, stat).set(value)

    def _publish_experts(self, base: tuple[str, str], snapshot: ExpertLoadSnapshot) -> None:
        counts = snapshot.expert_tokens_total
        old = self._published_experts
        if old is None or old.shape != counts.shape:
            old = np.zeros_like(counts)
            for layer in snapshot.layer_ids:  # every series from the start, as the engine does
                for expert in range(counts.shape[1]):
                    self.expert_tokens.labels(*base, str(layer), str(expert))
        for row, expert in zip(*np.nonzero(counts - old), strict=True):
            self.expert_tokens.labels(*base, str(snapshot.layer_ids[row]), str(expert)).inc(
                int(counts[row, expert] - old[row, expert])
            )
        self._published_experts = counts.copy()
