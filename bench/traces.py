"""Where the demo and benchmarks find the Azure 2023 conversation trace."""

from __future__ import annotations

from pathlib import Path

BUNDLED_CONVERSATION_SLICE = Path(__file__).resolve().parent / "data" / "AzureLLMInferenceTrace_conv_15min.csv"
"""First 15 minutes of the Azure LLM inference trace 2023 (conversation), CC BY 4.0 (see data/README.md)."""

SHARED_CONVERSATION = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
)


def conversation_trace() -> Path:
    """The full shared trace when it is beside the project, else the bundled slice."""
    return SHARED_CONVERSATION if SHARED_CONVERSATION.exists() else BUNDLED_CONVERSATION_SLICE
