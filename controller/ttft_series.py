"""Which histogram series a policy's TTFT objective is counted from (PromQL, scrapes, OpenSLO, alerts).

A flat objective (no long-prompt allowance) reads vLLM's own
``vllm:time_to_first_token_seconds``, so a stock vLLM server needs nothing more.
An objective with an allowance reads ``moeslo_ttft_normalized_seconds`` at the
series labelled with exactly its allowance: its good count at ``le=threshold_s``
is then the verdict of :meth:`contracts.ttft_objective.TtftAllowance.is_good`
for every request.  An engine that does not export that allowance has no such
series, and the sources say so instead of reading another objective's counts.
"""

from __future__ import annotations

from collections.abc import Mapping

from contracts.catalogue import (
    PER_1K_PROMPT_TOKENS_LABEL,
    REFERENCE_PROMPT_TOKENS_LABEL,
    TTFT_HISTOGRAM,
    TTFT_NORMALIZED_HISTOGRAM,
)
from contracts.ttft_objective import TtftAllowance

__all__ = ["allowance_from_labels", "ttft_matchers", "ttft_metric"]


def ttft_metric(allowance: TtftAllowance) -> str:
    return TTFT_HISTOGRAM if allowance.flat else TTFT_NORMALIZED_HISTOGRAM


def ttft_matchers(allowance: TtftAllowance) -> str:
    """The extra PromQL label matchers of the allowance's series ("" for the flat objective)."""
    if allowance.flat:
        return ""
    return ",".join(f'{name}="{value}"' for name, value in allowance.labels().items())


def allowance_from_labels(labels: Mapping[str, str]) -> TtftAllowance | None:
    """The allowance a normalized series is labelled with (None when the labels do not spell one)."""
    try:
        return TtftAllowance(
            int(labels[REFERENCE_PROMPT_TOKENS_LABEL]), float(labels[PER_1K_PROMPT_TOKENS_LABEL])
        )
    except (KeyError, ValueError):
        return None
