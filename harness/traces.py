"""Where the demo and benchmarks find the Azure 2023 conversation trace."""

from __future__ import annotations

from pathlib import Path

from contracts.datadir import default_data_dir

BUNDLED_CONVERSATION_SLICE = Path(__file__).resolve().parent / "data" / "AzureLLMInferenceTrace_conv_15min.csv"
"""First 15 minutes of the Azure LLM inference trace 2023 (conversation), CC BY 4.0 (see harness/data/README.md)."""

SHARED_CONVERSATION = ("azure-llm-2023", "AzureLLMInferenceTrace_conv.csv")
"""The full trace, under the shared data folder."""


def conversation_trace() -> Path:
    """The full shared trace when it is beside the project, else the bundled slice."""
    shared = default_data_dir().joinpath(*SHARED_CONVERSATION)
    return shared if shared.exists() else BUNDLED_CONVERSATION_SLICE
