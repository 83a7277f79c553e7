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
taken off its prefill.  Prompts no replica can serve within the objective (beyond
:meth:`CapacityModel.longest_feasible_prompt`) cannot be helped by more replicas: the tail's
own prefill sets a floor, and the queue may add a fifth of the objective on top of it.
A prefix-cache hit rate ``h`` (observed: ``vllm:prefix_cache_hits`` over
``vllm:prefix_cache_queries``) leaves ``1 - h (1 - c)`` of the prompt's prefill work, ``c``
being the profile's ``cached_token_cost`` (what a cached token still costs; 0: nothing).

Online, the model is corrected by the ratio of observed to predicted latency (as NVIDIA Dynamo's planner
does), and a reactive floor from the queue depth covers what no forecast saw coming.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from contracts.errors import DataError
from contracts.slo_defaults import ITL_THRESHOLD_S, TTFT_THRESHOLD_S
from contracts.ttft_objective import FLAT, TtftAllowance
from controller.queueing import mgn_waits

_Z99 = 2.326  # standard normal 99th percentile
PREFILL_SHARE_WINDOW_S = 15.0
"""Span over which a replica's prefill share stretches the decodes beside it (about a request's decode)."""
MAX_REPLICAS = 100_000


Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
"""A float where JSON says a number (``true`` or ``"1"`` is refused, as everywhere in a policy)."""
Count = Annotated[int, Field(strict=True)]


class ProfilePoint(BaseModel):
    """One load level of a profiling sweep."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    request_rate_rps: Number
    prompt_tokens_per_s: Number
    output_tokens_per_s: Number
    ttft_p99_s: Number
    itl_p99_s: Number
    ttft_p50_s: Number | None = None
    itl_p50_s: Number | None = None
    requests: Count = 0


class PrefixProbe(BaseModel):
    """``moeslo profile``'s prefix-cache measurement on an idle replica, for the record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cold_ttft_p50_s: Number
    """Median TTFT of prompts that share nothing with earlier ones."""
    cached_ttft_p50_s: Number
    """Median TTFT of prompts of the same length whose leading part was in the prefix cache."""
    cached_share: Annotated[Number, Field(ge=0, le=1)]
    """Share of each such prompt found in the cache (the engine's counters; as sent when it has none)."""
    requests: Count = 0
    """Requests of each kind."""


class ReplicaProfile(BaseModel):
    """Per-replica capacity, as ``moeslo profile`` writes it (JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(strict=True, max_length=253)] = "default"
    source: Annotated[str, Field(strict=True, max_length=4096)] = ""
    """Where the numbers come from (a measurement, or how they were estimated)."""
    prefill_tokens_per_s: Annotated[Number, Field(gt=0)]
    itl_base_s: Annotated[Number, Field(gt=0)]
    itl_per_seq_s: Annotated[Number, Field(ge=0)]
    prefill_chunk_tokens: Annotated[Count, Field(ge=1)] = 2048
    kv_capacity_tokens: Annotated[Count, Field(ge=1)]
    max_num_seqs: Annotated[Count, Field(ge=1)] = 256
    ttft_overhead_s: Annotated[Number, Field(ge=0)] = 0.01
    """Fixed per-request cost before prefill (tokenization, scheduling, network)."""
    points: Annotated[tuple[ProfilePoint, ...], Field(max_length=1000)] = ()
    """The sweep the parameters were fitted to, for the record."""
    cached_token_cost: Annotated[Number, Field(ge=0, le=1)] = 0.0
    """Prefill time a prompt token found in the prefix cache still costs, relative to a computed one."""
    prefix_probe: PrefixProbe | None = None
    """The measurement ``cached_token_cost`` was fitted to (None: not measured)."""
    max_request_rate_rps: Annotated[Number, Field(gt=0)] | None = None
    """The request rate one replica was measured to hold within the objectives, tails included (None:
    not measured): the model never sizes a replica for more, whatever its latency lines say."""

    def uncached_share(self, prefix_hit_rate: float) -> float:
        """Share of a prompt's prefill work left at a prefix-cache hit rate (cached tokens cost their share)."""
        return 1.0 - prefix_hit_rate * (1.0 - self.cached_token_cost)

    def step_s(self, running: float) -> float:
        return self.itl_base_s + self.itl_per_seq_s * running

    def prefill_rate(self, running: float) -> float:
        """Prompt tokens/s one prompt gets while ``running`` sequences decode beside it."""
        if running <= 0:
            return self.prefill_tokens_per_s
        return self.chunked_prefill_rate(running)

    def chunked_prefill_rate(self, running: float = 0.0) -> float:
        """Prompt tokens/s of one prompt prefilled in chunks, each inside a step with ``running`` decodes.

        At 0 it is a prompt alone on its replica: each chunk still costs a step's ``itl_base_s``
        (what a request's own prefill measures, as ``vllm:request_prefill_time_seconds`` does).
        """
        chunk = self.prefill_chunk_tokens
        return chunk / (self.step_s(max(running, 0.0)) + chunk / self.prefill_tokens_per_s)

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def load(cls, path: str | Path) -> ReplicaProfile:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise DataError(f"cannot read profile: {exc.strerror}", path=str(path)) from exc
        try:
            return cls.model_validate(json.loads(text))
        except json.JSONDecodeError as exc:
            raise DataError(f"not valid JSON: {exc.msg}", path=str(path), line=exc.lineno) from None
        except PydanticValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise DataError(f"not a replica profile: {problems}", path=str(path)) from None


DEFAULT_PROFILE = ReplicaProfile(
    name="default-qwen3-30b-a3b-1x80gb",
    source=(
        "Estimated, not measured: a Qwen3-30B-A3B-class MoE (3.3 B active of 30.5 B parameters, bf16) "
        "on one 80 GB H100-class GPU with chunked prefill. Decode is memory-bound: 6.6 GB of active "
        "weights per step at batch 1 (about 2 ms at 3.35 TB/s) plus attention and launch overheads "
        "gives ~7 ms; at batch ~65 most experts are touched (61 GB read, ~18 ms), hence 0.2 ms per "
        "running sequence and ITL 20 ms at ~65 sequences. Prefill is compute-bound: 6.6 GFLOP per token "
        "at ~160 TFLOP/s sustained (16 % of the 990 TFLOP/s bf16 peak) is ~24k tokens/s. KV cache: "
        "48 layers x 4 KV heads x 128 dims x 2 (K, V) x 2 bytes = 96 KiB per token, ~15 GB left after "
        "weights: ~150k tokens. Override with a measured profile (moeslo profile, --profile)."
    ),
    prefill_tokens_per_s=24_000.0,
    itl_base_s=0.007,
    itl_per_seq_s=0.0002,
    prefill_chunk_tokens=2048,
    kv_capacity_tokens=150_000,
    max_num_seqs=256,
    ttft_overhead_s=0.01,
)


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


@dataclass(frozen=True, kw_only=True, slots=True)
class Targets:
    ttft_s: float = TTFT_THRESHOLD_S
    itl_s: float = ITL_THRESHOLD_S
    headroom: float = 0.85
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
    """p99 TTFT with no queue at all (the longest prompts' own prefill): no fleet size goes below it."""

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
        slower than their profile leave shorter prompts feasible (:meth:`longest_feasible_prompt`)."""
        self._last_needed = 1
        """The last answer of :meth:`replicas_needed`: consecutive loads need about as many replicas, so the
        search starts there (two predictions instead of a dozen; the answer does not depend on it)."""

    def predict(self, load: Load, replicas: int) -> Prediction:
        """Latencies of ``replicas`` under ``load``, with the online corrections applied.

        A correction factor ``c`` plans as if the load were ``c`` times higher for that
        latency (observed 30 % slower than predicted: size for 30 % more load), which
        more replicas can always satisfy, unlike scaling the latency itself.
        """
        if self.ttft_correction == 1.0 and self.itl_correction == 1.0:
            return self._predict(load, replicas)
        for_ttft = self._predict(load.scaled(self.ttft_correction), replicas)
        for_itl = self._predict(load.scaled(self.itl_correction), replicas)
        return Prediction(
            replicas=replicas,
            ttft_p99_s=for_ttft.ttft_p99_s,
            itl_mean_s=for_itl.itl_mean_s,
            itl_p99_s=for_itl.itl_p99_s,
            running_per_replica=max(for_ttft.running_per_replica, for_itl.running_per_replica),
            prefill_utilization=for_ttft.prefill_utilization,
            kv_utilization=max(for_ttft.kv_utilization, for_itl.kv_utilization),
            ttft_floor_s=for_ttft.ttft_floor_s,
        )

    def _predict(self, load: Load, replicas: int) -> Prediction:
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
        ttft_p99, floor = self._ttft_p99(load, replicas, running)
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
        floor = p.ttft_overhead_s + max(tail, typical)
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

    def longest_feasible_prompt(self) -> float:
        """Prompts longer than this miss the TTFT objective alone on a replica: no fleet size helps them.

        The prompt is prefilled in chunks (:meth:`ReplicaProfile.chunked_prefill_rate`) at the speed
        the replicas are observed to prefill at (:attr:`prefill_speed_correction`).
        """
        hit = min(max(self.prefix_hit_rate, 0.0), 0.99)
        speed = self.profile.chunked_prefill_rate(0.0) * self.prefill_speed_correction
        return self.targets.ttft_allowance.longest_feasible_prompt(
            self.targets.ttft_s,
            overhead_s=self.profile.ttft_overhead_s,
            prefill_tokens_per_s=speed / self.profile.uncached_share(hit),
        )

    def correct_prefill_speed(self, *, prompt_tokens_per_prefill_s: float, running_per_replica: float) -> None:
        """Fold an observed prefill speed into :attr:`prefill_speed_correction`.

        ``prompt_tokens_per_prefill_s`` is the finished requests' prompt tokens (cached ones included)
        over their prefill time (first scheduled to first token, no queue); the profile's speed
        at the same decode batch and prefix-cache hit rate is what it is compared with.
        """
        if not (math.isfinite(prompt_tokens_per_prefill_s) and prompt_tokens_per_prefill_s > 0):
            return
        hit = min(max(self.prefix_hit_rate, 0.0), 0.99)
        predicted = self.profile.chunked_prefill_rate(running_per_replica) / self.profile.uncached_share(hit)
        self.prefill_speed_correction = _ewma(self.prefill_speed_correction, prompt_tokens_per_prefill_s / predicted)

    def meets_targets(self, prediction: Prediction, headroom: float | None = None) -> bool:
        t = self.targets
        room = t.headroom if headroom is None else headroom
        # Prompts so long that their own prefill eats the TTFT budget cannot be helped by more
        # replicas; then size so the queue adds at most a fifth of the target on top of them.
        ttft_limit = max(t.ttft_s * room, prediction.ttft_floor_s + 0.2 * t.ttft_s)
        return (
            prediction.stable
            and prediction.ttft_p99_s <= ttft_limit
            and prediction.itl_p99_s <= t.itl_s * room
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
            return self.meets_targets(self.predict(load, replicas), headroom)

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
        ceiling = self.profile.max_request_rate_rps
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

    def correct(self, *, load: Load, ready_replicas: int, ttft_p99_s: float | None, itl_p99_s: float | None) -> None:
        """Fold observed p99 latencies into the correction factors (EWMA of observed / predicted)."""
        if ready_replicas <= 0 or load.request_rate_rps <= 0:
            return
        raw = self._predict(load, ready_replicas)
        if not raw.stable:
            return
        if ttft_p99_s is not None and ttft_p99_s > 0 and raw.ttft_p99_s > 0:
            self.ttft_correction = _ewma(self.ttft_correction, ttft_p99_s / raw.ttft_p99_s)
        if itl_p99_s is not None and itl_p99_s > 0 and raw.itl_p99_s > 0:
            self.itl_correction = _ewma(self.itl_correction, itl_p99_s / raw.itl_p99_s)

    def queue_floor(self, *, queue_depth: float, ready_replicas: int, load: Load, drain_s: float) -> int:
        """Replicas for the load plus draining the waiting prompts within ``drain_s`` (0: no queue).

        A queue longer than one request per ready replica means the fleet is already short;
        sizing for its drain on top of the arrivals covers what the forecast did not see.
        """
        if queue_depth <= max(ready_replicas, 1) or load.request_rate_rps <= 0:
            return 0
        drain_rate = queue_depth / max(drain_s, 1.0)
        return self.replicas_needed(load.scaled(1.0 + drain_rate / load.request_rate_rps))


def _ewma(previous: float, observed: float, weight: float = 0.2, low: float = 0.5, high: float = 2.0) -> float:
    return min(max((1 - weight) * previous + weight * observed, low), high)
