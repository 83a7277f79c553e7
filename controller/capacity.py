"""The capacity model: how many replicas keep predicted TTFT and ITL within their targets.

A replica is described by a :class:`ReplicaProfile` (measured by ``moeslo profile``
or the documented default).  Its latency model, shared with the replay simulator:

- a decode step with ``b`` running sequences takes ``itl_base_s + itl_per_seq_s * b``;
- prefill runs in chunks of ``prefill_chunk_tokens`` inside decode steps, so a prompt
  is prefilled at ``chunk / (step(b) + chunk / prefill_tokens_per_s)`` tokens/s, FIFO;
- the GPU spends ``rho_p = prompt tokens/s / prefill_tokens_per_s`` of its time on
  prefill, which stretches every decode step: mean ITL = ``step(b) / (1 - rho_p)``; the
  p99 ITL takes the p99 of that share over :data:`PREFILL_SHARE_WINDOW_S` (prefill arrives
  in bursts, one prompt at a time: a compound Poisson sum);
- running sequences follow Little's law, ``b = rate * output_tokens * ITL``;
- KV cache holds ``kv_capacity_tokens``.

TTFT's quantile comes from an M/G/N queue behind least-loaded routing (a request waits
with the Erlang-C probability, then an exponential time of the Lee-Longton mean; one
replica is the Pollaczek-Khinchine M/G/1 queue), ITL's from the Poisson spread of ``b``.  TTFT is the objective's
*normalized* TTFT (:mod:`contracts.ttft_objective`): a prompt's long-prompt allowance is
taken off its prefill.  Prompts no replica can serve within the objective (those
:meth:`CapacityModel.infeasible_prompts` bounds) cannot be helped by more replicas: the tail's
own prefill sets a floor, and the queue may add up to a fifth of the objective on top of it; a floor still under
the objective sizes for the objective (at most :data:`TTFT_QUEUE_LEAST` over it).  ITL has its floor
too (:attr:`CapacityModel.itl_floor_s`, one step of the smallest batch): an objective below it sizes for
the floor plus a margin, not for every replica there is.
A prefix-cache hit rate ``h`` (observed: ``vllm:prefix_cache_hits`` over
``vllm:prefix_cache_queries``) leaves ``1 - h (1 - c)`` of the prompt's prefill work, ``c``
being the profile's ``cached_token_cost`` (what a cached token still costs; 0: nothing).

The prompt-length tail (``Targets.prompt_cv2``, ``prompt_p99_over_mean``) starts nominal and follows
the lengths the engines report (:meth:`CapacityModel.observe_length_tail`).

Online, the model is corrected by the ratio of observed to predicted latency (as NVIDIA Dynamo's planner
does), and a reactive floor from the queue depth covers what no forecast saw coming.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from contracts.slo_defaults import ITL_THRESHOLD_S, SIZING_HEADROOM, TTFT_THRESHOLD_S
from contracts.ttft_objective import FLAT, TtftAllowance
from controller.queueing import mgn_waits
from controller.replica_profile import DEFAULT_PROFILE, PrefixProbe, ProfilePoint, ReplicaProfile

__all__ = [
    "DEFAULT_PROFILE", "MAX_REPLICAS", "PREFILL_SHARE_WINDOW_S", "CapacityModel", "Load", "Prediction",
    "PrefixProbe", "ProfilePoint", "ReplicaProfile", "Targets",
]  # fmt: skip

_Z99 = 2.326  # standard normal 99th percentile
PREFILL_SHARE_WINDOW_S = 15.0
"""Span over which a replica's prefill share stretches the decodes beside it (about a request's decode)."""
MAX_REPLICAS = 100_000


@dataclass(frozen=True, kw_only=True, slots=True)
class Load:
    """Offered load on the whole fleet."""

    request_rate_rps: float
    prompt_tokens_per_s: float
    output_tokens_per_s: float

    @property
    def mean_prompt_tokens(self) -> float:
        return self.prompt_tokens_per_s / self.request_rate_rps if self.request_rate_rps > 0 else 0.0

    @property
    def mean_output_tokens(self) -> float:
        return self.output_tokens_per_s / self.request_rate_rps if self.request_rate_rps > 0 else 0.0

    def scaled(self, factor: float) -> Load:
        return Load(
            request_rate_rps=self.request_rate_rps * factor,
            prompt_tokens_per_s=self.prompt_tokens_per_s * factor,
            output_tokens_per_s=self.output_tokens_per_s * factor,
        )


ITL_FLOOR_MARGIN = 1.2
"""The lowest p99 ITL a fleet is sized for, over one step of the smallest batch."""

TTFT_FLOOR_MARGIN = 0.2
"""The share of the TTFT objective the queue may add over a floor that already misses it (or leaves more)."""

TTFT_QUEUE_LEAST = 0.05
"""The least share of the TTFT objective the queue may add over the floor, however close to the objective it is:
a floor within this share under the objective is sized up to this share over it, and one just past the objective
starts from it too, so the fleet does not jump as the floor crosses the objective."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Targets:
    ttft_s: float = TTFT_THRESHOLD_S
    itl_s: float = ITL_THRESHOLD_S
    headroom: float = SIZING_HEADROOM
    """Size for this fraction of each target, leaving room for what the model does not see."""
    prompt_cv2: float = 0.8
    """Squared coefficient of variation of prompt lengths (Azure 2023 conversation: ~0.8)."""
    prompt_p99_over_mean: float = 3.6
    """99th-percentile prompt over the mean prompt (Azure 2023 conversation: 4,142 / 1,155)."""
    ttft_allowance: TtftAllowance = FLAT
    """The TTFT objective's long-prompt allowance (flat: none)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """Predicted per-replica behaviour of a fleet of ``replicas`` under a load."""

    replicas: int
    ttft_p99_s: float
    itl_mean_s: float
    itl_p99_s: float
    running_per_replica: float
    prefill_utilization: float
    kv_utilization: float
    ttft_floor_s: float = 0.0
    """p99 TTFT with no queue at all (the longest prompts' own prefill, no decodes beside it): no fleet size goes
    below it."""

    @property
    def stable(self) -> bool:
        return math.isfinite(self.ttft_p99_s) and math.isfinite(self.itl_p99_s)


class CapacityModel:
    """Replicas needed for a load, from a profile, corrected online by observed latency."""

    def __init__(self, profile: ReplicaProfile = DEFAULT_PROFILE, targets: Targets | None = None) -> None:
        self.profile = profile
        self.targets = targets or Targets()
        self.ttft_correction = 1.0
        self.itl_correction = 1.0
        self.prefix_hit_rate = 0.0
        """Share of prompt tokens served from the prefix cache (prefilled at the profile's
        ``cached_token_cost``); set from observations."""
        self.prefill_speed_correction = 1.0
        """Observed prefill speed over the profile's at the same decode batch (EWMA, 0.5-2): replicas
        slower than their profile leave shorter prompts feasible (:meth:`infeasible_prompts`)."""
        self.length_tail_observed = False
        """Whether :attr:`targets` carries a prompt-length tail read from the engines (else the nominal one)."""
        self._last_needed = 1
        """The last answer of :meth:`replicas_needed`: consecutive loads need about as many replicas, so the
        search starts there (two predictions instead of a dozen; the answer does not depend on it)."""

    def carry_over(self, previous: CapacityModel) -> None:
        """Take what ``previous`` (this policy's model before its objectives or profile changed) learnt: the
        prefix-cache hit rate and the prompt-length tail always (they are the workload's); the latency and
        prefill-speed corrections only for the same profile (they correct its predictions, not another's)."""
        self.prefix_hit_rate = previous.prefix_hit_rate
        if previous.length_tail_observed:
            self.targets = replace(self.targets, prompt_cv2=previous.targets.prompt_cv2,
                                   prompt_p99_over_mean=previous.targets.prompt_p99_over_mean)  # fmt: skip
            self.length_tail_observed = True
        if previous.profile == self.profile:
            self.ttft_correction, self.itl_correction = previous.ttft_correction, previous.itl_correction
            self.prefill_speed_correction = previous.prefill_speed_correction

    def predict(self, load: Load, replicas: int) -> Prediction:
        """Latencies of ``replicas`` under ``load``, with the online corrections applied.

        A correction factor ``c`` plans as if the load were ``c`` times higher for that
        latency (observed 30 % slower than predicted: size for 30 % more load), which
        more replicas can always satisfy, unlike scaling the latency itself.
        """
        if self.ttft_correction == 1.0 and self.itl_correction == 1.0:
            return self._predict(load, replicas)
        for_itl = self._predict(load.scaled(self.itl_correction), replicas, with_ttft=False)
        return _combined(self._predict(load.scaled(self.ttft_correction), replicas), for_itl)

    def _meets(self, load: Load, replicas: int, headroom: float | None) -> bool:
        """``meets_targets(predict(load, replicas))``, the ITL side first: a count it already rules out needs
        no TTFT queue model (most of a prediction's cost) at the TTFT correction's load."""
        if self.ttft_correction == 1.0 and self.itl_correction == 1.0:
            return self.meets_targets(self._predict(load, replicas), headroom)
        for_itl = self._predict(load.scaled(self.itl_correction), replicas, with_ttft=False)
        room = self.targets.headroom if headroom is None else headroom
        if not self._decode_fits(for_itl, room):
            return False  # the combined prediction keeps these (or larger) values: it fails too
        for_ttft = self._predict(load.scaled(self.ttft_correction), replicas)
        return self.meets_targets(_combined(for_ttft, for_itl), headroom)

    def _predict(self, load: Load, replicas: int, *, with_ttft: bool = True) -> Prediction:
        """Without ``with_ttft`` the TTFT fields are left at 0 (the M/G/N part is most of the cost)."""
        p = self.profile
        t = self.targets
        inf = math.inf
        if replicas <= 0:
            return Prediction(
                replicas=replicas,
                ttft_p99_s=inf if load.request_rate_rps > 0 else 0.0,
                itl_mean_s=inf,
                itl_p99_s=inf,
                running_per_replica=inf,
                prefill_utilization=inf,
                kv_utilization=inf,
            )
        rate = load.request_rate_rps / replicas
        uncached = p.uncached_share(self.prefix_hit_rate)
        rho_p = load.prompt_tokens_per_s * uncached / replicas / p.prefill_tokens_per_s
        decode_tokens_per_s = load.output_tokens_per_s / replicas
        free = 1.0 - rho_p - decode_tokens_per_s * p.itl_per_seq_s
        if rho_p >= 1.0 or free <= 0:
            return Prediction(
                replicas=replicas,
                ttft_p99_s=inf,
                itl_mean_s=inf,
                itl_p99_s=inf,
                running_per_replica=inf,
                prefill_utilization=rho_p,
                kv_utilization=inf,
            )
        running = decode_tokens_per_s * p.itl_base_s / free
        itl_mean = p.step_s(running) / (1.0 - rho_p)
        # The prefill share differs between replicas and over time: one long prompt is a burst of
        # prefill. Its p99 over a window (compound Poisson) stretches the slowest decodes.
        prefill_s = load.mean_prompt_tokens * uncached / p.prefill_tokens_per_s
        spread = math.sqrt(rate * (1.0 + t.prompt_cv2) * prefill_s**2 / PREFILL_SHARE_WINDOW_S)
        rho_busy = min(rho_p + _Z99 * spread, 0.95)
        itl_p99 = p.step_s(running + _Z99 * math.sqrt(max(running, 1.0))) / (1.0 - rho_busy)
        ttft_p99, floor = self._ttft_p99(load, replicas, running) if with_ttft else (0.0, 0.0)
        kv_tokens = running * (load.mean_prompt_tokens + load.mean_output_tokens / 2.0)
        return Prediction(
            replicas=replicas,
            ttft_p99_s=ttft_p99,
            itl_mean_s=itl_mean,
            itl_p99_s=itl_p99,
            running_per_replica=running,
            prefill_utilization=rho_p,
            kv_utilization=kv_tokens / p.kv_capacity_tokens,
            ttft_floor_s=floor,
        )

    def _ttft_p99(self, load: Load, replicas: int, running: float) -> tuple[float, float]:
        """p99 of the objective's (normalized) TTFT, and its floor: the tail's own prefill with no queue.

        A prefill queue per replica (service at the prefill rate beside ``running`` decoders), requests
        routed to the least-loaded replica: M/G/N waits (see :func:`controller.queueing.mgn_waits`).
        """
        p, t = self.profile, self.targets
        prefill_rate = p.prefill_rate(running)
        mean_service = load.mean_prompt_tokens * p.uncached_share(self.prefix_hit_rate) / prefill_rate
        rho = load.request_rate_rps / replicas * mean_service
        # The objective's own service time of the mean prompt and of the p99 tail prompt.
        typical = self._normalized_service(load.mean_prompt_tokens, prefill_rate)
        tail = self._tail_service(load.mean_prompt_tokens, prefill_rate)
        # The floor is what the largest fleet reaches (decodes beside a prompt thin out toward none): the same
        # for every replica count, so whether it misses the objective does not flip along the search.
        least_rate = prefill_rate if running <= 0 else p.chunked_prefill_rate(0.0)
        floor = p.ttft_overhead_s + max(
            self._tail_service(load.mean_prompt_tokens, least_rate),
            self._normalized_service(load.mean_prompt_tokens, least_rate),
        )
        if rho >= 1.0:
            return math.inf, floor
        mean_wait, wait_p99 = mgn_waits(replicas, rho, mean_service, t.prompt_cv2)
        # The p99 of wait + service is dominated by whichever tail is heavier: a long queue,
        # or one of the longest prompts behind a typical queue.
        return p.ttft_overhead_s + max(wait_p99 + typical, mean_wait + tail), floor

    def _normalized_service(self, prompt_tokens: float, prefill_rate: float) -> float:
        """Prefill of a prompt's uncached tokens minus its long-prompt allowance (at least 0)."""
        allowance = self.targets.ttft_allowance
        service = prompt_tokens * self.profile.uncached_share(self.prefix_hit_rate) / prefill_rate
        return max(service - allowance.allowance_s(prompt_tokens), 0.0)

    def _tail_service(self, mean_prompt_tokens: float, prefill_rate: float) -> float:
        """The normalized service of the p99 tail prompt (infeasible ones included: they set the floor).

        Normalized service rises up to the reference length, then at a slope that the allowance may
        make negative, so its largest value up to the tail prompt is at one of the two.
        """
        tail_prompt = self.targets.prompt_p99_over_mean * mean_prompt_tokens
        reference = float(self.targets.ttft_allowance.reference_prompt_tokens)
        return max(
            self._normalized_service(tail_prompt, prefill_rate),
            self._normalized_service(min(reference, tail_prompt), prefill_rate),
        )

    def infeasible_prompts(self) -> tuple[float, float]:
        """Prompts strictly between these two lengths miss the TTFT objective alone on a replica: no fleet size
        helps them (``(inf, inf)``: none; :meth:`contracts.ttft_objective.TtftAllowance.infeasible_prompts`).

        The prompt is prefilled in chunks (:meth:`ReplicaProfile.chunked_prefill_rate`) at the speed
        the replicas are observed to prefill at (:attr:`prefill_speed_correction`).
        """
        hit = min(max(self.prefix_hit_rate, 0.0), 0.99)
        speed = self.profile.chunked_prefill_rate(0.0) * self.prefill_speed_correction
        return self.targets.ttft_allowance.infeasible_prompts(
            self.targets.ttft_s,
            overhead_s=self.profile.ttft_overhead_s,
            prefill_tokens_per_s=speed / self.profile.uncached_share(hit),
        )

    def longest_feasible_prompt(self) -> float:
        """Every prompt up to this length is feasible; the band of :meth:`infeasible_prompts` starts there."""
        return self.infeasible_prompts()[0]

    def observe_length_tail(self, prompt_cv2: float, prompt_p99_over_mean: float) -> None:
        """Size for the prompt-length tail the engines report (``vllm:request_prompt_tokens``) instead of the
        nominal one: a heavier tail lengthens the prefill bursts that stretch decodes and the queue behind them."""
        if not (math.isfinite(prompt_cv2) and math.isfinite(prompt_p99_over_mean)):
            return
        t = self.targets
        if not self.length_tail_observed:  # the first reading replaces the nominal tail; later ones are smoothed
            cv2, p99 = prompt_cv2, prompt_p99_over_mean
        else:
            cv2 = 0.9 * t.prompt_cv2 + 0.1 * prompt_cv2
            p99 = 0.9 * t.prompt_p99_over_mean + 0.1 * prompt_p99_over_mean
        self.length_tail_observed = True
        self.targets = replace(t, prompt_cv2=min(max(cv2, 0.0), 10.0), prompt_p99_over_mean=min(max(p99, 1.0), 50.0))

    def correct_prefill_speed(
        self, *, prompt_tokens_per_prefill_s: float, running_per_replica: float, weight: float = 0.2
    ) -> None:
        """Fold an observed prefill speed into :attr:`prefill_speed_correction`.

        ``prompt_tokens_per_prefill_s`` is the finished requests' prompt tokens (cached ones included)
        over their prefill time (first scheduled to first token, no queue); the profile's speed
        at the same decode batch and prefix-cache hit rate is what it is compared with.  ``weight`` is the
        reading's share in the EWMA (the advisor passes the time the reading adds over its SLI window, as
        for :meth:`correct`).
        """
        if not (math.isfinite(prompt_tokens_per_prefill_s) and prompt_tokens_per_prefill_s > 0):
            return
        hit = min(max(self.prefix_hit_rate, 0.0), 0.99)
        predicted = self.profile.chunked_prefill_rate(running_per_replica) / self.profile.uncached_share(hit)
        self.prefill_speed_correction = _ewma(
            self.prefill_speed_correction, prompt_tokens_per_prefill_s / predicted, weight
        )

    @property
    def itl_floor_s(self) -> float:
        """p99 ITL of a replica with the smallest batch and no prefill beside it: no fleet size goes below it."""
        return self.profile.step_s(_Z99)

    def itl_limit_s(self, headroom: float | None = None) -> float:
        """The p99 ITL a fleet is sized for: the objective's ``headroom`` share (by default the targets' own), but
        never under a fifth above the floor (:attr:`itl_floor_s`).

        As for TTFT's floor: more replicas cannot take ITL below one step of the smallest batch, and near it each
        tenth of a millisecond costs many, so an objective whose share is under 1.2x the floor sizes for 1.2x the
        floor instead of asking for every replica there is.  That stays within any objective above it."""
        t = self.targets
        room = t.headroom if headroom is None else headroom
        return max(t.itl_s * room, ITL_FLOOR_MARGIN * self.itl_floor_s)

    def meets_targets(self, prediction: Prediction, headroom: float | None = None) -> bool:
        t = self.targets
        room = t.headroom if headroom is None else headroom
        ttft_limit = max(t.ttft_s * room, self._ttft_floor_limit_s(prediction.ttft_floor_s))
        return prediction.stable and prediction.ttft_p99_s <= ttft_limit and self._decode_fits(prediction, room)

    def _ttft_floor_limit_s(self, floor_s: float) -> float:
        """The p99 TTFT a fleet may be sized for over ``floor_s`` (:attr:`Prediction.ttft_floor_s`), when above the
        objective's headroom share.

        Prompts so long that their prefill alone misses the objective cannot be helped by more replicas: the queue
        may add up to a fifth of the objective on top of them.  A floor under the objective leaves it reachable, so
        the limit stays at the objective (:data:`TTFT_QUEUE_LEAST` over it at most, for a floor that close under
        it).  The queue's share is continuous in the floor: it grows from that least share at the objective to the
        fifth, one for one with the floor's excess, so a mean prompt a few tokens longer does not change the fleet
        threefold."""
        ttft = self.targets.ttft_s
        least, most = TTFT_QUEUE_LEAST * ttft, TTFT_FLOOR_MARGIN * ttft
        if floor_s >= ttft:
            return floor_s + min(most, least + floor_s - ttft)
        # Under the objective the queue gets what the floor leaves of it, but never so little that only every
        # replica there is would do (a floor a hair under the objective): then it overshoots by at most that.
        return floor_s + min(max(ttft - floor_s, least), most)

    def _decode_fits(self, prediction: Prediction, room: float) -> bool:
        """The ITL side of :meth:`meets_targets`: p99 ITL (NaN fails), KV cache and batch within ``room``."""
        return (
            prediction.itl_p99_s <= self.itl_limit_s(room)
            and prediction.kv_utilization <= room
            and prediction.running_per_replica <= self.profile.max_num_seqs * room
        )

    def replicas_needed(self, load: Load, *, headroom: float | None = None) -> int:
        """The fewest replicas whose predicted p99 TTFT and ITL meet the targets (with ``headroom``, by
        default the targets' own).

        Meeting the targets is monotonic in the replica count, so the answer is the edge between
        counts that fail and counts that pass, searched for outward from the last answer.
        """
        if load.request_rate_rps <= 0:
            return 0

        def meets(replicas: int) -> bool:
            return self._meets(load, replicas, headroom)

        guess = min(max(self._last_needed, 1), MAX_REPLICAS)
        if meets(guess):
            low, high, step = guess - 1, guess, 1
            while low >= 1 and meets(low):  # walk down, doubling the stride: low fails or is 0
                high, low, step = low, max(low - 2 * step, 0), 2 * step
        else:
            low, high, step = guess, guess + 1, 1
            while not meets(high):
                if high >= MAX_REPLICAS:
                    return MAX_REPLICAS  # nothing meets the targets (an absurd load): ask for the most
                low, high, step = high, min(high + 2 * step, MAX_REPLICAS), 2 * step
        while high - low > 1:  # low fails (or is 0), high meets
            middle = (low + high) // 2
            if meets(middle):
                high = middle
            else:
                low = middle
        self._last_needed = high
        ceiling = self.profile.ceiling_rps(ttft_s=self.targets.ttft_s, itl_s=self.targets.itl_s,
                                           prompt_tokens=load.mean_prompt_tokens, output_tokens=load.mean_output_tokens)
        if ceiling is not None:
            return min(MAX_REPLICAS, max(high, math.ceil(round(load.request_rate_rps / ceiling, 9))))
        return high

    def sustainable_rates(self, *, mean_prompt_tokens: float, mean_output_tokens: float) -> tuple[float, float]:
        """Prompt and output tokens/s one replica sustains at the targets, each phase alone.

        These are the two numbers of a throughput-interpolation planner (Dynamo-style):
        prefill throughput at the TTFT target and decode throughput at the ITL target.
        """
        unit_prefill = Load(request_rate_rps=1.0, prompt_tokens_per_s=mean_prompt_tokens, output_tokens_per_s=0.0)
        unit_decode = Load(
            request_rate_rps=1.0, prompt_tokens_per_s=0.0, output_tokens_per_s=max(mean_output_tokens, 1.0)
        )
        return (
            mean_prompt_tokens * self._max_rate(unit_prefill),
            max(mean_output_tokens, 1.0) * self._max_rate(unit_decode),
        )

    def _max_rate(self, unit: Load) -> float:
        """Largest multiple of ``unit`` one replica serves within the targets (bisection)."""
        low, high = 0.0, 1.0
        while self.meets_targets(self.predict(unit.scaled(high), 1)):
            low, high = high, high * 2
            if high > 1e9:
                return high
        for _ in range(40):
            middle = (low + high) / 2
            if self.meets_targets(self.predict(unit.scaled(middle), 1)):
                low = middle
            else:
                high = middle
        return low

    def correct(
        self, *, load: Load, ready_replicas: int, ttft_p99_s: float | None, itl_p99_s: float | None,
        weight: float = 0.2,
    ) -> None:
        """Fold observed p99 latencies into the correction factors (EWMA of observed / predicted, ``weight``
        on the new ratio)."""
        if ready_replicas <= 0 or load.request_rate_rps <= 0:
            return
        raw = self._predict(load, ready_replicas)
        if not raw.stable:
            return
        if ttft_p99_s is not None and ttft_p99_s > 0 and raw.ttft_p99_s > 0:
            self.ttft_correction = _ewma(self.ttft_correction, ttft_p99_s / raw.ttft_p99_s, weight)
        if itl_p99_s is not None and itl_p99_s > 0 and raw.itl_p99_s > 0:
            self.itl_correction = _ewma(self.itl_correction, itl_p99_s / raw.itl_p99_s, weight)

    def queue_floor(self, *, queue_depth: float, ready_replicas: int, load: Load, drain_s: float) -> int:
        """Replicas for the load plus draining the waiting prompts within ``drain_s`` (0: no queue).

        A queue longer than one request per ready replica means the fleet is already short;
        sizing for its drain on top of the arrivals covers what the forecast did not see.
        """
        if queue_depth <= max(ready_replicas, 1) or load.request_rate_rps <= 0:
            return 0
        drain_rate = queue_depth / max(drain_s, 1.0)
        return self.replicas_needed(load.scaled(1.0 + drain_rate / load.request_rate_rps))


def _combined(for_ttft: Prediction, for_itl: Prediction) -> Prediction:
    """One prediction from the TTFT correction's load (TTFT, prefill) and the ITL correction's (ITL)."""
    return Prediction(
        replicas=for_ttft.replicas,
        ttft_p99_s=for_ttft.ttft_p99_s,
        itl_mean_s=for_itl.itl_mean_s,
        itl_p99_s=for_itl.itl_p99_s,
        running_per_replica=max(for_ttft.running_per_replica, for_itl.running_per_replica),
        prefill_utilization=for_ttft.prefill_utilization,
        kv_utilization=max(for_ttft.kv_utilization, for_itl.kv_utilization),
        ttft_floor_s=for_ttft.ttft_floor_s,
    )


def _ewma(previous: float, observed: float, weight: float = 0.2, low: float = 0.5, high: float = 2.0) -> float:
    return min(max((1 - weight) * previous + weight * observed, low), high)
