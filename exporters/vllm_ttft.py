"""``moeslo_ttft_normalized_seconds`` on vLLM's ``/metrics``: a vLLM stat-logger plugin.

vLLM loads it in the API server process from the ``vllm.stat_logger_plugins``
entry point ``moeslo_ttft``; it records with the moeslo plugin switched on
(``MOESLO_VLLM_PLUGIN=1``), into the registry vLLM serves (prometheus_client's
global one, or its multiprocess directory).  Labels: ``model_name`` (the served
model name) and ``engine`` (vLLM's engine index), as on vLLM's own series.

vLLM's finished-request stats carry no TTFT; a request's TTFT here is its
end-to-end latency less its inference time after the first token, so from its
arrival at the front end as vLLM's own TTFT histogram
(:func:`exporters.ttft_normalized.finished_ttfts`).  vLLM exports ``vllm:request_prompt_tokens`` itself.  This module
imports vLLM: it exists only in vLLM's environment.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import REGISTRY
from vllm.v1.metrics.loggers import StatLoggerBase

from contracts.errors import ValidationError
from engine.vllm_plugin.settings import PluginSettings
from exporters.ttft_normalized import NormalizedTtftObserver, finished_ttfts

logger = logging.getLogger("moeslo.vllm_plugin")

_OBSERVER: list[NormalizedTtftObserver] = []
"""The process's one histogram family (vLLM builds a logger per engine; the family is registered once)."""


class NormalizedTtftStatLogger(StatLoggerBase):  # type: ignore[misc]  # vLLM is untyped outside its venv
    """Per-engine vLLM stat logger for the length-normalized TTFT (no-op unless ``MOESLO_VLLM_PLUGIN=1``)."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.observer: NormalizedTtftObserver | None = None
        self.engine = str(engine_index)
        config = vllm_config.model_config
        served = config.served_model_name
        self.model_name = str((served[0] if isinstance(served, list | tuple) else served) or config.model)
        try:
            settings = PluginSettings.from_env()
        except ValidationError as exc:  # vLLM builds stat loggers unguarded: raising here would stop its start
            logger.error("moeslo TTFT stat logger off: %s", exc)
            return
        if not settings.enabled:
            return
        if not _OBSERVER:
            _OBSERVER.append(NormalizedTtftObserver(REGISTRY, allowances=settings.ttft_allowances))
        self.observer = _OBSERVER[0]
        self.observer.add_engine(self.model_name, self.engine)

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:  # fmt: skip
        if self.observer is None or iteration_stats is None or not iteration_stats.finished_requests:
            return
        finished = iteration_stats.finished_requests
        self.observer.observe(self.model_name, self.engine, finished_ttfts(finished))
        self.observer.count_without_first_token(self.model_name, self.engine, finished)

    def log_engine_initialized(self) -> None:
        return None
