"""Named token-length distributions: the real rows of a shared-data trace, or fixed lengths."""

from __future__ import annotations

from pathlib import Path

from contracts.datadir import default_data_dir
from contracts.errors import DataError
from contracts.trace_fields import MAX_TOKENS
from contracts.traces import LengthDistribution, RequestTrace, load_trace

NAMED_LENGTHS = {
    "azure-2023-conv": ("azure-llm-2023", "AzureLLMInferenceTrace_conv.csv"),
    "azure-2023-code": ("azure-llm-2023", "AzureLLMInferenceTrace_code.csv"),
}
"""Length distributions by name: the real per-request rows of a shared-data trace."""


def resolve_lengths(spec: str, *, data_dir: Path | None = None) -> LengthDistribution:
    """A length distribution from a name (``azure-2023-conv``), ``fixed:P,O`` or a trace path."""
    if spec.startswith("fixed:"):
        try:
            prompt, output = (int(x) for x in spec.removeprefix("fixed:").split(","))
        except ValueError:
            raise DataError(f"length spec {spec!r} must look like fixed:PROMPT,OUTPUT") from None
        if not (1 <= prompt <= MAX_TOKENS and 1 <= output <= MAX_TOKENS):
            raise DataError(f"length spec {spec!r}: a request has from 1 to {MAX_TOKENS:,} prompt tokens and from 1 "
                            f"to {MAX_TOKENS:,} output tokens")  # fmt: skip
        return LengthDistribution.fixed(prompt, output)
    if spec in NAMED_LENGTHS:
        folder, name = NAMED_LENGTHS[spec]
        path = (data_dir or default_data_dir()) / folder / name
        if not path.exists():
            raise DataError(f"length distribution {spec!r} needs this file (set MOESLO_DATA_DIR)", path=str(path))
        trace = load_trace(path, "azure")
    else:
        trace = load_trace(spec)
    if not isinstance(trace, RequestTrace):
        raise DataError("a length distribution needs a per-request trace, not counts", path=spec)
    return LengthDistribution(spec, trace.prompt_tokens, trace.output_tokens)
