"""The simulated fleet, request by request: replicas as queues with the profiled capacity.

Each replica follows the latency model of :mod:`controller.capacity` (the same
profile, the same equations, but per request rather than on average):

- prompts wait FIFO for the replica's prefill; a prompt is prefilled at
  ``profile.prefill_rate(b)`` with ``b`` sequences decoding beside it;
- a request is admitted only when its prompt plus output fit the free KV cache and a
  sequence slot is free; otherwise it waits for the earliest decoding request to end;
- its mean inter-token latency is ``step(b) / (1 - rho_p)``, with ``rho_p`` the
  replica's prefill share of the last tick;
- new replicas serve after ``startup_s``; removed replicas take no new requests.

Requests go to the least-loaded ready replica (prefill backlog plus decode work).
Replica time is billed from the scale-up order (a starting pod holds its GPU) to the
scale-down order.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from contracts.slo_defaults import ITL_THRESHOLD_S, TTFT_THRESHOLD_S
from contracts.traces import FloatArray, RequestTrace
from controller.capacity import ReplicaProfile
from controller.types import PolicyObservation, SliSnapshot


@dataclass(eq=False, slots=True)
class _Replica:
    ready_at_s: float
    prefill_free_s: float = 0.0
    kv_used: int = 0
    decoding: list[tuple[float, int]] = field(default_factory=list)
    """Heap of (end time, KV tokens) of admitted requests."""
    prefill_tokens_tick: float = 0.0
    rho_prefill: float = 0.0

    def release_until(self, t: float) -> None:
        heap = self.decoding
        while heap and heap[0][0] <= t:
            self.kv_used -= heapq.heappop(heap)[1]


@dataclass(frozen=True, kw_only=True, slots=True)
class FleetTotals:
    requests: int
    good_both: int
    good_ttft: int
    good_itl: int
    replica_seconds: float
    scale_events: int


class Provisioned:
    """Replica count bookkeeping shared by both fleets: orders, start-up, billing, events."""

    def __init__(self, startup_s: float) -> None:
        self.startup_s = startup_s
        self.replica_seconds = 0.0
        self.scale_events = 0
        self._billed_until_s = 0.0

    def bill(self, now_s: float, provisioned: int) -> None:
        if now_s > self._billed_until_s:
            self.replica_seconds += provisioned * (now_s - self._billed_until_s)
            self._billed_until_s = now_s


class RequestFleet:
    """Per-request replay of one trace against a fleet whose size a policy sets."""

    def __init__(
        self,
        trace: RequestTrace,
        profile: ReplicaProfile,
        *,
        initial_replicas: int,
        startup_s: float,
        tick_s: float,
        ttft_target_s: float = TTFT_THRESHOLD_S,
        itl_target_s: float = ITL_THRESHOLD_S,
        sli_window_s: float = 60.0,
    ) -> None:
        self.trace = trace
        self.profile = profile
        self.tick_s = tick_s
        self.ttft_target_s = ttft_target_s
        self.itl_target_s = itl_target_s
        self.book = Provisioned(startup_s)
        self.replicas: list[_Replica] = [_Replica(ready_at_s=0.0) for _ in range(initial_replicas)]
        self.ttft_s = np.full(len(trace), np.nan)
        self.itl_s = np.full(len(trace), np.nan)
        self.start_s = np.full(len(trace), np.nan)
        self._next = 0
        self._last_observe_s = 0.0
        self._since_observe = 0
        self._recent: deque[tuple[float, int, int]] = deque()
        self._sli_window_s = sli_window_s
        self._kv_cap = profile.kv_capacity_tokens
        self._chunk = float(profile.prefill_chunk_tokens)
        self._raw_prefill = profile.prefill_tokens_per_s

    @property
    def provisioned(self) -> int:
        return len(self.replicas)

    def ready(self, now_s: float) -> list[_Replica]:
        return [r for r in self.replicas if r.ready_at_s <= now_s]

    def scale_to(self, replicas: int, now_s: float) -> None:
        replicas = max(replicas, 0)
        current = len(self.replicas)
        if replicas == current:
            return
        self.book.bill(now_s, current)
        self.book.scale_events += 1
        if replicas > current:
            self.replicas.extend(_Replica(ready_at_s=now_s + self.book.startup_s) for _ in range(replicas - current))
            return

        # Cancel starting replicas first (newest first), then drop the least-loaded ready ones.
        def load(r: _Replica) -> tuple[int, float, float]:
            return (
                0 if r.ready_at_s > now_s else 1,
                -r.ready_at_s if r.ready_at_s > now_s else 0.0,
                max(r.prefill_free_s - now_s, 0.0) + len(r.decoding) * self.profile.itl_per_seq_s,
            )

        self.replicas.sort(key=load)
        del self.replicas[: current - replicas]

    # long: the per-request hot loop of a replay (millions of requests); its locals are hoisted for speed.
    def advance(self, until_s: float) -> None:
        """Route and serve every request arriving before ``until_s``."""
        trace = self.trace
        arrival = trace.arrival_s
        end = int(np.searchsorted(arrival, until_s, side="left"))
        start_index = self._next
        if end <= start_index:
            self._next = max(end, start_index)
            return
        prompts = trace.prompt_tokens
        outputs = trace.output_tokens
        profile = self.profile
        base = profile.itl_base_s
        slope = profile.itl_per_seq_s
        overhead = profile.ttft_overhead_s
        chunk = self._chunk
        raw = self._raw_prefill
        kv_cap = self._kv_cap
        max_seqs = profile.max_num_seqs
        refresh_every_s = 0.5
        next_refresh = -math.inf
        ready: list[_Replica] = []
        backlog = np.zeros(0)
        decoders = np.zeros(0)
        ttft_out = self.ttft_s
        itl_out = self.itl_s
        start_out = self.start_s
        for i in range(start_index, end):
            t = float(arrival[i])
            if t >= next_refresh:
                ready = self.ready(t)
                for replica in ready:
                    replica.release_until(t)
                backlog = np.array([r.prefill_free_s for r in ready], dtype=np.float64)
                decoders = np.array([len(r.decoding) for r in ready], dtype=np.float64)
                next_refresh = t + refresh_every_s
            if not ready:
                # No replica serves yet: the request waits for the first one to come up.
                pending = [r for r in self.replicas]
                if not pending:
                    ttft_out[i] = math.inf
                    itl_out[i] = math.inf
                    continue
                replica = min(pending, key=lambda r: r.ready_at_s)
                choice = -1
            else:
                score = np.maximum(backlog - t, 0.0) + decoders * slope
                choice = int(np.argmin(score))
                replica = ready[choice]
            prompt = int(prompts[i])
            output = int(outputs[i])
            need = min(prompt + output, kv_cap)
            begin = max(t, replica.prefill_free_s, replica.ready_at_s)
            replica.release_until(begin)
            heap = replica.decoding
            while heap and (replica.kv_used + need > kv_cap or len(heap) >= max_seqs):
                ended, tokens = heapq.heappop(heap)
                replica.kv_used -= tokens
                begin = max(begin, ended)
            running = len(heap) + 1
            step = base + slope * running
            prefill_rate = chunk / (step + chunk / raw)
            first_token = begin + overhead + prompt / prefill_rate
            replica.prefill_free_s = first_token
            replica.prefill_tokens_tick += prompt
            itl = step / (1.0 - min(replica.rho_prefill, 0.95))
            heapq.heappush(heap, (first_token + max(output - 1, 0) * itl, need))
            replica.kv_used += need
            ttft_out[i] = first_token - t
            itl_out[i] = itl
            start_out[i] = begin
            if choice >= 0:
                backlog[choice] = first_token
                decoders[choice] += 1
        self._next = end

    def observe(self, now_s: float) -> PolicyObservation:
        """What a metrics source would report now: rates over the last tick, queue, SLIs."""
        self.book.bill(now_s, len(self.replicas))
        elapsed = max(now_s - self._last_observe_s, 1e-9)
        lo = int(np.searchsorted(self.trace.arrival_s, self._last_observe_s, side="left"))
        hi = self._next
        rate = (hi - lo) / elapsed
        prompt_rate = float(self.trace.prompt_tokens[lo:hi].sum()) / elapsed
        output_rate = float(self.trace.output_tokens[lo:hi].sum()) / elapsed
        ready = self.ready(now_s)
        running = 0
        kv = 0.0
        for replica in ready:
            replica.release_until(now_s)
            running += len(replica.decoding)
            kv += replica.kv_used / self._kv_cap
            replica.rho_prefill = min(replica.prefill_tokens_tick / (elapsed * self._raw_prefill), 0.95)
            replica.prefill_tokens_tick = 0.0
        window_lo = int(np.searchsorted(self.trace.arrival_s, now_s - self._sli_window_s, side="left"))
        starts = self.start_s[window_lo:hi]
        queue = int(np.count_nonzero(starts > now_s))
        # SLIs over requests whose first token came in the window (a scrape sees finished timings).
        ttft = self.ttft_s[window_lo:hi]
        itl = self.itl_s[window_lo:hi]
        done = np.isfinite(ttft) & (self.trace.arrival_s[window_lo:hi] + ttft <= now_s)
        sli = None
        if np.count_nonzero(done) >= 1:
            t_done = ttft[done]
            i_done = itl[done]
            sli = SliSnapshot(
                observed_at_s=now_s,
                window_s=self._sli_window_s,
                requests_in_window=float(len(t_done)),
                ttft_good_ratio=float(np.mean(t_done <= self.ttft_target_s)),
                itl_good_ratio=float(np.mean(i_done <= self.itl_target_s)),
                ttft_p99_s=float(np.quantile(t_done, 0.99)),
                itl_p99_s=float(np.quantile(i_done, 0.99)),
            )
        self._last_observe_s = now_s
        return PolicyObservation(
            policy="replay",
            observed_at_s=now_s,
            current_replicas=len(self.replicas),
            ready_replicas=len(ready),
            queue_depth=float(queue),
            running_requests=float(running),
            request_rate_rps=rate,
            prompt_tokens_per_s=prompt_rate,
            output_tokens_per_s=output_rate,
            kv_cache_usage=kv / len(ready) if ready else None,
            sli=sli,
        )

    def totals(self, end_s: float) -> FleetTotals:
        self.book.bill(end_s, len(self.replicas))
        served = self._next
        ttft = self.ttft_s[:served]
        itl = self.itl_s[:served]
        good_ttft = ttft <= self.ttft_target_s
        good_itl = itl <= self.itl_target_s
        return FleetTotals(
            requests=served,
            good_both=int(np.count_nonzero(good_ttft & good_itl)),
            good_ttft=int(np.count_nonzero(good_ttft)),
            good_itl=int(np.count_nonzero(good_itl)),
            replica_seconds=self.book.replica_seconds,
            scale_events=self.book.scale_events,
        )


def tick_loads(trace: RequestTrace, tick_s: float, n_ticks: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Requests/s, prompt tokens/s and output tokens/s per tick of a request trace."""
    index = np.minimum((trace.arrival_s // tick_s).astype(np.int64), n_ticks - 1)
    count = np.bincount(index, minlength=n_ticks)[:n_ticks] / tick_s
    prompt = np.bincount(index, weights=trace.prompt_tokens, minlength=n_ticks)[:n_ticks] / tick_s
    output = np.bincount(index, weights=trace.output_tokens, minlength=n_ticks)[:n_ticks] / tick_s
    return count.astype(np.float64), prompt.astype(np.float64), output.astype(np.float64)
