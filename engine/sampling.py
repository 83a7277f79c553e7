"""Sampling parameters and the sampler: greedy or temperature, seeded per request.

Parameters are validated against what the sampler can compute (a seed torch's
generator takes, a temperature of 0 or at least :data:`MIN_TEMPERATURE`), and
:func:`sample_each` samples every row on its own: a row that still fails ends
only its own request (the caller gets the failure by row), never the batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contracts.errors import ValidationError

if TYPE_CHECKING:
    import torch

MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1
"""The seeds ``torch.Generator.manual_seed`` takes."""
MIN_TEMPERATURE = 0.01
"""The lowest non-zero temperature (below it, ``logits / temperature`` overflows float32); 0 is greedy."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How one request generates; validated at construction."""

    max_tokens: int = 16
    temperature: float = 1.0
    """0 means greedy (argmax)."""
    top_p: float = 1.0
    seed: int | None = None
    """Seed of this request's generator; None draws one, so runs differ."""
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (self.temperature == 0.0 or MIN_TEMPERATURE <= self.temperature <= 100.0):
            problems.append(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not MIN_SEED <= self.seed <= MAX_SEED:
            problems.append(f"seed must be an integer in [-2**63, 2**64 - 1], got {self.seed}")
        if problems:
            raise ValidationError(problems)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(slots=True)
class RequestSampler:
    """Per-request sampling state: the seeded generator lives as long as the request."""

    params: SamplingParams
    _generator: torch.Generator | None = field(default=None, repr=False)

    def generator(self) -> torch.Generator:
        if self._generator is None:
            import torch

            gen = torch.Generator()
            seed = self.params.seed if self.params.seed is not None else random.getrandbits(63)
            gen.manual_seed(seed)
            self._generator = gen
        return self._generator


def sample(logits: torch.Tensor, samplers: list[RequestSampler]) -> list[int]:
    """One token per row of ``logits`` (rows in the order of ``samplers``); raises if any row fails."""
    tokens, failures = sample_each(logits, samplers)
    if failures:
        row, why = next(iter(failures.items()))
        raise ValueError(f"sampling row {row} failed: {why}")
    return tokens


def sample_each(logits: torch.Tensor, samplers: list[RequestSampler]) -> tuple[list[int], dict[int, str]]:
    """One token per row, each row on its own: (tokens, why each failed row failed).

    A failed row's token is 0 and must not be used; the other rows are unaffected.
    """
    import torch

    if logits.shape[0] != len(samplers):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(samplers)} samplers")
    out: list[int] = [0] * len(samplers)
    failures: dict[int, str] = {}
    greedy_rows = [i for i, s in enumerate(samplers) if s.params.greedy]
    if greedy_rows:
        picks = torch.argmax(logits[greedy_rows], dim=-1).tolist()
        for row, tok in zip(greedy_rows, picks, strict=True):
            out[row] = int(tok)
    for row, sampler in enumerate(samplers):
        if sampler.params.greedy:
            continue
        try:
            out[row] = _sample_row(logits[row], sampler)
        except (RuntimeError, ValueError, OverflowError) as exc:
            failures[row] = f"{type(exc).__name__}: {exc}"
    return out, failures


def _sample_row(logits: torch.Tensor, sampler: RequestSampler) -> int:
    import torch

    params = sampler.params
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
        raise ValueError("the token probabilities are not finite")
    return int(torch.multinomial(probs, 1, generator=sampler.generator()).item())


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches ``top_p``."""
    import torch

    sorted_probs, order = torch.sort(probs, descending=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    # Drop a token when the tokens before it already reach top_p.
    drop = (cumulative - sorted_probs) >= top_p
    drop[..., 0] = False  # the most likely token always stays (a top_p below float32's resolution drops none)
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum()
