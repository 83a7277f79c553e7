"""The simulated fleet, request by request: replicas as queues with the true world's capacity.

Each replica follows the latency model of :mod:`controller.capacity`, per request
rather than on average, with the *true* profile of :mod:`controller.replay.world`
(which the controllers do not know):

- prompts wait FIFO for the replica's prefill; a prompt is prefilled at
  ``profile.prefill_rate(b)`` with ``b`` sequences decoding beside it;
- a request is admitted only when its prompt plus output fit the free KV cache and a
  sequence slot is free; otherwise it waits for the earliest decoding request to end;
- it decodes at ``step(b)`` a token, ``b`` counting it, except that every prompt the replica
  prefills while it decodes takes its chunks' compute time out of its decode
  (:class:`controller.replay.decode_clock.DecodeClock`): its mean inter-token latency is its decode
  span over its output tokens less one, known when it ends;
- new replicas serve after their start-up; removed replicas take no new requests;
- for traces that name their prompts' KV blocks (Mooncake's ``hash_ids``), each replica
  keeps an LRU cache of blocks (:mod:`controller.replay.prefix_cache`) and prefills only
  a prompt's uncached tokens (a cached token still costs the profile's ``cached_token_cost``
  of a computed one, as in the capacity model).

Requests go to the least-loaded ready replica, or where a routing hook says (``route``: the entry
router's own policies, :mod:`bench.router_replay`) (prefill backlog plus decode work, plus
the prefill of the prompt's uncached tokens there when blocks are known: Mooncake's
cache-aware scheduling).  TTFT is judged by the objective's long-prompt allowance
(:mod:`contracts.ttft_objective`), the same definition the engines' histogram uses.
At the end of each tick the fleet reports a :class:`TickSample` (gauges, and what
finished in the tick, its latencies as the engines' histograms count them: a request's
TTFT once, its mean inter-token latency once for each of its token gaps) for
:class:`controller.replay.signals.MetricsPipeline`.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from contracts.catalogue import ITL_BUCKETS_S, PROMPT_TOKENS_BUCKETS, TTFT_BUCKETS_S
from contracts.slo_defaults import ITL_THRESHOLD_S, TTFT_THRESHOLD_S
from contracts.traces import PREFIX_BLOCK_TOKENS, FloatArray, IntArray, RequestTrace
from contracts.ttft_objective import FLAT, TtftAllowance
from controller.replay.decode_clock import DecodeClock
from controller.replay.prefix_cache import BlockCache, best_case_uncached
from controller.replay.scoring import TickOutcomes
from controller.replay.signals import TickSample, cumulative_counts
from controller.replay.world import ProfileCache, World, startup_times

__all__ = ["RequestFleet", "RouteHook", "StartingReplicas", "tick_loads"]

RouteHook = Callable[[int, float, FloatArray, FloatArray, FloatArray], int]
"""(request index, arrival s, each ready replica's prefill-free time s, its admitted requests, its KV tokens
in use) -> the index of the ready replica to send the request to."""


@dataclass(eq=False, slots=True)
class _Replica:
    ready_at_s: float
    prefill_free_s: float = 0.0
    kv_used: int = 0
    decoding: list[tuple[float, int, int]] = field(default_factory=list)
    """Heap of (end in decode time, KV tokens, request index) of admitted requests."""
    clock: DecodeClock = field(default_factory=DecodeClock)
    cache: BlockCache | None = None
    serial: int = 0
    """This replica's number in its fleet (the requests it was sent are recorded by it)."""


class StartingReplicas:
    """Start-up draws shared by both fleets: every policy's n-th new replica takes the same time."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._rng = world.startup_draws()

    def ready_times(self, now_s: float, count: int) -> list[float]:
        return [now_s + s for s in startup_times(self.world, self._rng, count)]


class RequestFleet:
    """Per-request replay of one trace against a fleet whose size a policy sets."""

    def __init__(
        self,
        trace: RequestTrace,
        world: ProfileCache,
        *,
        initial_replicas: int,
        tick_s: float,
        ttft_target_s: float = TTFT_THRESHOLD_S,
        itl_target_s: float = ITL_THRESHOLD_S,
        ttft_allowance: TtftAllowance = FLAT,
        route: RouteHook | None = None,
    ) -> None:
        self.trace = trace
        self.route = route
        self.world = world
        self.tick_s = tick_s
        self.ttft_target_s = ttft_target_s
        self.itl_target_s = itl_target_s
        self.ttft_allowance = ttft_allowance
        self.starting = StartingReplicas(world.world)
        self._cache_blocks = world.nominal.kv_capacity_tokens // PREFIX_BLOCK_TOKENS
        self._serials = 0
        self.replicas: list[_Replica] = [self._replica(0.0) for _ in range(initial_replicas)]
        self._draining: list[float] = []
        """When each removed replica finishes what it still held: it runs, and is paid for, until then."""
        n = len(trace)
        self.replica_of = np.full(n, -1, dtype=np.int64)
        """The serial of the replica each request was sent to (-1: none)."""
        self.cached_tokens = np.zeros(n, dtype=np.int64)
        """Prompt tokens each request found in its replica's prefix cache."""
        self.ttft_s = np.full(n, np.inf)
        self.prefill_s = np.zeros(n)
        """Each request's prefill time once scheduled (no queue, no fixed overhead)."""
        self.itl_s = np.full(n, np.inf)
        self.start_s = np.full(n, np.inf)
        self.finish_s = np.full(n, np.inf)
        self._next = 0
        self._unfinished: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._unprefilled: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)

    def _replica(self, ready_at_s: float) -> _Replica:
        with_cache = self.trace.prefix_blocks is not None
        self._serials += 1
        cache = BlockCache(self._cache_blocks) if with_cache else None
        return _Replica(ready_at_s=ready_at_s, cache=cache, serial=self._serials - 1)

    @property
    def provisioned(self) -> int:
        return len(self.replicas)

    def billed(self, now_s: float) -> int:
        """Replicas paid for in the tick that ends at ``now_s``: those provisioned, and those removed that still
        served in it (a removed replica finishes what it holds; it used to drain unpaid)."""
        since_s = now_s - self.tick_s
        self._draining = [end for end in self._draining if end > since_s]
        return len(self.replicas) + len(self._draining)

    def ready(self, now_s: float) -> list[_Replica]:
        return [r for r in self.replicas if r.ready_at_s <= now_s]

    def ready_count(self, now_s: float) -> int:
        return sum(1 for r in self.replicas if r.ready_at_s <= now_s)

    def scale_to(self, replicas: int, now_s: float) -> bool:
        """Order or remove replicas; True when the count changed."""
        replicas = max(replicas, 0)
        current = len(self.replicas)
        if replicas == current:
            return False
        if replicas > current:
            self.replicas.extend(self._replica(t) for t in self.starting.ready_times(now_s, replicas - current))
            return True
        slope = self.world.nominal.itl_per_seq_s

        # Cancel starting replicas first (latest first), then drop the least-loaded ready ones.
        def load(r: _Replica) -> tuple[int, float, float]:
            starting = r.ready_at_s > now_s
            return (
                0 if starting else 1,
                -r.ready_at_s if starting else 0.0,
                max(r.prefill_free_s - now_s, 0.0) + len(r.decoding) * slope,
            )

        self.replicas.sort(key=load)
        for removed in self.replicas[: current - replicas]:
            last_s = self._settle_all(removed)  # it takes no more prompts: its clock is final
            if last_s > now_s:
                self._draining.append(last_s)
        del self.replicas[: current - replicas]
        return True

    def _end(self, replica: _Replica, end_decode_s: float, i: int) -> float:
        """Request ``i``'s finish on ``replica``, in wall time, recorded with its mean inter-token latency."""
        finish = replica.clock.real(end_decode_s)
        self.finish_s[i] = finish
        gaps = int(self.trace.output_tokens[i]) - 1
        if gaps > 0:  # else its latency stays the step it was admitted at
            first_token = float(self.trace.arrival_s[i]) + float(self.ttft_s[i])
            self.itl_s[i] = max(finish - first_token, 0.0) / gaps
        return finish

    def _release(self, replica: _Replica, t: float) -> None:
        """Free the slots and KV of ``replica``'s requests that have ended by ``t``."""
        heap = replica.decoding
        if not heap:
            return
        now = replica.clock.virtual(t)
        while heap and heap[0][0] <= now:
            end, tokens, i = heapq.heappop(heap)
            replica.kv_used -= tokens
            self._end(replica, end, i)

    def _settle_all(self, replica: _Replica) -> float:
        """Record the finish of every request still decoding on ``replica``, as if it took no more prompts; the
        last finish (0 with none)."""
        return max((self._end(replica, end, i) for end, _tokens, i in replica.decoding), default=0.0)

    # long: the per-request hot loop of a replay (millions of requests); its locals are hoisted for speed.
    def advance(self, until_s: float) -> None:
        """Route and serve every request arriving before ``until_s``."""
        trace = self.trace
        end = int(np.searchsorted(trace.arrival_s, until_s, side="left"))
        start_index = self._next
        if end <= start_index:
            self._next = max(end, start_index)
            return
        arrival = trace.arrival_s
        prompts = trace.prompt_tokens
        outputs = trace.output_tokens
        profile = self.world.profile_at(until_s - self.tick_s)
        base = profile.itl_base_s
        slope = profile.itl_per_seq_s
        overhead = profile.ttft_overhead_s
        chunk = float(profile.prefill_chunk_tokens)
        raw = profile.prefill_tokens_per_s
        saved = 1.0 - profile.cached_token_cost  # of a cached token's prefill
        kv_cap = profile.kv_capacity_tokens
        max_seqs = profile.max_num_seqs
        blocks = trace.prefix_blocks
        next_refresh = -math.inf
        ready: list[_Replica] = []
        backlog = np.zeros(0)
        decoders = np.zeros(0)
        hits = np.zeros(0, dtype=np.int64)
        kv_used = np.zeros(0)
        for i in range(start_index, end):
            t = float(arrival[i])
            if t >= next_refresh:
                ready = self.ready(t)
                for replica in ready:
                    self._release(replica, t)
                backlog = np.array([r.prefill_free_s for r in ready], dtype=np.float64)
                decoders = np.array([len(r.decoding) for r in ready], dtype=np.float64)
                kv_used = np.array([r.kv_used for r in ready], dtype=np.float64)
                next_refresh = t + 0.5
            if not ready:
                if not self.replicas:
                    continue  # no replica at all: the request is never served (inf everywhere)
                # No replica serves yet: the request waits for the first one to come up.
                replica = min(self.replicas, key=lambda r: r.ready_at_s)
                choice = -1
            elif self.route is not None:
                choice = self.route(i, t, backlog, decoders, kv_used)
                replica = ready[choice]
                if blocks is not None:
                    hits = np.array([r.cache.cached_tokens(blocks[i], int(prompts[i])) if r.cache else 0
                                     for r in ready])  # fmt: skip
            elif blocks is None:
                choice = int(np.argmin(np.maximum(backlog - t, 0.0) + decoders * slope))
                replica = ready[choice]
            else:
                hits = np.array([r.cache.cached_tokens(blocks[i], int(prompts[i])) if r.cache else 0 for r in ready])
                prefill_there = (prompts[i] - saved * hits) / raw
                choice = int(np.argmin(np.maximum(backlog - t, 0.0) + decoders * slope + prefill_there))
                replica = ready[choice]
            prompt = int(prompts[i])
            cached = 0
            if blocks is not None and replica.cache is not None:
                cached = int(hits[choice]) if choice >= 0 else replica.cache.cached_tokens(blocks[i], prompt)
                replica.cache.admit(blocks[i], prompt)
                self.cached_tokens[i] = cached
            output = int(outputs[i])
            need = min(prompt + output, kv_cap)
            begin = max(t, replica.prefill_free_s, replica.ready_at_s)
            self._release(replica, begin)
            heap = replica.decoding
            while heap and (replica.kv_used + need > kv_cap or len(heap) >= max_seqs):
                ended, tokens, j = heapq.heappop(heap)
                replica.kv_used -= tokens
                begin = max(begin, self._end(replica, ended, j))
            step = base + slope * (len(heap) + 1)
            work = prompt - saved * cached
            first_token = begin + overhead + work / (chunk / (step + chunk / raw))
            replica.prefill_free_s = first_token
            clock = replica.clock
            clock.add_prefill(begin + overhead, first_token, work / raw)
            heapq.heappush(heap, (clock.virtual(first_token) + max(output - 1, 0) * step, need, i))
            replica.kv_used += need
            self.ttft_s[i] = first_token - t
            self.prefill_s[i] = first_token - begin - overhead
            self.itl_s[i] = step
            self.start_s[i] = begin
            self.replica_of[i] = replica.serial
            if choice >= 0:
                backlog[choice] = first_token
                decoders[choice] += 1
                kv_used[choice] += need
        new = np.arange(start_index, end, dtype=np.int64)
        self._unfinished = np.r_[self._unfinished, new]
        self._unprefilled = np.r_[self._unprefilled, new]
        self._next = end

    def sample(self, now_s: float) -> TickSample:
        """Gauges now, and the counters' increments since the last sample."""
        ready = self.ready(now_s)
        for replica in self.replicas:  # starting ones too: requests wait on them
            self._release(replica, now_s)
            replica.clock.trim(now_s)  # later arrivals, releases and samples all come after now
        kv_sum = sum(r.kv_used for r in ready) / self.world.nominal.kv_capacity_tokens
        # A prompt is counted at its first token: TTFT runs from arrival, so its queue wait is already in it.
        unprefilled = self._unprefilled
        prefilled_mask = self.trace.arrival_s[unprefilled] + self.ttft_s[unprefilled] <= now_s + 1e-9
        prefilled = self._unprefilled[prefilled_mask & np.isfinite(self.ttft_s[self._unprefilled])]
        self._unprefilled = self._unprefilled[~prefilled_mask]
        done_mask = self.finish_s[self._unfinished] <= now_s
        done = self._unfinished[done_mask]
        self._unfinished = self._unfinished[~done_mask]
        started = self.start_s[self._unfinished] <= now_s
        raw_ttft = self.ttft_s[done]
        itl = self.itl_s[done]
        gaps = np.maximum(self.trace.output_tokens[done] - 1, 0).astype(np.float64)
        arrival = self.trace.arrival_s
        return TickSample(
            ready=len(ready),
            waiting=float(np.count_nonzero(~started)),
            running=float(np.count_nonzero(started)),
            kv_usage_sum=kv_sum,
            kv_demand_max=self._kv_demand_max(now_s, ready),
            finished=float(len(done)),
            prompt_tokens=float(self.trace.prompt_tokens[prefilled].sum()),
            prefix_queries=float(self.trace.prompt_tokens[prefilled].sum()),
            prefix_hits=float(self.cached_tokens[prefilled].sum()),
            prompt_le=cumulative_counts(self.trace.prompt_tokens[done].astype(np.float64), PROMPT_TOKENS_BUCKETS),
            ttft_le=cumulative_counts(self.normalized_ttft_s(done), TTFT_BUCKETS_S),
            itl_le=cumulative_counts(itl, ITL_BUCKETS_S, gaps),
            output_tokens=float(self.trace.output_tokens[done].sum()),
            finished_prompt_tokens=float(self.trace.prompt_tokens[done].sum()),
            prefill_s_sum=float(self.prefill_s[done].sum()),
            ttft_sum_s=float(raw_ttft.sum()),
            itl_sum_s=float(itl.sum()),
            duration_sum_s=float((self.finish_s[done] - arrival[done]).sum()),
        )

    def _kv_demand_max(self, now_s: float, ready: list[_Replica]) -> float:
        """The highest ready replica's KV demand over its capacity: each unfinished request sent to it holds its
        prompt and the tokens generated by now, one a step from its first token at its admission's step time
        (its finish is known only once it is released)."""
        if not ready:
            return 0.0
        live = self._unfinished
        first_token = self.trace.arrival_s[live] + self.ttft_s[live]
        with np.errstate(invalid="ignore"):  # never-served requests: inf / inf
            generated = np.nan_to_num((now_s - first_token) / self.itl_s[live], nan=0.0, posinf=0.0, neginf=0.0)
        tokens = self.trace.prompt_tokens[live] + np.clip(generated, 0.0, self.trace.output_tokens[live])
        per_replica = np.bincount(self.replica_of[live] + 1, weights=tokens, minlength=self._serials + 1)[1:]
        ready_serials = np.fromiter((r.serial for r in ready), dtype=np.int64, count=len(ready))
        return float(per_replica[ready_serials].max()) / self.world.nominal.kv_capacity_tokens

    def normalized_ttft_s(self, index: IntArray | None = None) -> FloatArray:
        """TTFT minus each request's long-prompt allowance (as the engines' normalized histogram records it)."""
        ttft = self.ttft_s if index is None else self.ttft_s[index]
        prompts = self.trace.prompt_tokens if index is None else self.trace.prompt_tokens[index]
        allowance = self.ttft_allowance
        if allowance.flat:
            return ttft
        extra = np.maximum(prompts - allowance.reference_prompt_tokens, 0) * allowance.per_1k_prompt_tokens_s / 1000.0
        return np.asarray(np.maximum(ttft - extra, 0.0), dtype=np.float64)

    def infeasible(self) -> npt.NDArray[np.bool_]:
        """Requests a replica of the true world misses even alone and with every earlier prefix cached."""
        uncached = best_case_uncached(self.trace.prompt_tokens, self.trace.prefix_blocks)
        allowance = self.ttft_allowance
        out = np.zeros(len(uncached), dtype=bool)
        for i, (prompt, computed, arrival) in enumerate(
            zip(self.trace.prompt_tokens.tolist(), uncached.tolist(), self.trace.arrival_s.tolist(), strict=True)
        ):
            profile = self.world.profile_at(arrival)
            out[i] = allowance.is_infeasible(
                prompt, self.ttft_target_s, overhead_s=profile.ttft_overhead_s,
                prefill_tokens_per_s=profile.chunked_prefill_rate(0.0),
                uncached_tokens=computed + profile.cached_token_cost * (prompt - computed),
            )  # fmt: skip
        return out

    def outcomes(self, ticks: int) -> TickOutcomes:
        """Per arrival tick: requests and how many met each SLO (provisioning filled in by the runner).

        Requests still decoding at the end are settled as if their replicas took no more prompts.
        """
        for replica in self.replicas:
            self._settle_all(replica)
        index = np.minimum((self.trace.arrival_s // self.tick_s).astype(np.int64), ticks - 1)
        good_ttft = self.normalized_ttft_s() <= self.ttft_target_s
        good_itl = self.itl_s <= self.itl_target_s

        def per_tick(weights: npt.NDArray[np.bool_] | FloatArray | None) -> FloatArray:
            return np.bincount(index, weights=weights, minlength=ticks)[:ticks].astype(np.float64)

        zeros = np.zeros(ticks, dtype=np.int64)
        return TickOutcomes(
            tick_s=self.tick_s,
            requests=per_tick(None),
            good_both=per_tick(good_ttft & good_itl),
            good_ttft=per_tick(good_ttft),
            good_itl=per_tick(good_itl),
            infeasible=per_tick(self.infeasible()),
            prompt_tokens=per_tick(self.trace.prompt_tokens.astype(np.float64)),
            cached_tokens=per_tick(self.cached_tokens.astype(np.float64)) if self.trace.prefix_blocks else None,
            provisioned=zeros,
            ready=zeros,
            scaled=np.zeros(ticks, dtype=bool),
        )


def tick_loads(trace: RequestTrace, tick_s: float, n_ticks: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Requests/s, prompt tokens/s and output tokens/s per tick of a request trace."""
    index = np.minimum((trace.arrival_s // tick_s).astype(np.int64), n_ticks - 1)
    count = np.bincount(index, minlength=n_ticks)[:n_ticks] / tick_s
    prompt = np.bincount(index, weights=trace.prompt_tokens, minlength=n_ticks)[:n_ticks] / tick_s
    output = np.bincount(index, weights=trace.output_tokens, minlength=n_ticks)[:n_ticks] / tick_s
    return count.astype(np.float64), prompt.astype(np.float64), output.astype(np.float64)


def insert_ready_times(ready_at: list[float], times: list[float]) -> None:
    """Keep ``ready_at`` sorted while adding new replicas' ready times."""
    for t in times:
        bisect.insort(ready_at, t)
