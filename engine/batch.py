"""The contract between the scheduler and the model executor.

The scheduler owns requests, the KV block free list and block tables; the
executor owns the model, the KV cache tensors and the expert placement.  Each
step the scheduler hands the executor a :class:`StepPlan`: for each scheduled
sequence, the tokens to compute now (a prefill chunk or one decode token),
how many of its tokens are already in the KV cache, its block table, and
which logits it wants: the last token's (to sample from), or every token's
(a request that asked for its prompt's log-probabilities).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SeqChunk:
    """One sequence's share of a step."""

    seq_id: int
    num_computed: int
    """Tokens of this sequence already in the KV cache (their positions are 0..num_computed-1)."""
    token_ids: tuple[int, ...]
    """Tokens to compute now, at positions num_computed.. num_computed+len-1."""
    block_table: tuple[int, ...]
    """KV block ids holding positions 0.. of this sequence; covers num_computed + len(token_ids)."""
    needs_logits: bool
    """Whether the last token's logits are wanted (end of prompt, or a decode step)."""
    all_logits: bool = False
    """Whether every token's logits are wanted, not only the last (the prompt's log-probabilities were asked)."""

    @property
    def num_logits(self) -> int:
        """Logit rows this chunk gets, in position order."""
        return len(self.token_ids) if self.all_logits else int(self.needs_logits)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """The work of one engine step."""

    chunks: tuple[SeqChunk, ...]

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def num_logits(self) -> int:
        return sum(c.num_logits for c in self.chunks)
