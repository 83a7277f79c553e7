"""Which histogram series a policy's TTFT objective is counted from (PromQL, scrapes, OpenSLO, alerts).

A flat objective (no long-prompt allowance) reads vLLM's own
``vllm:time_to_first_token_seconds``, so a stock vLLM server needs nothing more.
An objective with an allowance reads ``moeslo_ttft_normalized_seconds`` at the
series labelled with exactly its allowance: its good count at ``le=threshold_s``
is then the verdict of :meth:`contracts.ttft_objective.TtftAllowance.is_good`
for every request.  An engine that does not export that allowance has no such
series: its TTFT SLI is then unknown, never read from another objective's counts,
and both sources report :func:`missing_allowance_problem` (the series wanted and
how to have it written) with the policy's observation, so the status, the page and
the decision held for partial data name the cause.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from contracts.catalogue import (
    PER_1K_PROMPT_TOKENS_LABEL,
    REFERENCE_PROMPT_TOKENS_LABEL,
    TTFT_HISTOGRAM,
    TTFT_NORMALIZED_HISTOGRAM,
)
from contracts.ttft_objective import TTFT_ALLOWANCES_ENV, TtftAllowance, format_allowances

__all__ = ["allowance_from_labels", "missing_allowance_problem", "ttft_matchers", "ttft_metric", "writes_allowance"]

VLLM_PLUGIN_ON = "MOESLO_VLLM_PLUGIN=1"
"""The vLLM plugin's switch (``engine.vllm_plugin.settings``), which the controller may not import."""


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


def writes_allowance(written: Iterable[TtftAllowance], allowance: TtftAllowance) -> bool:
    """Whether ``written`` has the series ``allowance`` is read from: compared as labels, which PromQL and the
    scrapes match on (a stored policy's 0.1234567 s reads the series labelled 0.123457)."""
    labels = allowance.labels()
    return any(a.labels() == labels for a in written)


def missing_allowance_problem(
    allowance: TtftAllowance, model: str, written: Iterable[TtftAllowance], *, served: bool, where: str = ""
) -> str | None:
    """Why a policy's TTFT SLI is unknown when its engines write no series at its allowance (None: they do).

    ``written``: the allowances the model's engines write series for; ``served``: whether they count TTFT at all
    (a flat histogram with requests in it).  With neither, nothing is claimed: an engine that has not served yet,
    or whose plugin has not published yet, is no misconfiguration.  ``where`` names the engines (" on ...").
    """
    written = sorted(set(written), key=lambda a: (a.reference_prompt_tokens, a.per_1k_prompt_tokens_s))
    if allowance.flat or writes_allowance(written, allowance) or not (written or served):
        return None
    wanted = format_allowances((allowance,))
    series = f'{TTFT_NORMALIZED_HISTOGRAM}{{model_name="{model}",{ttft_matchers(allowance)}}}'
    writes = f"they write it at {format_allowances(tuple(written))} only" if written else \
        f"they write no {TTFT_NORMALIZED_HISTOGRAM}"
    return (
        f"TTFT SLI unknown: no {series} series{where} ({writes}); start the engines with "
        f"moeslo serve --ttft-allowances {wanted}, or vLLM with the moeslo plugin on ({VLLM_PLUGIN_ON}) "
        f"and {TTFT_ALLOWANCES_ENV}={wanted}"
    )
