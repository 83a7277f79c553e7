"""Where the demo and benchmarks find their traces: the Azure 2023 conversation requests and a 2024 day of counts."""

from __future__ import annotations

from pathlib import Path

from contracts.datadir import default_data_dir

BUNDLED_CONVERSATION_SLICE = Path(__file__).resolve().parent / "data" / "AzureLLMInferenceTrace_conv_15min.csv"
"""First 15 minutes of the Azure LLM inference trace 2023 (conversation), CC BY 4.0 (see harness/data/README.md)."""

DAILY_RAMP = Path(__file__).resolve().parent / "data" / "AzureLLMInferenceTrace2024_conv_counts_2024-05-13.csv"
"""One day of request counts per 10 s of the Azure LLM inference trace 2024 (conversation), CC BY 4.0:
the demo replays its morning rise."""

SHARED_CONVERSATION = ("azure-llm-2023", "AzureLLMInferenceTrace_conv.csv")
"""The full trace, under the shared data folder."""


def conversation_trace() -> Path:
    """The full shared trace when it is beside the project, else the bundled slice."""
    shared = default_data_dir().joinpath(*SHARED_CONVERSATION)
    return shared if shared.exists() else BUNDLED_CONVERSATION_SLICE
