"""The sampler draws a whole batch at once: each row as if alone, from the distribution its filters leave."""

from __future__ import annotations

import dataclasses
import math

import torch

from engine.sampling import (
    NUCLEUS_CANDIDATES,
    NUCLEUS_SHARE,
    RequestSampler,
    SamplingParams,
    TokenHistory,
    _cut_top_p,
    sample_each,
)

MIXED = [
    SamplingParams(temperature=1.0, seed=1),
    SamplingParams(temperature=0.6, top_k=20, top_p=0.95, seed=2),  # Qwen3's generation_config
    SamplingParams(temperature=0.7, top_p=0.8, seed=3),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.3, min_p=0.05, seed=4),
    SamplingParams(temperature=0.8, repetition_penalty=1.2, seed=5),
    SamplingParams(temperature=0.0, frequency_penalty=1.0),
]


def test_each_row_draws_the_same_tokens_alone_as_in_a_mixed_batch() -> None:
    steps = [torch.randn(len(MIXED), 3000, generator=torch.Generator().manual_seed(s)) for s in range(12)]
    history = TokenHistory(prompt_token_ids=(1, 2, 3), output_token_ids=(7, 7, 9))
    batch = [RequestSampler(p) for p in MIXED]
    together = [sample_each(logits, batch, [history] * len(MIXED))[0] for logits in steps]
    for row, params in enumerate(MIXED):
        alone = RequestSampler(params)
        tokens = [sample_each(logits[row:row + 1], [alone], [history])[0][0] for logits in steps]
        assert tokens == [step[row] for step in together], params


def _nucleus_by_full_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    ordered, order = torch.sort(probs, descending=True)
    drop = (torch.cumsum(ordered, dim=-1) - ordered) >= top_p
    drop[..., 0] = False
    return torch.zeros_like(probs).scatter(-1, order, ordered.masked_fill(drop, 0.0))


def test_the_nucleus_is_the_full_sorts_also_where_it_needs_more_than_the_first_candidates() -> None:
    vocab = NUCLEUS_SHARE * NUCLEUS_CANDIDATES[-1]
    flat = torch.softmax(torch.randn(3, vocab, generator=torch.Generator().manual_seed(9)) * 0.1, dim=-1)
    peaked = torch.softmax(torch.randn(2, vocab, generator=torch.Generator().manual_seed(8)) * 8.0, dim=-1)
    probs = torch.cat([flat, peaked])
    params = [SamplingParams(top_p=p) for p in (0.3, 0.9, 0.999, 0.5, 1e-30)]
    cut = probs.clone()
    _cut_top_p(cut, params)
    for row, p in enumerate(params):
        expected = _nucleus_by_full_sort(probs[row], p.top_p)
        assert torch.equal(cut[row] > 0, expected > 0), p.top_p
        assert torch.allclose(cut[row], expected)
    assert int((cut[2] > 0).sum()) > NUCLEUS_CANDIDATES[-1]  # the flat row at 0.999 needed the whole sort


def test_draws_follow_the_distribution_the_filters_leave() -> None:
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5])
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=11)
    probs = torch.softmax(logits[:5] / 0.7, dim=-1)
    keep = (torch.cumsum(probs, dim=-1) - probs) < 0.9
    expected = torch.where(keep, probs, 0.0) / torch.where(keep, probs, 0.0).sum()
    draws = 4000
    rows = logits.repeat(draws, 1)
    tokens, failures = sample_each(rows, [RequestSampler(dataclasses.replace(params, seed=i)) for i in range(draws)])
    assert failures == {}
    seen = torch.bincount(torch.tensor(tokens), minlength=8).double() / draws
    assert seen[5:].sum() == 0.0 and seen[~keep[:5].nonzero().flatten()].sum() == 0.0
    # Four standard errors of a share measured over 4,000 draws at most.
    assert torch.all((seen[:5] - expected.double()).abs() <= 4 * math.sqrt(0.25 / draws))
