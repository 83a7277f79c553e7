"""The aggregate (fluid) fleet: per-tick load against the capacity model's queueing equations.

For fleets of thousands of replicas and days of traffic, following every request
in Python is too slow.  The fluid fleet takes each tick's offered load (requests/s,
prompt and output tokens/s), spreads it evenly over the ready replicas, carries
prompt tokens that exceed the prefill capacity over to the next tick as a backlog,
and estimates the fraction of the tick's requests within each SLO:

- TTFT: an M/G/1 tail per replica (the load is spread evenly, so no routing pools
  the replicas) plus the wait to clear the backlog, judged by the objective's
  normalized TTFT (each prompt's long-prompt allowance off its prefill);
- ITL: the Poisson spread of running sequences around their mean.

Each tick's sample carries those tails at the engines' histogram edges, as bucket counts (a
request's TTFT once, each of its token gaps once): the controllers read good ratios and p99s
from them as from a real fleet's histograms.

It uses the *true* world (:mod:`controller.replay.world`: capacity error, drift,
prompt-length tail), which the controllers do not know, but the same family of
equations as their capacity model: it checks scaling behaviour and replica-hours
at scale, it is not an independent latency measurement.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

import numpy as np

from contracts.catalogue import ITL_BUCKETS_S, TTFT_BUCKETS_S
from contracts.traces import FloatArray, IntArray
from controller.capacity import CapacityModel, Load, Prediction
from controller.replay.fleet import StartingReplicas, insert_ready_times
from controller.replay.fluid_latency import itl_tail, prompt_shape, ttft_tail
from controller.replay.scoring import TickOutcomes
from controller.replay.signals import TickSample
from controller.replay.world import ProfileCache

__all__ = ["FluidFleet", "count_loads"]


@dataclass(frozen=True)
class _Judged:
    """What the last tick with arrivals judged its requests by; a backlog they leave finishes with it."""

    mean_prompt: float = 0.0
    mean_output: float = 0.0
    ttft_tail: FloatArray | None = None
    itl_tail: FloatArray | None = None
    ttft_mean_s: float = 0.0
    itl_mean_s: float = 0.0
    running: float = 0.0
    kv: float = 0.0


class FluidFleet:
    """Per-tick aggregate replay; the load arrays hold one rate per tick."""

    def __init__(
        self,
        rates_rps: FloatArray,
        prompt_tokens_per_s: FloatArray,
        output_tokens_per_s: FloatArray,
        world: ProfileCache,
        *,
        initial_replicas: int,
        tick_s: float,
        prompt_samples: IntArray | None = None,
    ) -> None:
        self.rates = rates_rps
        self.prompt = prompt_tokens_per_s
        self.output = output_tokens_per_s
        self.world = world
        self.targets = world.targets
        self.tick_s = tick_s
        self.starting = StartingReplicas(world.world)
        self._ready_at: list[float] = [0.0] * initial_replicas
        self._tick = 0
        self._backlog_tokens = 0.0
        self._judged = _Judged()
        self._cold_since_s: float | None = None
        """When requests began to wait with no replica ready, until a tick with replicas and arrivals serves."""
        n = len(rates_rps)
        self.good_ttft = np.zeros(n)
        self.good_itl = np.zeros(n)
        self.good_both = np.zeros(n)
        self._sample = TickSample(
            ready=initial_replicas, waiting=0.0, running=0.0, kv_usage_sum=0.0, finished=0.0, prompt_tokens=0.0,
            output_tokens=0.0, ttft_sum_s=0.0, itl_sum_s=0.0, duration_sum_s=0.0,
        )  # fmt: skip
        self._prompt_shape = prompt_shape(prompt_samples)

    @property
    def provisioned(self) -> int:
        return len(self._ready_at)

    def billed(self, now_s: float) -> int:
        """Replicas paid for in the tick that ends at ``now_s``: a removed one drains nothing here (the backlog is
        the fleet's, not a replica's)."""
        return len(self._ready_at)

    def ready_count(self, now_s: float) -> int:
        return bisect.bisect_right(self._ready_at, now_s)

    def scale_to(self, replicas: int, now_s: float) -> bool:
        """Order or remove replicas; True when the count changed."""
        replicas = max(replicas, 0)
        current = len(self._ready_at)
        if replicas == current:
            return False
        if replicas > current:
            insert_ready_times(self._ready_at, self.starting.ready_times(now_s, replicas - current))
        else:
            del self._ready_at[replicas:]  # sorted: the replicas that would be ready last go first
        return True

    def _ready_during(self, start_s: float, end_s: float) -> float:
        """Replicas serving during the tick; those coming up mid-tick count for the part they serve."""
        full = bisect.bisect_right(self._ready_at, start_s)
        partial = self._ready_at[full : bisect.bisect_right(self._ready_at, end_s)]
        return full + sum((end_s - t) / self.tick_s for t in partial)

    # long: one tick of the fluid model, from load to SLO fractions and the tick's sample, in order.
    def advance(self, until_s: float) -> None:
        """Serve the tick that ends at ``until_s``."""
        k = self._tick
        if k >= len(self.rates):
            return
        self._tick += 1
        start_s = until_s - self.tick_s
        model = self.world.model_at(start_s)
        profile = model.profile
        ready = self._ready_during(start_s, until_s)
        rate, prompt, output = float(self.rates[k]), float(self.prompt[k]), float(self.output[k])
        count = rate * self.tick_s
        mean_prompt = prompt / rate if rate > 0 else 0.0
        mean_output = output / rate if rate > 0 else 0.0
        ttft_tail = itl_tail_ = None
        good_ttft = good_itl = 0.0
        running = kv = waiting = 0.0
        served_fraction = 0.0
        ttft_mean = itl_mean = math.inf
        if ready > 0 and rate > 0:
            n = max(math.floor(ready), 1)
            scale = ready / n
            load = Load(
                request_rate_rps=rate / scale, prompt_tokens_per_s=prompt / scale, output_tokens_per_s=output / scale
            )
            prediction = model.predict(load, n)
            running, kv = self._saturated(prediction, mean_prompt, mean_output)
            prefill_rate = profile.prefill_rate(running) * ready
            # Backlog: prompt tokens beyond what the fleet prefills this tick wait for the next.
            demand = self._backlog_tokens + prompt * self.tick_s
            served = min(demand, prefill_rate * self.tick_s * 0.95)
            self._backlog_tokens = demand - served
            served_fraction = served / (prompt * self.tick_s) if prompt > 0 else 1.0
            backlog_wait_s = self._backlog_tokens / prefill_rate
            ttft_tail, good_ttft, ttft_mean, queue = self._ttft(model, load, n, mean_prompt, prefill_rate / ready,
                                                                backlog_wait_s)  # fmt: skip
            itl_tail_, good_itl, itl_mean = self._itl(model, prediction.prefill_utilization, running)
            waiting = queue * n + self._backlog_tokens / max(mean_prompt, 1.0)
            self._cold_since_s = None  # the backlog's wait is in this tick's tails
        elif rate > 0:
            self._backlog_tokens += prompt * self.tick_s
            waiting = self._backlog_tokens / max(mean_prompt, 1.0)
            if self._cold_since_s is None:
                self._cold_since_s = start_s
        elif self._backlog_tokens > 0:
            self._sample = self._drain(model, ready, until_s)
            return
        if rate > 0:
            self._judged = (
                _Judged(mean_prompt, mean_output, ttft_tail, itl_tail_, ttft_mean, itl_mean, running, kv)
                if ready > 0  # no replica ready: the backlog's tails stay those last judged
                else replace(self._judged, mean_prompt=mean_prompt, mean_output=mean_output)
            )
        self.good_ttft[k] = count * good_ttft
        self.good_itl[k] = count * good_itl
        self.good_both[k] = count * good_ttft * good_itl
        self._sample = self._tick_sample(
            until_s, ready, waiting=waiting, running=running, kv=kv, mean_prompt=mean_prompt,
            mean_output=mean_output, finished=count * served_fraction,
            prompt_tokens=prompt * self.tick_s * served_fraction,
            ttft=(ttft_tail, ttft_mean), itl=(itl_tail_, itl_mean),
        )  # fmt: skip

    def _tick_sample(
        self, until_s: float, ready: float, *, waiting: float, running: float, kv: float, mean_prompt: float,
        mean_output: float, finished: float, prompt_tokens: float, ttft: tuple[FloatArray | None, float],
        itl: tuple[FloatArray | None, float],
    ) -> TickSample:  # fmt: skip
        """The tick's sample: gauges per ready replica, and what finished with its latency tails and means."""
        (ttft_tail, ttft_mean), (itl_tail, itl_mean) = ttft, itl
        kv_capacity = self.world.nominal.kv_capacity_tokens
        observed = finished > 0  # no latency sums without observations (a mean may be infinite)
        return TickSample(
            ready=self.ready_count(until_s),
            waiting=waiting,
            running=running * ready,
            kv_usage_sum=kv * ready,
            kv_demand_max=kv + waiting * mean_prompt / (ready * kv_capacity) if ready else 0.0,
            finished=finished,
            prompt_tokens=prompt_tokens,
            output_tokens=finished * mean_output,
            ttft_sum_s=finished * ttft_mean if observed else 0.0,
            itl_sum_s=finished * itl_mean if observed else 0.0,
            duration_sum_s=finished * (ttft_mean + mean_output * itl_mean) if observed else 0.0,
            ttft_le=_cumulative(finished, ttft_tail),
            itl_le=_cumulative(finished * max(mean_output - 1.0, 0.0), itl_tail),
        )

    def _drain(self, model: CapacityModel, ready: float, until_s: float) -> TickSample:
        """A tick without arrivals: the ready replicas serve the backlog the last arrivals left.

        Those requests' verdicts were counted in the tick they arrived in, with the wait to clear the backlog;
        here they finish, and their TTFT and token gaps enter the histograms with the tails of the last tick
        that served arrivals, on replicas as busy as that tick's.  Requests that have waited with no replica
        ready since then (a cold start) take their wait so far as their TTFT, on replicas as busy as the capacity
        model makes them at the rate they drain.
        """
        judged = self._judged
        mean_prompt = max(judged.mean_prompt, 1.0)
        served = 0.0
        if ready > 0:
            prefill_rate = model.profile.prefill_rate(judged.running) * ready
            served = min(self._backlog_tokens, prefill_rate * self.tick_s * 0.95)
        self._backlog_tokens -= served
        finished = served / mean_prompt
        waiting = self._backlog_tokens / mean_prompt
        # A cold start: no tick with replicas has judged these requests.
        cold = self._cold_since_s is not None or judged.ttft_tail is None
        ttft_tail, ttft_mean_s = judged.ttft_tail, judged.ttft_mean_s
        if cold:
            ttft_mean_s = self.tick_s if self._cold_since_s is None else until_s - self._cold_since_s
            ttft_tail = np.where(np.asarray(TTFT_BUCKETS_S) < ttft_mean_s, 1.0, 0.0)
        itl_tail, itl_mean_s = judged.itl_tail, judged.itl_mean_s
        if itl_tail is None:
            itl_tail, _, itl_mean_s = self._itl(model, 0.0, max(judged.running, 1.0))
        running, kv = (judged.running, judged.kv) if served > 0 else (0.0, 0.0)
        if served > 0 and cold:
            # The fleet is as busy as the capacity model makes it at the rate it drains them.
            n = max(math.floor(ready), 1)
            per_s = 1.0 / self.tick_s / (ready / n)
            drain = Load(request_rate_rps=finished * per_s, prompt_tokens_per_s=served * per_s,
                         output_tokens_per_s=finished * judged.mean_output * per_s)  # fmt: skip
            running, kv = self._saturated(model.predict(drain, n), mean_prompt, judged.mean_output)
        if self._backlog_tokens <= 0:
            self._cold_since_s = None
        return self._tick_sample(
            until_s, ready, waiting=waiting, running=running, kv=kv, mean_prompt=mean_prompt,
            mean_output=judged.mean_output, finished=finished, prompt_tokens=served,
            ttft=(ttft_tail, ttft_mean_s), itl=(itl_tail, itl_mean_s),
        )  # fmt: skip

    def _saturated(self, prediction: Prediction, mean_prompt: float, mean_output: float) -> tuple[float, float]:
        """Running sequences and KV usage per replica; an overloaded replica runs full."""
        profile = self.world.nominal
        running = prediction.running_per_replica
        if not math.isfinite(running):
            by_kv = profile.kv_capacity_tokens / max(mean_prompt + mean_output / 2.0, 1.0)
            running = float(min(profile.max_num_seqs, by_kv))
        running = min(running, float(profile.max_num_seqs))
        kv = prediction.kv_utilization if math.isfinite(prediction.kv_utilization) else 1.0
        return running, min(kv, 1.0)

    def _ttft(
        self, model: CapacityModel, load: Load, n: int, mean_prompt: float, per_replica_rate: float,
        backlog_wait_s: float,
    ) -> tuple[FloatArray, float, float, float]:  # fmt: skip
        """(tail at the histogram's edges, fraction within target, mean, mean queue length per replica) of TTFT."""
        targets = self.targets
        fixed_s = model.profile.ttft_overhead_s + backlog_wait_s
        rate = load.request_rate_rps / n
        mean_service = mean_prompt / per_replica_rate
        rho = min(rate * mean_service, 0.999)
        mean_wait = rate * (1 + targets.prompt_cv2) * mean_service**2 / (2 * (1 - rho)) if rho > 0 else 0.0
        # The steady-state queue is bounded: beyond rho ~ 0.95 the overload shows as backlog instead.
        rho_q = min(rho, 0.95)
        queue = rate * (1 + targets.prompt_cv2) * mean_service**2 * rate / (2 * (1 - rho_q)) if rho > 0 else 0.0
        # The objective's normalized TTFT: each prompt quantile's long-prompt allowance comes off its prefill.
        allowance = targets.ttft_allowance
        prompts = self._prompt_shape * mean_prompt
        extra = allowance.per_1k_prompt_tokens_s * np.maximum(prompts - allowance.reference_prompt_tokens, 0) / 1000
        service_s = self._prompt_shape * mean_service - extra
        tail = ttft_tail(np.r_[targets.ttft_s, TTFT_BUCKETS_S], fixed_s=fixed_s, service_s=service_s, rho=rho,
                         mean_wait_s=mean_wait)  # fmt: skip
        return tail[1:], 1.0 - float(tail[0]), fixed_s + mean_wait + mean_service, queue

    def _itl(self, model: CapacityModel, rho_prefill: float, running: float) -> tuple[FloatArray, float, float]:
        """(tail at the histogram's edges, fraction within target, mean) of the inter-token latency."""
        p = model.profile
        tail = itl_tail(np.r_[self.targets.itl_s, ITL_BUCKETS_S], base_s=p.itl_base_s, per_seq_s=p.itl_per_seq_s,
                        rho_prefill=rho_prefill, running=running)  # fmt: skip
        mean = p.step_s(running) / (1 - rho_prefill) if rho_prefill < 1 else math.inf
        return tail[1:], 1.0 - float(tail[0]), mean

    def sample(self, now_s: float) -> TickSample:
        """The sample of the tick that :meth:`advance` just served."""
        return self._sample

    def outcomes(self, ticks: int) -> TickOutcomes:
        zeros = np.zeros(ticks, dtype=np.int64)
        return TickOutcomes(
            tick_s=self.tick_s,
            requests=self.rates[:ticks] * self.tick_s,
            good_both=self.good_both[:ticks].copy(),
            good_ttft=self.good_ttft[:ticks].copy(),
            good_itl=self.good_itl[:ticks].copy(),
            provisioned=zeros,
            ready=zeros,
            scaled=np.zeros(ticks, dtype=bool),
        )


def _cumulative(observations: float, tail: FloatArray | None) -> tuple[float, ...]:
    """A tick's bucket counts: its observations at or under each edge (``1 - tail``), then all of them."""
    if tail is None or observations <= 0:
        return ()
    return (*(float(c) for c in observations * (1.0 - tail)), observations)


def count_loads(
    counts: FloatArray, bin_s: float, tick_s: float, mean_prompt: float, mean_output: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per-tick rates from per-bin counts (linear interpolation of the cumulative count)."""
    cumulative = np.r_[0.0, np.cumsum(counts)]
    # Up to the tick that holds the last bin's end (as request by request): a last partial tick keeps its arrivals.
    ticks = math.ceil(len(counts) * bin_s / tick_s - 1e-9)
    edges = np.arange(ticks + 1) * tick_s
    at_edges = np.interp(edges, np.arange(len(cumulative)) * bin_s, cumulative)
    rates = np.diff(at_edges) / tick_s
    return rates, rates * mean_prompt, rates * mean_output
