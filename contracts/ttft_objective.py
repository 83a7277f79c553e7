"""The TTFT objective at a reference prompt length: one definition for every place that judges a request.

A flat "TTFT <= 500 ms" is only meaningful for prompts near the length it was
set for (the mission's "for a 1K-token input").  A 12K-token prompt spends most
of that budget in its own prefill on any fleet, however large.  So the
objective is stated at a *reference* prompt length, and every token beyond it
earns a fixed allowance:

    allowance(p)     = per_1k_prompt_tokens_s * max(0, p - reference_prompt_tokens) / 1000
    normalized TTFT  = TTFT - allowance(p)
    good             = normalized TTFT <= threshold_s

This is the linear per-length objective of the serving literature (TTFT scaled
with input length, e.g. DistServe's and Mooncake's length-aware SLOs), chosen
over length classes because it has no cliff at a class edge and needs one
histogram, not one per class.  ``per_1k_prompt_tokens_s = 0`` is the flat
objective, exactly.  The engines export the normalized TTFT as a histogram
(``moeslo_ttft_normalized_seconds``) whose labels carry the two parameters, so
a PromQL good count at ``le=threshold_s`` is the same verdict as
:meth:`TtftAllowance.is_good` for every request.

A request is *infeasible* when even an idle replica cannot serve it within the
objective: its fixed overhead plus the prefill of its uncached tokens at the
replica's raw prefill speed already exceeds ``threshold_s + allowance(p)``.
No fleet size helps it, so it is counted apart and never drives a scale-up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from contracts.slo_defaults import TTFT_PER_1K_PROMPT_TOKENS_S, TTFT_REFERENCE_PROMPT_TOKENS

__all__ = [
    "EXPORTED_BY_DEFAULT",
    "FLAT",
    "TTFT_ALLOWANCES_ENV",
    "TtftAllowance",
    "exported_allowances",
    "format_allowance_label",
    "format_allowances",
    "label_keeps",
]


@dataclass(frozen=True, slots=True)
class TtftAllowance:
    """How much extra TTFT a prompt longer than the reference length is allowed."""

    reference_prompt_tokens: int = TTFT_REFERENCE_PROMPT_TOKENS
    per_1k_prompt_tokens_s: float = 0.0

    def __post_init__(self) -> None:
        if self.reference_prompt_tokens < 0:
            raise ValueError(f"reference_prompt_tokens must be >= 0, got {self.reference_prompt_tokens}")
        if not (math.isfinite(self.per_1k_prompt_tokens_s) and self.per_1k_prompt_tokens_s >= 0):
            raise ValueError(f"per_1k_prompt_tokens_s must be a number >= 0, got {self.per_1k_prompt_tokens_s}")

    @property
    def flat(self) -> bool:
        """No allowance: the objective is the plain TTFT threshold."""
        return self.per_1k_prompt_tokens_s == 0.0

    def allowance_s(self, prompt_tokens: float) -> float:
        return self.per_1k_prompt_tokens_s * max(0.0, prompt_tokens - self.reference_prompt_tokens) / 1000.0

    def normalized_s(self, ttft_s: float, prompt_tokens: float) -> float:
        """TTFT minus the prompt's allowance (what the normalized histogram observes, floored at 0)."""
        return max(ttft_s - self.allowance_s(prompt_tokens), 0.0)

    def is_good(self, ttft_s: float, prompt_tokens: float, threshold_s: float) -> bool:
        return self.normalized_s(ttft_s, prompt_tokens) <= threshold_s

    def is_infeasible(
        self,
        prompt_tokens: float,
        threshold_s: float,
        *,
        overhead_s: float,
        prefill_tokens_per_s: float,
        uncached_tokens: float | None = None,
    ) -> bool:
        """Even an idle replica prefilling the prompt's uncached tokens at full speed misses the objective."""
        computed = prompt_tokens if uncached_tokens is None else uncached_tokens
        idle_ttft = overhead_s + computed / prefill_tokens_per_s
        return idle_ttft - self.allowance_s(prompt_tokens) > threshold_s

    def infeasible_prompts(
        self, threshold_s: float, *, overhead_s: float, prefill_tokens_per_s: float
    ) -> tuple[float, float]:
        """The prompt lengths :meth:`is_infeasible` calls infeasible: those strictly between the two (``(inf, inf)``:
        none is).

        Idle TTFT minus allowance is piecewise linear in the prompt: rising at ``1 / prefill`` up to the reference,
        then at ``1 / prefill - per_1k / 1000``.  An allowance above the prefill time per token makes it fall
        there, so when the reference prompt itself misses, the infeasible prompts are a band that ends where the
        allowance catches up, not a tail.
        """
        per_token = 1.0 / prefill_tokens_per_s
        budget = threshold_s - overhead_s
        reference = float(self.reference_prompt_tokens)
        slope = per_token - self.per_1k_prompt_tokens_s / 1000.0
        over_at_reference = reference * per_token - budget
        if over_at_reference <= 0:  # every prompt up to the reference is feasible
            return (math.inf, math.inf) if slope <= 0 else (reference - over_at_reference / slope, math.inf)
        shortest = max(budget / per_token, 0.0)
        return shortest, math.inf if slope >= 0 else reference + over_at_reference / -slope

    def longest_feasible_prompt(self, threshold_s: float, *, overhead_s: float, prefill_tokens_per_s: float) -> float:
        """The prompt length up to which every request is feasible (inf: none is infeasible; 0: not even the
        shortest).  Longer ones may become feasible again: :meth:`infeasible_prompts` says where."""
        return self.infeasible_prompts(
            threshold_s, overhead_s=overhead_s, prefill_tokens_per_s=prefill_tokens_per_s
        )[0]

    def labels(self) -> dict[str, str]:
        """The label values of the normalized histogram's series for this allowance."""
        return {
            "reference_prompt_tokens": str(self.reference_prompt_tokens),
            "per_1k_prompt_tokens_s": format_allowance_label(self.per_1k_prompt_tokens_s),
        }


def format_allowance_label(value: float) -> str:
    """One spelling of an allowance in a label (``0.05``, never ``0.050000000000000003``).

    Six significant digits: a label written so stays the same for existing series, so a finer allowance is
    refused where it is stated (:func:`label_keeps`), never rounded into another's series."""
    return f"{value:.6g}"


def label_keeps(value: float) -> bool:
    """Whether :func:`format_allowance_label` spells ``value`` exactly (at most 6 significant digits)."""
    return float(format_allowance_label(value)) == value


FLAT = TtftAllowance()
"""The flat objective: no allowance for long prompts."""


EXPORTED_BY_DEFAULT: tuple[TtftAllowance, ...] = (
    TtftAllowance(TTFT_REFERENCE_PROMPT_TOKENS, TTFT_PER_1K_PROMPT_TOKENS_S),
)
"""What every engine exports a normalized series for, whatever else it is told (``exported_allowances(None)``)."""
TTFT_ALLOWANCES_ENV = "MOESLO_TTFT_ALLOWANCES"
"""The vLLM plugin's setting of :func:`exported_allowances` (``moeslo serve`` takes ``--ttft-allowances``)."""


def exported_allowances(text: str | None) -> tuple[TtftAllowance, ...]:
    """The allowances an engine exports ``moeslo_ttft_normalized_seconds`` for: the default, then each of
    ``text``, written ``REFERENCE:PER_1K`` and comma-separated (``2000:0.1``), as a policy's objective states it.

    A policy whose TTFT objective has another allowance reads a series only an engine told of it writes."""
    out = list(EXPORTED_BY_DEFAULT)
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        reference, sep, per_1k = item.partition(":")
        try:
            allowance = TtftAllowance(int(reference), float(per_1k)) if sep else None
        except ValueError as exc:
            raise ValueError(f"TTFT allowance {item!r}: {exc}") from None
        if allowance is not None and not label_keeps(allowance.per_1k_prompt_tokens_s):
            raise ValueError(f"TTFT allowance {item!r}: at most 6 significant digits, as the label spells it "
                             f"({format_allowance_label(allowance.per_1k_prompt_tokens_s)})")
        if allowance is None or allowance.flat:
            raise ValueError(f"TTFT allowance {item!r} must read REFERENCE_TOKENS:SECONDS_PER_1K above 0 (2000:0.1)")
        if allowance.labels() not in [a.labels() for a in out]:
            out.append(allowance)
    return tuple(out)


def format_allowances(allowances: tuple[TtftAllowance, ...]) -> str:
    """The ``REFERENCE:PER_1K,...`` spelling :func:`exported_allowances` reads."""
    labels = (a.labels() for a in allowances)
    return ",".join(f"{label['reference_prompt_tokens']}:{label['per_1k_prompt_tokens_s']}" for label in labels)
