"""vLLM's request latencies as OpenTelemetry GenAI histograms: a vLLM stat-logger plugin.

vLLM 0.32 already exports one span per request over OTLP when started with
``--otlp-traces-endpoint`` (attributes ``gen_ai.latency.time_to_first_token``,
``gen_ai.latency.e2e``, ``gen_ai.usage.*``, ``gen_ai.request.*``), so spans
are left to vLLM.  What it lacks is the GenAI *metrics*; this logger adds
them by translating each finished request of vLLM's ``IterationStats`` into
our :class:`~engine.stats.FinishedRequestStats` and handing it to
:class:`~exporters.otel.OtelStatsSink`, the same instruments as our engine
(``gen_ai.server.time_to_first_token``, ``gen_ai.server.time_per_output_token``,
``gen_ai.server.request.duration``; ``gen_ai.provider.name="vllm"``).

vLLM loads it in the API server process from the ``vllm.stat_logger_plugins``
entry point ``moeslo_otel``.  It records only with ``MOESLO_VLLM_OTEL=1``;
the exporter follows the standard ``OTEL_*`` variables
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_METRIC_EXPORT_INTERVAL`` ...).

vLLM never shuts its stat loggers down: the exporter's last flush runs at the
process's exit, and a collector that accepts and never answers held vLLM's
exit 10 to 25 s (the SDK waits up to 30 s).  The logger shuts its exporter
down itself, on :meth:`GenAiOtelStatLogger.shutdown` or at exit, within
``SHUTDOWN_TIMEOUT_S``; what is left unsent then is dropped.  At exit one hook
stops every engine's exporter (data parallelism: one logger per engine) side
by side, within one ``SHUTDOWN_TIMEOUT_S`` in all (a hook per engine, in turn,
held the exit that long for each).

TTFT comes from ``IterationStats.time_to_first_tokens_iter``, the very values
vLLM's own ``vllm:time_to_first_token_seconds`` observes (its finished-request
stats carry no TTFT); duration and time per output token from each finished
request.  This module imports vLLM: it exists only in vLLM's environment.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import uuid
from functools import partial
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, OTELResourceDetector
from opentelemetry.trace import NoOpTracerProvider
from vllm.v1.metrics.loggers import StatLoggerBase

from engine.stats import FinishedRequestStats, StepStats
from exporters.otel import (
    SHUTDOWN_TIMEOUT_S,
    OtelStatsSink,
    exports,
    service_resource,
    stop_provider,
    stop_within,
)

logger = logging.getLogger(__name__)
ENABLE_ENV = "MOESLO_VLLM_OTEL"
PROVIDER_NAME = "vllm"


def finished_from_vllm(fin: Any) -> FinishedRequestStats:
    """One vLLM ``FinishedRequestStats`` in the engine's terms (seconds).

    vLLM takes its intervals from timestamps that stay 0 until the event happens, so a request aborted before it
    was scheduled reports the negated monotonic clock as its queue time, and one aborted before its first token
    a negative prefill time: the first waited its whole life, the second's prefill is unknown (0)."""
    generated = int(fin.num_generation_tokens)
    e2e_s = float(fin.e2e_latency)
    queued_s = float(fin.queued_time)
    return FinishedRequestStats(
        request_id=str(fin.request_id or ""),
        finish_reason=str(fin.finish_reason).lower(),
        prompt_tokens=int(fin.num_prompt_tokens),
        generation_tokens=generated,
        e2e_s=e2e_s,
        queue_s=queued_s if queued_s >= 0.0 else e2e_s,
        prefill_s=max(float(fin.prefill_time), 0.0),
        decode_s=max(float(fin.decode_time), 0.0),
        ttft_s=None,  # recorded from the iteration's first tokens, where vLLM measures it
        mean_itl_s=float(fin.mean_time_per_output_token) if generated > 1 else None,
    )


ENGINE_INDEX_ATTRIBUTE = "vllm.engine.index"
"""vLLM's engine index (the ``engine`` label of its Prometheus series), on the resource and on every data point."""

PROCESS_INSTANCE_ID = str(uuid.uuid4())
"""This process's ``service.instance.id`` where the environment names none."""


def engine_instance_id(engine_index: int, api_server: str = "") -> str:
    """The ``service.instance.id`` of one engine's streams: the environment's (``OTEL_RESOURCE_ATTRIBUTES``), else
    this process's, with the API server's part (:func:`api_server_part`) and the engine index.  Data-parallel
    engines and API server processes export apart: the collector keys a stream by it, and its Prometheus
    exporter drops the other resource attributes (two engines' or processes' cumulative streams collided
    into one series)."""
    base = OTELResourceDetector().detect().attributes.get(SERVICE_INSTANCE_ID) or PROCESS_INSTANCE_ID
    return f"{base}{api_server}-engine{engine_index}"


def api_server_part(vllm_config: Any) -> str:
    """``-api<rank>`` where vLLM runs several API server processes (``--api-server-count``, or data
    parallelism's default of one per engine), each recording the requests it serves under the same engine
    indices; empty with one.  The rank is vLLM's (``ParallelConfig._api_process_rank``), the process id where
    vLLM gives none."""
    parallel = getattr(vllm_config, "parallel_config", None)
    if int(getattr(parallel, "_api_process_count", 1) or 1) <= 1:
        return ""
    rank = int(getattr(parallel, "_api_process_rank", -1))
    return f"-api{rank}" if rank >= 0 else f"-pid{os.getpid()}"


class GenAiOtelStatLogger(StatLoggerBase):  # type: ignore[misc]  # vLLM is untyped outside its venv
    """Per-engine vLLM stat logger that records GenAI histograms (no-op unless ``MOESLO_VLLM_OTEL=1``)."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self.sink: OtelStatsSink | None = None
        self._provider: MeterProvider | None = None
        if os.environ.get(ENABLE_ENV, "").strip() != "1":
            return
        if not exports("OTEL_METRICS_EXPORTER", "metrics"):
            logger.info("moeslo OTel stat logger off: OTEL_METRICS_EXPORTER=none")
            return
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        served = vllm_config.model_config.served_model_name
        model_name = str((served[0] if isinstance(served, list | tuple) else served) or vllm_config.model_config.model)
        # Each engine (data parallel) exports its own cumulative streams: the index tells them apart.
        attributes = {ENGINE_INDEX_ATTRIBUTE: str(engine_index)}
        try:
            instance_id = engine_instance_id(engine_index, api_server_part(vllm_config))
            resource = service_resource("vllm", {**attributes, SERVICE_INSTANCE_ID: instance_id})
            # The SDK's own exit hook waits up to 30 s on a collector that does not answer: ours is bounded.
            provider = MeterProvider(resource=resource, shutdown_on_exit=False,
                                     metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())])
        except (ValueError, TypeError) as exc:  # vLLM builds stat loggers unguarded: raising here stops its start
            logger.error("moeslo OTel stat logger off: %s (check the OTEL_* variables, e.g. "
                         "OTEL_METRIC_EXPORT_INTERVAL and OTEL_EXPORTER_OTLP_ENDPOINT)", exc)
            return
        self._provider = provider
        LIVE.append(self)
        self.sink = OtelStatsSink(
            meter_provider=provider,
            tracer_provider=NoOpTracerProvider(),  # spans: vLLM's own --otlp-traces-endpoint
            model_name=model_name,
            provider_name=PROVIDER_NAME,
            attributes=attributes,
        )

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:  # fmt: skip
        if self.sink is None or iteration_stats is None:
            return
        self.sink.record_first_tokens(iteration_stats.time_to_first_tokens_iter)
        if not iteration_stats.finished_requests:
            return
        self.sink.record(
            StepStats(
                now_s=time.monotonic(),
                step_duration_s=0.0,
                num_running=int(getattr(scheduler_stats, "num_running_reqs", 0) or 0),
                num_waiting=int(getattr(scheduler_stats, "num_waiting_reqs", 0) or 0),
                kv_cache_usage=float(getattr(scheduler_stats, "kv_cache_usage", 0.0) or 0.0),
                prompt_tokens=0,
                generation_tokens=0,
                finished=tuple(finished_from_vllm(f) for f in iteration_stats.finished_requests),
            )
        )

    def log_engine_initialized(self) -> None:
        return None

    def shutdown(self) -> None:
        """Flush and stop the exporter, within ``SHUTDOWN_TIMEOUT_S`` (at exit :func:`shutdown_all` does; once is
        enough)."""
        shutdown_all([self])


LIVE: list[GenAiOtelStatLogger] = []
"""The loggers whose exporter still runs (the exit hook stops them)."""


def shutdown_all(loggers: list[GenAiOtelStatLogger] | None = None, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Stop the exporters of ``loggers`` (default: every live one, as at exit) side by side, within ``timeout_s``
    in all; what a collector has not taken by then is dropped, and an error line says so."""
    providers = []
    for stat_logger in list(LIVE if loggers is None else loggers):
        provider, stat_logger._provider = stat_logger._provider, None
        if provider is not None:
            LIVE.remove(stat_logger)
            providers.append(provider)
    # A collector that answers takes milliseconds.  An error, as the logger's other line: vLLM's API server
    # shows no warning of a logger not its own.
    if providers and not stop_within([partial(stop_provider, p) for p in providers], timeout_s):
        logger.error("moeslo OTel stat logger: the collector did not take the last metrics within %g s; "
                     "they are dropped", timeout_s)


atexit.register(shutdown_all)
