"""The aggregate (fluid) fleet: per-tick load against the capacity model's queueing equations.

For fleets of thousands of replicas and days of traffic, following every request
in Python is too slow.  The fluid fleet takes each tick's offered load (requests/s,
prompt and output tokens/s), spreads it evenly over the ready replicas, carries
prompt tokens that exceed the prefill capacity over to the next tick as a backlog,
and estimates the fraction of the tick's requests within each SLO:

- TTFT: the M/G/1 tail of :class:`controller.capacity.CapacityModel` plus the wait
  to clear the backlog;
- ITL: the Poisson spread of running sequences around their mean.

It uses the same latency model as the request-level fleet, so it is a check of
scaling behaviour and replica-hours at scale, not an independent latency measurement.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from contracts.traces import FloatArray
from controller.capacity import CapacityModel, Load, ReplicaProfile, Targets
from controller.replay.fleet import FleetTotals, Provisioned
from controller.types import PolicyObservation, SliSnapshot


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


class FluidFleet:
    """Per-tick aggregate replay; ``loads`` are per-tick rates (same length, one per tick)."""

    def __init__(
        self,
        rates_rps: FloatArray,
        prompt_tokens_per_s: FloatArray,
        output_tokens_per_s: FloatArray,
        profile: ReplicaProfile,
        *,
        initial_replicas: int,
        startup_s: float,
        tick_s: float,
        targets: Targets | None = None,
    ) -> None:
        self.rates = rates_rps
        self.prompt = prompt_tokens_per_s
        self.output = output_tokens_per_s
        self.profile = profile
        self.tick_s = tick_s
        self.targets = targets or Targets()
        self.model = CapacityModel(profile, self.targets)
        self.book = Provisioned(startup_s)
        self._ready_at: list[float] = [0.0] * initial_replicas
        self._tick = 0
        self._backlog_tokens = 0.0
        self.requests = 0.0
        self.good_ttft = 0.0
        self.good_itl = 0.0
        self.good_both = 0.0
        self._last: tuple[float, float, float, float, float, float] = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

    @property
    def provisioned(self) -> int:
        return len(self._ready_at)

    def ready_count(self, now_s: float) -> int:
        return bisect.bisect_right(self._ready_at, now_s)

    def scale_to(self, replicas: int, now_s: float) -> None:
        replicas = max(replicas, 0)
        current = len(self._ready_at)
        if replicas == current:
            return
        self.book.bill(now_s, current)
        self.book.scale_events += 1
        if replicas > current:
            self._ready_at.extend([now_s + self.book.startup_s] * (replicas - current))
        else:
            # Starting replicas (latest ready time, at the end) go first.
            del self._ready_at[replicas:]

    def advance(self, until_s: float) -> None:
        """Serve the tick that ends at ``until_s``."""
        k = self._tick
        if k >= len(self.rates):
            return
        self._tick += 1
        start_s = until_s - self.tick_s
        # Replicas that come up mid-tick count for the part of the tick they serve.
        # _ready_at stays sorted: scale-ups append now + startup (never earlier than what is
        # there), scale-downs cut from the end.
        full = bisect.bisect_right(self._ready_at, start_s)
        partial = self._ready_at[full : bisect.bisect_right(self._ready_at, until_s)]
        ready = full + sum((until_s - t) / self.tick_s for t in partial)
        rate = float(self.rates[k])
        prompt = float(self.prompt[k])
        output = float(self.output[k])
        count = rate * self.tick_s
        self.requests += count
        ttft_p99 = itl_p99 = math.inf
        good_ttft = good_itl = 0.0
        running = kv = 0.0
        if ready > 0 and rate > 0:
            n = max(math.floor(ready), 1) if ready >= 1 else 1
            scale = ready / n
            load = Load(
                request_rate_rps=rate / scale, prompt_tokens_per_s=prompt / scale, output_tokens_per_s=output / scale
            )
            mean_prompt = load.mean_prompt_tokens
            prediction = self.model.predict(load, n)
            running = prediction.running_per_replica if math.isfinite(prediction.running_per_replica) else 0.0
            prefill_rate = self.profile.prefill_rate(running) * ready
            # Backlog: prompt tokens beyond what the fleet prefills this tick wait for the next.
            demand = self._backlog_tokens + prompt * self.tick_s
            served = min(demand, prefill_rate * self.tick_s * 0.95)
            self._backlog_tokens = demand - served
            backlog_wait_s = self._backlog_tokens / prefill_rate
            ttft_p99, good_ttft = self._ttft(load, n, mean_prompt, prefill_rate / ready, backlog_wait_s)
            itl_p99, good_itl = self._itl(prediction.prefill_utilization, running)
            kv = prediction.kv_utilization if math.isfinite(prediction.kv_utilization) else 1.0
        elif rate > 0:
            self._backlog_tokens += prompt * self.tick_s
        self.good_ttft += count * good_ttft
        self.good_itl += count * good_itl
        self.good_both += count * good_ttft * good_itl
        queue = self._backlog_tokens / max(prompt / rate if rate > 0 else 1.0, 1.0)
        self._last = (start_s, ttft_p99, itl_p99, running * ready, kv, queue)

    def _ttft(
        self, load: Load, n: int, mean_prompt: float, per_replica_rate: float, backlog_wait_s: float
    ) -> tuple[float, float]:
        target = self.targets.ttft_s - self.profile.ttft_overhead_s - backlog_wait_s
        rate = load.request_rate_rps / n
        mean_service = mean_prompt / per_replica_rate
        rho = min(rate * mean_service, 0.999)
        if target <= 0:
            return backlog_wait_s + mean_service, 0.0
        mean_wait = rate * (1 + self.targets.prompt_cv2) * mean_service**2 / (2 * (1 - rho)) if rho > 0 else 0.0
        # Tail of wait + service: the queue's exponential tail plus the prompt-length tail.
        bad_wait = rho * math.exp(-rho * max(target - mean_service, 0.0) / mean_wait) if mean_wait > 0 else 0.0
        bad_service = math.exp(-target / (mean_service * math.sqrt(1 + self.targets.prompt_cv2)))
        bad = min(1.0, bad_wait + bad_service)
        wait_p99 = (mean_wait / rho) * math.log(rho / 0.01) if rho > 0.01 and mean_wait > 0 else 0.0
        p99 = (
            self.profile.ttft_overhead_s + backlog_wait_s + wait_p99 + self.targets.prompt_p99_over_mean * mean_service
        )
        return p99, 1.0 - bad

    def _itl(self, rho_prefill: float, running: float) -> tuple[float, float]:
        p = self.profile
        if rho_prefill >= 1:
            return math.inf, 0.0
        spread = math.sqrt(max(running, 1.0))
        p99 = p.step_s(running + 2.326 * spread) / (1 - rho_prefill)
        ok_running = (self.targets.itl_s * (1 - rho_prefill) - p.itl_base_s) / max(p.itl_per_seq_s, 1e-12)
        return p99, _normal_cdf((ok_running - running) / spread)

    def observe(self, now_s: float) -> PolicyObservation:
        self.book.bill(now_s, len(self._ready_at))
        k = min(self._tick - 1, len(self.rates) - 1)
        _, ttft_p99, itl_p99, running, kv, queue = self._last
        rate = float(self.rates[k]) if k >= 0 else 0.0
        count = rate * self.tick_s
        sli = None
        if count > 0 and math.isfinite(ttft_p99) and math.isfinite(itl_p99):
            sli = SliSnapshot(
                observed_at_s=now_s,
                window_s=self.tick_s,
                requests_in_window=count,
                ttft_p99_s=ttft_p99,
                itl_p99_s=itl_p99,
            )
        return PolicyObservation(
            policy="replay",
            observed_at_s=now_s,
            current_replicas=len(self._ready_at),
            ready_replicas=self.ready_count(now_s),
            queue_depth=queue,
            running_requests=running,
            request_rate_rps=rate,
            prompt_tokens_per_s=float(self.prompt[k]) if k >= 0 else 0.0,
            output_tokens_per_s=float(self.output[k]) if k >= 0 else 0.0,
            kv_cache_usage=kv,
            sli=sli,
        )

    def totals(self, end_s: float) -> FleetTotals:
        self.book.bill(end_s, len(self._ready_at))
        return FleetTotals(
            requests=round(self.requests),
            good_both=round(self.good_both),
            good_ttft=round(self.good_ttft),
            good_itl=round(self.good_itl),
            replica_seconds=self.book.replica_seconds,
            scale_events=self.book.scale_events,
        )


def count_loads(
    counts: FloatArray, bin_s: float, tick_s: float, mean_prompt: float, mean_output: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per-tick rates from per-bin counts (linear interpolation of the cumulative count)."""
    cumulative = np.r_[0.0, np.cumsum(counts)]
    edges = np.arange(0.0, len(counts) * bin_s + 1e-9, tick_s)
    at_edges = np.interp(edges, np.arange(len(cumulative)) * bin_s, cumulative)
    rates = np.diff(at_edges) / tick_s
    return rates, rates * mean_prompt, rates * mean_output
