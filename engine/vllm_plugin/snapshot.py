"""What a worker publishes: cumulative expert counts and the windowed per-rank load.

A snapshot is plain data with a JSON form, so the exporter can publish it in
the worker (multiprocess Prometheus) or hand it to vLLM's API server through
a file.  :class:`LoadWindow` and :class:`SnapshotBuilder` turn the counter's
cumulative counts into snapshots; the math is ``engine.stats``'.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.imbalance import balancedness, imbalance_cv, sampling_noise_cv
from engine.stats import FloatArray, IntArray
from engine.vllm_plugin.placement_log import PlacementLog, balance_summary
from engine.vllm_plugin.ranks import rank_loads


@dataclass(frozen=True, slots=True, eq=False)
class ExpertLoadSnapshot:
    """One worker's expert load at one flush."""

    model_name: str
    engine: str
    layer_ids: tuple[int, ...]
    """The ``layer`` label of each row: the MoE-layer order, 0 first, as our engine's (the model's layer index
    under pipeline parallelism: :func:`~engine.vllm_plugin.binding.moe_layer_labels`)."""
    expert_tokens_total: IntArray
    """(layers, experts) tokens routed to each logical expert since start (top-k assignments)."""
    rank_tokens_total: FloatArray
    """(ranks,) expert assignments each (possibly virtual) EP rank processed since start, all layers."""
    window_rank_tokens: FloatArray
    """(layers, ranks) per-rank load within the routing window."""
    rank_source: str
    """``ep`` (vLLM's EP layout), ``eplb`` (EPLB's map) or ``virtual`` (EP off)."""
    placement: dict[str, Any] | None = None
    """Rearrangements asked of this worker (:meth:`PlacementLog.to_json`); None before the first request."""
    engine_moe_layers: int | None = None
    """The engine's MoE layers where this worker counts some of them (a pipeline stage): an upper bound, the
    same in every stage; None: ``layer_ids`` are all of them."""

    @property
    def series_layers(self) -> int:
        """The MoE layers the engine publishes per-expert series for, over all its workers."""
        return max(self.engine_moe_layers or 0, len(self.layer_ids))

    @property
    def imbalance_cv(self) -> FloatArray:
        """Per-layer CV of per-rank load within the window."""
        return imbalance_cv(self.window_rank_tokens)

    @property
    def imbalance_cv_noise(self) -> FloatArray:
        """Per-layer CV that sampling alone gives the window's assignments (its noise floor)."""
        window = self.window_rank_tokens
        return sampling_noise_cv(window.sum(axis=1), window.shape[1], window)

    @property
    def balancedness(self) -> FloatArray:
        """Per-layer mean/max of per-rank load within the window."""
        return balancedness(self.window_rank_tokens)

    def to_json(self) -> str:
        return json.dumps(
            {
                "model_name": self.model_name,
                "engine": self.engine,
                "layer_ids": list(self.layer_ids),
                "expert_tokens_total": self.expert_tokens_total.tolist(),
                "rank_tokens_total": self.rank_tokens_total.tolist(),
                "window_rank_tokens": self.window_rank_tokens.tolist(),
                "rank_source": self.rank_source,
                "placement": self.placement,
                "engine_moe_layers": self.engine_moe_layers,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> ExpertLoadSnapshot:
        raw: dict[str, Any] = json.loads(text)
        return cls(
            model_name=str(raw["model_name"]),
            engine=str(raw["engine"]),
            layer_ids=tuple(int(x) for x in raw["layer_ids"]),
            expert_tokens_total=np.asarray(raw["expert_tokens_total"], dtype=np.int64),
            rank_tokens_total=np.asarray(raw["rank_tokens_total"], dtype=np.float64),
            window_rank_tokens=np.asarray(raw["window_rank_tokens"], dtype=np.float64),
            rank_source=str(raw["rank_source"]),
            placement=raw.get("placement"),
            engine_moe_layers=None if raw.get("engine_moe_layers") is None else int(raw["engine_moe_layers"]),
        )


WINDOW_MAX_SLOTS = 1000
"""The routing window's most slots.  Each is a layers x experts array of counts (119 KB for DeepSeek-V3's
58 x 256) in every worker: a day's window of 1 s flushes would be 86,400 of them (10 GB a worker), so a
window of more flushes keeps several flushes to a slot."""


class LoadWindow:
    """Sliding window over the last ``size`` flushes of per-expert count deltas (running sum).

    At most ``max_slots`` arrays are kept: past that, each slot holds ``flushes_per_slot``
    consecutive flushes, and the window drops its oldest slot whole (it spans ``size`` flushes to
    within one slot)."""

    def __init__(self, size: int, max_slots: int = WINDOW_MAX_SLOTS) -> None:
        if size < 1 or max_slots < 1:
            raise ValueError(f"window size and slots must be >= 1, got {size} and {max_slots}")
        self.size = size
        self.flushes_per_slot = -(-size // max_slots)
        self.slots = -(-size // self.flushes_per_slot)
        self._deltas: deque[IntArray] = deque()
        self._active: deque[int] = deque()
        """Per slot, its periodic flushes that saw routed tokens."""
        self._filled = 0
        """Periodic flushes in the newest slot."""
        self._sum: IntArray | None = None

    def add(self, delta: IntArray, *, new_slot: bool = True) -> IntArray:
        """Add one flush's delta; return the window's (layers, experts) sum.

        ``new_slot=False`` (a flush between the periodic ones: a trigger request) adds to the latest
        slot, so the window spans ``size`` flush intervals however often it is asked."""
        if self._sum is None or self._sum.shape != delta.shape:
            self._deltas.clear()
            self._active.clear()
            self._sum = np.zeros_like(delta)
        saw = int(bool(delta.any()))
        if not self._deltas or (new_slot and self._filled >= self.flushes_per_slot):
            self._deltas.append(delta)
            self._active.append(saw)
            self._filled = 1
        else:
            self._deltas[-1] = self._deltas[-1] + delta
            self._active[-1] = self._active[-1] + saw if new_slot else max(self._active[-1], saw)
            self._filled += int(new_slot)
        self._sum = self._sum + delta
        while len(self._deltas) > self.slots:
            self._sum = self._sum - self._deltas.popleft()
            self._active.popleft()
        return self._sum.copy()

    @property
    def active_flushes(self) -> int:
        """Flushes in the window that saw routed tokens."""
        return sum(self._active)


RankWeights = Callable[[], tuple[FloatArray, str]]
"""Returns the current (experts x ranks) or (layers x experts x ranks) weights and their source."""


MAX_COMMIT_GAP_FLUSHES = 3
"""Periodic flushes routed on a steady map, per layer between, after which a change of vLLM's own is another
rearrangement: an async commit's layers are a step or a few apart, its periodic rearrangements thousands of steps."""
MAX_TARGET_GAP_FLUSHES = 100
"""The same for the trigger's rearrangement, whose whole map is known: only a commit vLLM cut short is left."""


@dataclass(frozen=True, slots=True, eq=False)
class Rearrangement:
    """A rearrangement the trigger asked of vLLM: recorded with these figures when the rank map changes to it."""

    experts_moved: int
    balance: dict[str, dict[str, Any]]
    duration_s: float | None = None
    """The step stall; None where it was not measured (async EPLB spreads it over steps)."""
    target: FloatArray | None = None
    """(layers, experts, ranks) rank map it commits; None: the next change, whatever it is."""
    pending: bool = False
    """vLLM commits it after the request (async EPLB): it waits for the map to change."""

    def matches(self, weights: FloatArray, changed: npt.NDArray[np.bool_]) -> bool:
        """Whether the layers that changed now hold this rearrangement's map."""
        target = self.target
        return target is None or (target.shape == weights.shape and np.allclose(target[changed], weights[changed]))


class SnapshotBuilder:
    """Turns successive cumulative counts into snapshots (deltas, window, rank totals).

    A change of the rank map (EPLB's live map) between two builds is a rearrangement, whoever made it
    (vLLM's periodic ones included): the window restarts and the placement log counts it (see :meth:`build`)."""

    def __init__(
        self, *, model_name: str, engine: str, layer_ids: tuple[int, ...], window_flushes: int,
        rank_weights: RankWeights, engine_moe_layers: int | None = None,
    ) -> None:  # fmt: skip
        """``engine_moe_layers``: see :attr:`ExpertLoadSnapshot.engine_moe_layers`."""
        self.model_name = model_name
        self.engine = engine
        self.layer_ids = layer_ids
        self.engine_moe_layers = engine_moe_layers
        self._window = LoadWindow(window_flushes)
        self._rank_weights = rank_weights
        self._last: IntArray | None = None
        self._rank_total: FloatArray | None = None
        self.window_expert_tokens: IntArray | None = None
        """(layers, experts) tokens routed within the window, as of the last build."""
        self.placement_log: PlacementLog | None = None
        """Rearrangements of this worker's placement (created on the first request or rearrangement)."""
        self.records_placement = True
        """This worker keeps its engine's placement log (see :class:`~engine.vllm_plugin.worker.Flusher`); one
        that does not (a later pipeline stage) logs only the replicas its own layers' rearrangements moved."""
        self.expected: Rearrangement | None = None
        """The trigger's rearrangement, to record with its figures at the next change of the map."""
        self._mark: IntArray | None = None
        self._weights: FloatArray | None = None
        """The rank map of the last build."""
        self._committing: set[int] | None = None
        """Layers whose map changed in the last rearrangement (None: none yet)."""
        self._expected_commit = False
        """That rearrangement is the trigger's: its figures hold every layer's moves."""
        self._commit_target: FloatArray | None = None
        """The trigger's rank map being committed: its commit is over once the map is this."""
        self._routed_flushes = 0
        """Periodic builds since the last change that routed tokens on an unchanged map."""

    @property
    def window_active_flushes(self) -> int:
        return self._window.active_flushes

    def rank_weights(self) -> tuple[FloatArray, str]:
        """The rank map the gauges use now (EPLB's live map, vLLM's EP layout or virtual EP) and its source."""
        return self._rank_weights()

    def log(self) -> PlacementLog:
        """The placement log (created on first use)."""
        if self.placement_log is None:
            self.placement_log = PlacementLog()
        return self.placement_log

    def record(self, rearrangement: Rearrangement) -> None:
        """Log the trigger's rearrangement with its figures (where this worker keeps the log)."""
        if self.records_placement:
            self.log().rearranged(duration_s=rearrangement.duration_s, experts_moved=rearrangement.experts_moved,
                                  balance=rearrangement.balance)  # fmt: skip

    def mark_rearrangement(self) -> None:
        """Measure balance "after" from the counts routed from now on (call right after a rearrangement).

        The routing window restarts too, as the embedded engine's does after a placement change: the
        gauges then measure the new placement on routing it served, not old loads on a new map."""
        self._mark = None if self._last is None else self._last.copy()
        self._window = LoadWindow(self._window.size)

    def build(self, counts: IntArray, *, new_slot: bool = True) -> ExpertLoadSnapshot:
        """The snapshot of ``counts``; ``new_slot``: a periodic flush (see :meth:`LoadWindow.add`).

        When the rank map differs from the last build's, vLLM rearranged in between: the counts since
        then went to the old map (mostly: they straddle the change) and close its window, which restarts."""
        delta = counts if self._last is None else counts - self._last
        self._last = counts.copy()
        weights, source = self._rank_weights()
        window = self._window.add(delta, new_slot=new_slot)
        changed = self._changed_layers(weights)
        if changed is not None:
            self._rearranged(changed, window, weights)
            window = np.zeros_like(window)
        elif delta.any() and new_slot:
            self._routed_flushes += 1
        if self._weights is not None and self._weights.shape != weights.shape:
            self.end_commit()  # another rank map's shape (elastic EP): no commit goes on across it
        self._weights = weights
        self.window_expert_tokens = window
        step_ranks = rank_loads(delta, weights).sum(axis=0)
        if self._rank_total is None or self._rank_total.shape != step_ranks.shape:
            self._rank_total = np.zeros_like(step_ranks)
        self._rank_total = self._rank_total + step_ranks
        return ExpertLoadSnapshot(
            model_name=self.model_name,
            engine=self.engine,
            layer_ids=self.layer_ids,
            expert_tokens_total=counts.copy(),
            rank_tokens_total=self._rank_total.copy(),
            window_rank_tokens=rank_loads(window, weights),
            rank_source=source,
            placement=self._placement_json(counts, weights),
            engine_moe_layers=self.engine_moe_layers,
        )

    def _changed_layers(self, weights: FloatArray) -> npt.NDArray[np.bool_] | None:
        """Per layer, whether its rank map changed since the last build (None: none did)."""
        previous = self._weights
        if previous is None or previous.shape != weights.shape or weights.ndim != 3:
            return None  # a static layout (2-D) never changes
        changed = np.asarray(~np.isclose(previous, weights).all(axis=(1, 2)), dtype=np.bool_)
        return changed if changed.any() else None

    def _rearranged(self, changed: npt.NDArray[np.bool_], window: IntArray, weights: FloatArray) -> None:
        """Count a rearrangement once, however many builds its commit spans (vLLM's async EPLB commits one
        layer per step, in layer order, and flushes fall between those steps): see :meth:`_continues`.
        Measured balance "after" starts here, as the window does."""
        previous = self._weights
        assert previous is not None
        layers = set(np.flatnonzero(changed).tolist())
        expected, self.expected = self.expected, None
        if expected is not None and not expected.matches(weights, changed):
            expected = None  # vLLM committed another map: the trigger's was dropped, this one is vLLM's own
        new = expected is not None or not self._continues(layers, previous)
        # (layer, expert, rank) triples new to a rank: replicas copied there.
        moved = int(((weights > 0) & ~(previous > 0)).sum())
        if not self.records_placement:
            self.log().moved(moved)  # a later pipeline stage: its own layers' replicas, the first counts the swap
        elif expected is not None:
            self.record(expected)
        elif new:
            self.log().rearranged(duration_s=None, experts_moved=moved,
                                  balance={"measured_before": balance_summary(rank_loads(window, previous))})
        elif not self._expected_commit:
            self.log().moved(moved)  # the same rearrangement's next layers (the trigger's figures hold them all)
        if new:
            self._committing, self._expected_commit = layers, expected is not None
            self._commit_target = None if expected is None else expected.target
        else:
            self._committing = (self._committing or set()) | layers
        self._routed_flushes = 0
        self.mark_rearrangement()

    def end_commit(self) -> None:
        """The rearrangement is whole (the trigger's, committed within its request): the next change is another."""
        self._committing, self._commit_target, self._routed_flushes = None, None, 0

    def _continues(self, layers: set[int], previous: FloatArray) -> bool:
        """Whether the ``layers`` that changed go on committing the last rearrangement.  vLLM's async EPLB commits
        one layer per step, in layer order, with routed steps between (a flush can fall there): so not when a
        layer of it changes again, nor after more than a few periodic flushes routed on a steady map (vLLM's
        periodic rearrangements are thousands of steps apart), nor once the trigger's map was whole before this
        change, nor, for vLLM's own, when the change does not carry on upwards after routing."""
        committing, target, gap = self._committing, self._commit_target, self._routed_flushes
        if committing is None or layers & committing:
            return False
        if target is not None:  # the trigger's: known whole once the map is its target
            whole = target.shape != previous.shape or np.allclose(target, previous)
            return gap <= MAX_TARGET_GAP_FLUSHES and not whole
        # vLLM commits the layers between unchanged too, a step each: the gap allowed grows with the distance.
        distance = min(layers) - max(committing)
        return gap == 0 or (distance > 0 and gap <= MAX_COMMIT_GAP_FLUSHES * distance)

    def _placement_json(self, counts: IntArray, weights: FloatArray) -> dict[str, Any] | None:
        if self.placement_log is None:
            return None
        after = None
        if self._mark is not None and self._mark.shape == counts.shape and (counts - self._mark).any():
            after = balance_summary(rank_loads(counts - self._mark, weights))
        return self.placement_log.to_json(measured_after=after)
