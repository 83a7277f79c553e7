"""The load history the forecasters learn from, kept across restarts and leader takeovers.

Each tick the service records every policy's offered request and token rates
(the engines' plus what an entry router refused, :func:`controller.entry_demand.offered_load`)
(one sample per tick, at wall-clock time: monotonic clocks do not survive a
restart).  The leader writes them to the store in hourly chunks (a follower keeps only each policy's
current one, which it continues once promoted); a controller
that starts (or a policy seen for the first time) warm-starts its forecaster
from Prometheus when one is configured (``query_range`` over the same rate
queries the source uses: the engines' rates, without the requests an entry
router refused, which the store's history includes), else from the store.  Samples are resampled onto the
tick grid, and bins the controller did not see (it was down) are filled with the
last value before them, so a daily season stays aligned; a gap longer than the live
forecaster fills (a season) is not made up: only what came after it seeds the
forecaster, and nothing does when the gap runs up to now.

The store keeps the history by policy name, and only what was recorded since the
policy's creation is read back: one deleted and created again (for another model,
say) starts without the deleted one's load.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from contracts.errors import MoesloError, UnavailableError
from controller.core import DecisionCore
from controller.entry_demand import offered_load
from controller.forecast import ForecastConfig
from controller.forecast.history import DAY_S
from controller.policy import Policy
from controller.slo import format_duration
from controller.sources.base import (
    GENERATION_TOKENS_TOTAL,
    PROMPT_TOKENS_TOTAL,
    RATE_WINDOW_S,
    REQUESTS_TOTAL,
    model_matcher,
)
from controller.sources.prometheus import PrometheusClient
from controller.store import Store, StoredPolicy
from controller.tasks import run_to_end
from controller.types import LoadHistory, PolicyObservation

log = logging.getLogger(__name__)

__all__ = ["LOAD_HISTORY_CHUNK_S", "LoadHistoryKeeper", "LoadHistoryRecorder", "prometheus_load_history", "resample"]

LOAD_HISTORY_CHUNK_S = 3600.0
MAX_POINTS_PER_QUERY = 10_000
"""Prometheus refuses a range query of more than 11,000 points per series."""

Sample = list[float]
"""``[wall_time_s, request_rate_rps, prompt_tokens_per_s, output_tokens_per_s]``"""


def resample(
    samples: Sequence[Sequence[float]], *, bin_s: float, until_s: float | None = None, max_fill_bins: int | None = None
) -> LoadHistory:
    """Samples at wall times onto bins of ``bin_s`` ending at ``until_s`` (default: the last sample).

    Each bin takes the last sample that falls in it; empty bins repeat the value before them, up to
    ``max_fill_bins`` in a row (None: any).  As the live forecaster restarts after a longer gap
    (:meth:`AutoForecaster.skip`), only the bins after the last one are kept, and none when it runs to ``until_s``.
    """
    rows = sorted((s for s in samples if all(math.isfinite(x) for x in s[:4])), key=lambda s: s[0])
    if not rows:
        return LoadHistory((), (), ())
    start = rows[0][0]
    end = rows[-1][0] if until_s is None else max(until_s, rows[-1][0])
    n = int((end - start) // bin_s) + 1
    values = np.full((n, 3), np.nan)
    for t, *rest in rows:
        values[min(int((t - start) // bin_s), n - 1)] = rest[:3]
    first = _first_after_long_gap(np.flatnonzero(~np.isnan(values[:, 0])), n, max_fill_bins)
    if first is None:
        return LoadHistory((), (), ())
    values = values[first:]
    for i in range(1, len(values)):  # forward fill what the controller did not see
        if np.isnan(values[i, 0]):
            values[i] = values[i - 1]
    return LoadHistory(values[:, 0].tolist(), values[:, 1].tolist(), values[:, 2].tolist())


def _first_after_long_gap(seen: np.ndarray, n: int, max_fill_bins: int | None) -> int | None:
    """The first seen bin after the last run of more than ``max_fill_bins`` unseen ones (of ``n`` bins; the bin
    after the last is where the next live observation lands); None when that run ends the series."""
    if max_fill_bins is None:
        return 0
    edges = np.append(seen, n)
    long_gaps = np.flatnonzero(np.diff(edges) - 1 > max_fill_bins)
    if not len(long_gaps):
        return 0
    after = int(edges[long_gaps[-1] + 1])
    return None if after == n else after


@dataclass
class LoadHistoryRecorder:
    """The current chunk of every policy's samples; :meth:`dirty_chunks` says what to write."""

    chunk_s: float = LOAD_HISTORY_CHUNK_S
    _chunks: dict[str, tuple[float, list[Sample]]] = field(default_factory=dict)
    _dirty: dict[tuple[str, float], list[Sample]] = field(default_factory=dict)

    def record(self, policy: str, wall_s: float, rate: float, prompt: float, output: float) -> None:
        start = wall_s - wall_s % self.chunk_s
        chunk = self._chunks.get(policy)
        if chunk is None or chunk[0] != start:
            chunk = self._chunks[policy] = (start, [])
        chunk[1].append([round(wall_s, 3), rate, prompt, output])
        self._dirty[(policy, start)] = chunk[1]

    def dirty_chunks(self) -> list[tuple[str, float, list[Sample]]]:
        """Chunks changed since the last call (the current chunk is rewritten whole)."""
        out = [(policy, start, list(samples)) for (policy, start), samples in self._dirty.items()]
        self._dirty.clear()
        return out

    def keep_current_only(self) -> None:
        """Forget the chunks each policy has moved past: a follower writes none, and on promotion only the current
        one is continued (the leader wrote the others)."""
        self._dirty = {key: samples for key, samples in self._dirty.items()
                       if key[0] in self._chunks and self._chunks[key[0]][0] == key[1]}  # fmt: skip

    def forget(self, policy: str) -> None:
        self._chunks.pop(policy, None)
        self._dirty = {k: v for k, v in self._dirty.items() if k[0] != policy}


async def prometheus_load_history(
    client: PrometheusClient,
    policies: Sequence[Policy],
    *,
    start_s: float,
    end_s: float,
    step_s: float,
    selector: str = "",
    rate_window_s: float = RATE_WINDOW_S,
) -> Mapping[str, list[Sample]]:
    """Per policy, the request and token rates Prometheus holds over ``[start_s, end_s]`` (wall clock).

    The same rates the source reads each tick, in chunks under Prometheus's point limit.
    """
    if not policies:
        return {}
    matchers = ",".join(m for m in (model_matcher([p.model_name for p in policies]), selector.strip(",")) if m)
    window = format_duration(rate_window_s)
    queries = [f"sum by (model_name) (rate({metric}{{{matchers}}}[{window}]))"
               for metric in (REQUESTS_TOTAL, PROMPT_TOKENS_TOTAL, GENERATION_TOKENS_TOTAL)]
    span = MAX_POINTS_PER_QUERY * step_s
    windows = [(t, min(t + span, end_s)) for t in np.arange(start_s, end_s, span)]
    by_model: dict[str, dict[float, list[float]]] = {}
    for index, promql in enumerate(queries):
        answers = await asyncio.gather(
            *(client.query_range(promql, start_s=float(a), end_s=float(b), step_s=step_s) for a, b in windows)
        )
        for answer in answers:
            for labels, points in answer:
                series = by_model.setdefault(labels.get("model_name", ""), {})
                for t, value in points:
                    series.setdefault(t, [math.nan, math.nan, math.nan])[index] = value
    out: dict[str, list[Sample]] = {}
    for policy in policies:
        by_time = by_model.get(policy.model_name)
        if by_time:
            out[policy.name] = [[t, *values] for t, values in sorted(by_time.items()) if not math.isnan(values[0])]
    return out


class LoadHistoryKeeper:
    """Records every policy's load each tick, writes it (leader), and warm-starts new policies."""

    def __init__(
        self,
        store: Store,
        *,
        bin_s: float,
        keep_s: float,
        wall_clock: Callable[[], float] = time.time,
        prometheus: PrometheusClient | None = None,
        selector: str = "",
        rate_window_s: float = RATE_WINDOW_S,
        flush_every_ticks: int = 4,
        season_s: float | None = DAY_S,
    ) -> None:
        """``season_s`` is the forecasters' (:class:`ForecastConfig`): a warm start fills no gap they would not."""
        self.rate_window_s = rate_window_s
        self.max_fill_bins = ForecastConfig(bin_s=bin_s, horizon_s=bin_s, season_s=season_s).max_fill_bins
        self.store = store
        self.bin_s = bin_s
        self.keep_s = keep_s
        self.wall_clock = wall_clock
        self.prometheus = prometheus
        self.selector = selector
        self.flush_every_ticks = flush_every_ticks
        self.recorder = LoadHistoryRecorder()
        self.warmed: dict[str, tuple[str, int]] = {}
        """Per policy warm-started in this process: (where the history came from, ticks of it)."""
        self._ticks = 0

    async def warm_start(self, core: DecisionCore, stored: Sequence[StoredPolicy]) -> None:
        """Seed the forecasters of policies this process has not seen yet."""
        created_s = {s.policy.name: s.created_at.timestamp() for s in stored}
        new = [s.policy for s in stored if s.policy.name not in self.warmed]
        if not new:
            return
        now = self.wall_clock()
        start = now - self.keep_s
        found: dict[str, list[Sample]] = {}
        origin = "store"
        if self.prometheus is not None:
            try:
                found = dict(await prometheus_load_history(
                    self.prometheus, new, start_s=start, end_s=now, step_s=self.bin_s, selector=self.selector,
                    rate_window_s=self.rate_window_s,
                ))
                origin = "prometheus"
            except UnavailableError as exc:
                log.warning("warm start from Prometheus failed (%s); using the store", exc)
        for policy in new:
            samples = found.get(policy.name)
            where = origin
            if not samples:
                where = "store"
                try:
                    samples = await asyncio.to_thread(self.store.load_history, policy.name, since_s=start)
                except MoesloError as exc:
                    log.warning("load history of %s unreadable: %s", policy.name, exc)
                    samples = []
                samples = [s for s in samples if s[0] >= created_s[policy.name]]  # not a deleted namesake's
            # In a worker thread (~80 ms a policy with two weeks of history, on the loop it held API reads and
            # scrapes), run to its end when the warm start's time runs out: the tick must not touch the core
            # while it is seeded.
            try:
                await run_to_end(asyncio.to_thread(self._seed, core, policy, samples, now, where))
            except asyncio.CancelledError:
                self._cut_off(new)
                raise

    def _cut_off(self, new: Sequence[Policy]) -> None:
        """The tick's time ran out: the policies not reached yet are observed live this tick, and a forecaster that
        has live ticks takes no history after them, so they start without one (status: none), not later."""
        missed = [policy.name for policy in new if policy.name not in self.warmed]
        if missed:
            log.warning("warm start cut off by its time limit: %s start without their load history",
                        ", ".join(missed))
        for name in missed:
            self.warmed[name] = ("", 0)

    def _seed(self, core: DecisionCore, policy: Policy, samples: Sequence[Sample], now_s: float, where: str) -> None:
        """Seed the core's forecaster for ``policy`` and record the bins taken (0: none, or an advisor that had
        already observed the policy live ignored them, and status then says none).  Recorded here, in the thread:
        a warm start cut off while it ran still seeded the policy."""
        history = resample(samples, bin_s=self.bin_s, until_s=now_s - self.bin_s, max_fill_bins=self.max_fill_bins)
        self.warmed[policy.name] = (where, len(history) if len(history) and core.warm_start(policy, history) > 0 else 0)

    def record(self, observations: Mapping[str, PolicyObservation]) -> None:
        wall_s = self.wall_clock()
        for name, obs in observations.items():
            load = offered_load(obs)  # what clients asked for, refusals at the entry router included
            if load is not None:
                self.recorder.record(name, wall_s, load.request_rate_rps, load.prompt_tokens_per_s,
                                     load.output_tokens_per_s)

    async def after_tick(self, *, leader: bool, policies: Sequence[str]) -> None:
        """Write changed chunks every few ticks, and prune now and then (leader only) old chunks and those of any
        policy not in ``policies``: every stored one, an unreadable one too (a newer version's, to come back)."""
        self._ticks += 1
        if not leader:
            self.recorder.keep_current_only()  # else a standby holds every chunk it ever recorded
            return
        if self._ticks % self.flush_every_ticks:
            return
        chunks = self.recorder.dirty_chunks()
        try:
            if chunks:
                await asyncio.to_thread(self.store.save_load_history, chunks)
            if self._ticks % (25 * self.flush_every_ticks) == 0:
                before = self.wall_clock() - self.keep_s - LOAD_HISTORY_CHUNK_S
                await asyncio.to_thread(self.store.prune_load_history, before_s=before, keep_policies=policies)
        except MoesloError as exc:
            log.warning("load history write failed: %s", exc)

    def forget(self, policy: str) -> None:
        self.recorder.forget(policy)
        self.warmed.pop(policy, None)
