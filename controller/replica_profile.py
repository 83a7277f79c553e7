"""A replica's measured (or estimated) capacity: what ``moeslo profile`` writes and the capacity model reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from contracts.errors import DataError
from contracts.text_files import read_text

__all__ = [
    "CEILING_LENGTH_FACTOR", "DEFAULT_PROFILE", "CeilingConditions", "Count", "Number", "PrefixProbe", "ProfilePoint",
    "ReplicaProfile",
]  # fmt: skip

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
    requests: Annotated[Count, Field(ge=0, le=10**12)] = 0


class PrefixProbe(BaseModel):
    """``moeslo profile``'s prefix-cache measurement on an idle replica, for the record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cold_ttft_p50_s: Number
    """Median TTFT of prompts that share nothing with earlier ones."""
    cached_ttft_p50_s: Number
    """Median TTFT of prompts of the same length whose leading part was in the prefix cache."""
    cached_share: Annotated[Number, Field(ge=0, le=1)]
    """Share of each such prompt found in the cache (the engine's counters; as sent when it has none)."""
    requests: Annotated[Count, Field(ge=0, le=10**12)] = 0
    """Requests of each kind."""


CEILING_LENGTH_FACTOR = 1.5
"""A measured ceiling caps a load unless its mean prompt or output length is under the sweep's by more than this
factor."""


class CeilingConditions(BaseModel):
    """What a measured ceiling (``max_request_rate_rps``) was measured under: a level held when its requests met
    these objectives, at these lengths.  It bounds what a replica holds under objectives as strict or stricter and
    at lengths as long or longer (heavier work holds no more requests/s), and says nothing of easier ones:
    requests/s held at 500 ms / 20 ms and 256/64 tokens sized a 2 s / 100 ms policy at 20 replicas where 5 do, and
    32/16-token requests at 10 where 2 do."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_s: Annotated[Number, Field(gt=0, le=3600.0)]
    """The TTFT threshold the levels were scored against."""
    itl_s: Annotated[Number, Field(gt=0, le=60.0)]
    """The ITL threshold the levels were scored against."""
    prompt_tokens: Annotated[Number, Field(gt=0, le=1e8)] | None = None
    """The sweep's prompt length (None: not recorded, any length is taken to match)."""
    output_tokens: Annotated[Number, Field(gt=0, le=1e8)] | None = None
    """The sweep's output length (None: not recorded, any length is taken to match)."""

    def hold_for(self, *, ttft_s: float, itl_s: float, prompt_tokens: float, output_tokens: float) -> bool:
        """Whether the ceiling bounds a policy with these objectives and mean lengths (0: unknown, taken to match):
        objectives no looser and lengths no shorter (by :data:`CEILING_LENGTH_FACTOR`) than the sweep's.  One way
        only: dropped for heavier work too, the ceiling left a fleet to the latency lines it corrects, and a mean
        length crossing the bound swung the need threefold (a 450 ms objective sized 10 replicas where 500 ms did
        40)."""
        no_looser = ttft_s <= self.ttft_s * (1 + 1e-9) and itl_s <= self.itl_s * (1 + 1e-9)
        return no_looser and _no_shorter(prompt_tokens, self.prompt_tokens) and _no_shorter(
            output_tokens, self.output_tokens
        )


def _no_shorter(observed: float, measured: float | None) -> bool:
    if measured is None or observed <= 0:
        return True
    return observed >= measured / CEILING_LENGTH_FACTOR


class ReplicaProfile(BaseModel):
    """Per-replica capacity, as ``moeslo profile`` writes it (JSON)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(strict=True, max_length=253)] = "default"
    source: Annotated[str, Field(strict=True, max_length=4096)] = ""
    """Where the numbers come from (a measurement, or how they were estimated)."""
    # Bounds a measurement stays within: a prefill of 5e-324 tokens/s passed ``gt=0`` and broke the model's sums.
    prefill_tokens_per_s: Annotated[Number, Field(ge=1.0, le=1e9)]
    itl_base_s: Annotated[Number, Field(ge=1e-6, le=60.0)]
    itl_per_seq_s: Annotated[Number, Field(ge=0, le=60.0)]
    # Counts too: 10**400 KV tokens passed ``ge=1``, and the sizing advisor's float sums overflowed every tick.
    prefill_chunk_tokens: Annotated[Count, Field(ge=1, le=10**8)] = 2048
    kv_capacity_tokens: Annotated[Count, Field(ge=1, le=10**10)]
    max_num_seqs: Annotated[Count, Field(ge=1, le=10**7)] = 256
    ttft_overhead_s: Annotated[Number, Field(ge=0, le=600.0)] = 0.01
    """Fixed per-request cost before prefill (tokenization, scheduling, network)."""
    points: Annotated[tuple[ProfilePoint, ...], Field(max_length=1000)] = ()
    """The sweep the parameters were fitted to, for the record."""
    cached_token_cost: Annotated[Number, Field(ge=0, le=1)] = 0.0
    """Prefill time a prompt token found in the prefix cache still costs, relative to a computed one."""
    prefix_probe: PrefixProbe | None = None
    """The measurement ``cached_token_cost`` was fitted to (None: not measured)."""
    max_request_rate_rps: Annotated[Number, Field(ge=1e-6, le=1e7)] | None = None
    """The request rate one replica was measured to hold within the objectives, tails included (None:
    not measured): the model never sizes a replica for more, whatever its latency lines say, where
    :attr:`ceiling_measured_at` holds (:meth:`ceiling_rps`)."""
    ceiling_measured_at: CeilingConditions | None = None
    """The objectives and lengths the ceiling was measured at (None: not recorded, it caps every policy)."""

    def ceiling_rps(self, *, ttft_s: float, itl_s: float, prompt_tokens: float, output_tokens: float) -> float | None:
        """The measured ceiling where it bounds a policy with these objectives and mean lengths, else None."""
        measured = self.ceiling_measured_at
        if measured is None or measured.hold_for(ttft_s=ttft_s, itl_s=itl_s, prompt_tokens=prompt_tokens,
                                                 output_tokens=output_tokens):  # fmt: skip
            return self.max_request_rate_rps
        return None

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
        text = read_text(path, what="profile")
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
