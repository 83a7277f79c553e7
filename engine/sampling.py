"""Sampling parameters and the sampler: greedy or temperature, seeded per request.

Before a token is picked, a request's logits may be adjusted as vLLM adjusts
them, in vLLM's order: ``logit_bias`` added; the stop tokens (eos, even with
``ignore_eos``, and ``stop_token_ids``) masked until ``min_tokens`` tokens are out; then the
repetition penalty (tokens of the prompt or the output: positive logits
divided by it, negative ones multiplied), the frequency penalty (times each
token's count in the output) and the presence penalty (once per token the
output holds) subtracted.  Requests that ask for none of these pay nothing.
A sampled (not greedy) row is then scaled by its temperature and cut to
``min_p``, ``top_k`` and ``top_p``, in that order (vLLM's).

Parameters are validated against what the sampler can compute (a seed torch's
generator takes; a temperature of 0 is greedy, and one in (0, :data:`MIN_TEMPERATURE`) samples at
:data:`MIN_TEMPERATURE`, as vLLM raises it), and
:func:`sample_each` filters a step's sampled rows as one table and draws each row
with its own generator: a row that still fails ends only its own request (the
caller gets the failure by row), never the batch.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from contracts.errors import ValidationError

if TYPE_CHECKING:
    import torch

MIN_SEED, MAX_SEED = -(2**63), 2**64 - 1
"""The seeds ``torch.Generator.manual_seed`` takes."""
MAX_TOP_K = 2**31 - 1
"""The largest ``top_k`` taken (one at or past the vocabulary is off): every integer the API process sends the
core over msgpack is bounded, so none overflows its 64 bits."""
MAX_LOGPROBS = 20
"""The most alternatives per token a request may ask log-probabilities of (vLLM's default limit)."""
MIN_REPETITION_PENALTY = 0.01
"""Below it, dividing a logit by the penalty overflows what the sampler can compute."""
MIN_TEMPERATURE = 0.01
"""The lowest temperature sampled at: a smaller one above 0 is raised to it, as vLLM's ``_MAX_TEMP`` raises it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How one request generates; validated at construction."""

    max_tokens: int = 16
    temperature: float = 1.0
    """0 means greedy (argmax); in (0, :data:`MIN_TEMPERATURE`) samples at :data:`MIN_TEMPERATURE`."""
    top_p: float = 1.0
    top_k: int = 0
    """Sample among the ``top_k`` most likely tokens only; 0 or -1 (vLLM's values), or the vocabulary or more: off."""
    min_p: float = 0.0
    """Drop the tokens less likely than ``min_p`` times the most likely one (0: off)."""
    seed: int | None = None
    """Seed of this request's generator; None draws one, so runs differ."""
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    """Stop tokens (eos, even with ``ignore_eos``, and ``stop_token_ids``) cannot be sampled until this many tokens
    are out (vLLM's)."""
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias added to its logit)."""
    logprobs: int | None = None
    """Report each generated token's log-probability and this many most likely alternatives (None: off)."""
    prompt_logprobs: int | None = None
    """Report each prompt token's log-probability (after the first) and this many alternatives (None: off;
    vLLM's ``prompt_logprobs``).  Such a request computes its whole prompt: no prefix-cache hits."""

    def __post_init__(self) -> None:
        problems = self._penalty_problems()
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            problems.append(f"temperature must be in [0, 100] (0: greedy), got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if not -1 <= self.top_k <= MAX_TOP_K:
            problems.append(f"top_k must be 0 or -1 (off), or in [1, 2**31 - 1], got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            problems.append(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not MIN_SEED <= self.seed <= MAX_SEED:
            problems.append(f"seed must be an integer in [-2**63, 2**64 - 1], got {self.seed}")
        if problems:
            raise ValidationError(problems)

    def _penalty_problems(self) -> list[str]:
        problems = []
        if not 0 <= self.min_tokens <= self.max_tokens:
            problems.append(f"min_tokens must be in [0, max_tokens={self.max_tokens}], got {self.min_tokens}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                problems.append(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= 100.0:
            problems.append(f"repetition_penalty must be in [{MIN_REPETITION_PENALTY}, 100], "
                            f"got {self.repetition_penalty}")
        if any(not -100.0 <= bias <= 100.0 for _, bias in self.logit_bias):
            problems.append("logit_bias values must be in [-100, 100]")
        if any(token < 0 for token, _ in self.logit_bias):
            problems.append("logit_bias token ids must be >= 0")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not 0 <= k <= MAX_LOGPROBS:
                problems.append(f"{name} must be in [0, {MAX_LOGPROBS}], got {k}")
        return problems

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusts_logits(self) -> bool:
        """Whether the logits change before sampling (a bias, a penalty, or stop tokens held back)."""
        return bool(self.logit_bias or self.min_tokens or self.presence_penalty or self.frequency_penalty
                    or self.repetition_penalty != 1.0)


TokenLogprob = tuple[float, tuple[tuple[int, float], ...]]
"""A generated token's log-probability, and the most likely (token id, log-probability), most likely first."""


@dataclass(frozen=True, slots=True)
class TokenHistory:
    """A request's tokens so far: what penalties and ``min_tokens`` look at."""

    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]


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


def sample_each(
    logits: torch.Tensor, samplers: list[RequestSampler], histories: Sequence[TokenHistory] | None = None,
    *, eos_token_ids: Sequence[int] = (),
) -> tuple[list[int], dict[int, str]]:
    """One token per row, each row on its own: (tokens, why each failed row failed).

    ``histories`` (per row) are needed by requests that adjust their logits
    (without them, such rows are sampled unadjusted).  A failed row's token is
    0 and must not be used; the other rows are unaffected.
    """
    import torch

    if logits.shape[0] != len(samplers):
        raise ValueError(f"{logits.shape[0]} logit rows for {len(samplers)} samplers")
    out: list[int] = [0] * len(samplers)
    failures: dict[int, str] = {}
    adjusted: dict[int, torch.Tensor] = {}
    for row, sampler in enumerate(samplers):
        if histories is not None and sampler.params.adjusts_logits:
            try:
                adjusted[row] = adjust_logits(logits[row], sampler.params, histories[row], eos_token_ids)
            except (RuntimeError, ValueError, IndexError) as exc:
                failures[row] = f"{type(exc).__name__}: {exc}"
    greedy_rows = [i for i, s in enumerate(samplers) if s.params.greedy and i not in adjusted and i not in failures]
    if greedy_rows:
        picks = torch.argmax(logits[greedy_rows], dim=-1).tolist()
        for row, tok in zip(greedy_rows, picks, strict=True):
            out[row] = int(tok)
    for row, row_logits in adjusted.items():
        if samplers[row].params.greedy:
            out[row] = int(torch.argmax(row_logits))
    drawn = [i for i, s in enumerate(samplers) if not s.params.greedy and i not in failures]
    if drawn:
        table = logits[drawn].float()
        for j, row in enumerate(drawn):
            if row in adjusted:
                table[j] = adjusted[row]
        try:
            tokens, failed = _sample_rows(table, [samplers[row] for row in drawn])
        except (RuntimeError, ValueError) as exc:  # a shape the batch cannot take: every drawn row fails alike
            tokens, failed = [0] * len(drawn), {j: f"{type(exc).__name__}: {exc}" for j in range(len(drawn))}
        for j, row in enumerate(drawn):
            out[row] = tokens[j]
        failures.update({drawn[j]: why for j, why in failed.items()})
    return out, failures


def adjust_logits(
    logits: torch.Tensor, params: SamplingParams, history: TokenHistory, eos_token_ids: Sequence[int] = ()
) -> torch.Tensor:
    """One row's logits after bias, ``min_tokens`` and penalties (a new float32 tensor; see the module doc)."""
    import torch

    out = logits.float().clone()
    vocab = out.shape[-1]
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long)
        out.index_add_(0, ids, torch.tensor([b for _, b in params.logit_bias], dtype=out.dtype))
    if len(history.output_token_ids) < params.min_tokens:
        # Every eos id, ignore_eos or not: vLLM's MinTokens masks its all_stop_token_ids.
        stops = [*params.stop_token_ids, *eos_token_ids]
        if stops and len(set(stops)) < vocab:  # (masking every token would leave nothing to sample)
            out[torch.tensor(stops, dtype=torch.long)] = float("-inf")
    output = torch.tensor(list(history.output_token_ids), dtype=torch.long)
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[torch.tensor(list(history.prompt_token_ids), dtype=torch.long)] = True
        seen[output] = True
        penalized = torch.where(out > 0, out / params.repetition_penalty, out * params.repetition_penalty)
        out = torch.where(seen, penalized, out)
    if params.frequency_penalty or params.presence_penalty:
        counts = torch.bincount(output, minlength=vocab)[:vocab].to(out.dtype)
        out -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(out.dtype)
    return out


NUCLEUS_CANDIDATES = (64, 1024)
"""Candidate counts tried for a ``top_p`` nucleus before a whole row is sorted (most nuclei are small); each
only on a vocabulary of :data:`NUCLEUS_SHARE` times it or more, where a miss costs little beside the sort."""
NUCLEUS_SHARE = 16


def _sample_rows(logits: torch.Tensor, samplers: Sequence[RequestSampler]) -> tuple[list[int], dict[int, str]]:
    """One draw per row of ``logits`` (a float32 table the caller owns): temperature, then ``min_p``, then
    ``top_k``, then ``top_p`` (vLLM's order), then one seeded uniform per row read through the row's CDF.

    The filters run on the whole batch at once: sampled one row at a time, a 16-row step over a
    152K-token vocabulary spent 58-260 ms choosing its tokens (docs/benchmarks.md#sampler).
    """
    import torch

    params = [sampler.params for sampler in samplers]
    temperatures = torch.tensor([max(p.temperature, MIN_TEMPERATURE) for p in params], dtype=logits.dtype)
    logits.sub_(logits.max(dim=-1, keepdim=True).values).div_(temperatures[:, None])  # row max 0: no overflow
    if any(p.min_p > 0.0 for p in params):  # p < min_p * p_max, in log space: scaled < log(min_p)
        floors = torch.tensor([math.log(p.min_p) if p.min_p > 0.0 else -math.inf for p in params])
        logits.masked_fill_(logits < floors[:, None], -math.inf)
    _cut_top_k(logits, params)
    probs = torch.softmax(logits, dim=-1)
    _cut_top_p(probs, params)
    return _draw(probs, samplers)


def _cut_top_k(scaled: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    """Mask what lies below each row's k-th logit (ties with it stay, as in vLLM)."""
    import torch

    rows = [i for i, p in enumerate(params) if 0 < p.top_k < scaled.shape[-1]]
    if not rows:
        return
    ks = torch.tensor([params[i].top_k for i in rows])
    sub = scaled[rows]
    kth = torch.topk(sub, int(ks.max())).values.gather(1, (ks - 1)[:, None])
    scaled[rows] = sub.masked_fill_(sub < kth, -math.inf)


def _cut_top_p(probs: torch.Tensor, params: Sequence[SamplingParams]) -> None:
    """Zero each row's tokens once the more likely ones before them reach its ``top_p``.

    Only the most likely tokens are sorted, more of them until they hold ``top_p`` of the row: every
    token after them is dropped whatever its order, so the nucleus is the full sort's.
    """
    import torch

    left = [i for i, p in enumerate(params) if p.top_p < 1.0]
    vocab = probs.shape[-1]
    for candidates in (*(k for k in NUCLEUS_CANDIDATES if k * NUCLEUS_SHARE <= vocab), vocab):
        if not left:
            return
        top_p = torch.tensor([params[i].top_p for i in left], dtype=probs.dtype)
        values, ids = torch.topk(probs[left], candidates, dim=-1)
        held = (values.sum(dim=-1) >= top_p) | (candidates == vocab)
        rows = [i for i, done in zip(left, held.tolist(), strict=True) if done]
        if rows:
            values, ids, top_p = values[held], ids[held], top_p[held]
            drop = (values.cumsum(dim=-1) - values) >= top_p[:, None]
            drop[:, 0] = False  # the most likely token always stays (a top_p below float32's resolution drops none)
            probs[rows] = torch.zeros_like(probs[rows]).scatter_(-1, ids, values.masked_fill_(drop, 0.0))
        left = [i for i, done in zip(left, held.tolist(), strict=True) if not done]


def _draw(probs: torch.Tensor, samplers: Sequence[RequestSampler]) -> tuple[list[int], dict[int, str]]:
    """Each row's token: its generator's next uniform, placed on the row's cumulative probabilities."""
    import torch

    failures: dict[int, str] = {}
    cdf = probs.double().cumsum_(dim=-1)
    totals = cdf[:, -1]  # a NaN or infinity anywhere in a row reaches its total: one check, no second pass
    usable = (torch.isfinite(totals) & (totals > 0.0)).tolist()
    uniforms = torch.zeros(len(samplers), dtype=torch.float64)
    for row, sampler in enumerate(samplers):
        if not usable[row]:
            failures[row] = "ValueError: the token probabilities are not finite"
            continue
        try:
            uniforms[row] = torch.rand((), generator=sampler.generator(), dtype=torch.float64)
        except (RuntimeError, ValueError, OverflowError) as exc:
            failures[row] = f"{type(exc).__name__}: {exc}"
    targets = (uniforms * totals)[:, None]
    # The first token whose cumulative probability passes the target has a probability above 0.
    picks = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    past = picks >= probs.shape[-1]  # a target rounded up to the row's total: its last likely token
    if bool(past.any()):
        picks[past] = probs.shape[-1] - 1 - (probs[past] > 0.0).flip(-1).int().argmax(dim=-1)
    return [0 if row in failures else int(token) for row, token in enumerate(picks.tolist())], failures


def token_logprobs(
    logits: torch.Tensor, tokens: Sequence[int], wanted: Sequence[int | None]
) -> dict[int, TokenLogprob]:
    """Per row that asks (``wanted[row]`` alternatives, not None): its token's log-probability and the top ones.

    Computed from the model's own logits, before any adjustment or temperature (vLLM's default).
    """
    import torch

    rows = [row for row, k in enumerate(wanted) if k is not None]
    if not rows:
        return {}
    logprobs = torch.log_softmax(logits[rows].float(), dim=-1)
    chosen = logprobs[torch.arange(len(rows)), torch.tensor([tokens[row] for row in rows])].tolist()
    most = max(int(wanted[row] or 0) for row in rows)
    top_values, top_ids = torch.topk(logprobs, most, dim=-1) if most else (logprobs[:, :0], logprobs[:, :0])
    top_values_list, top_ids_list = top_values.tolist(), top_ids.long().tolist()
    out: dict[int, TokenLogprob] = {}
    for i, row in enumerate(rows):
        k = int(wanted[row] or 0)
        out[row] = (float(chosen[i]), tuple(zip(top_ids_list[i][:k], top_values_list[i][:k], strict=True)))
    return out
