"""Engine statistics through the OpenTelemetry SDK, under the GenAI semantic conventions.

Metrics (histograms, seconds): ``gen_ai.server.time_to_first_token``,
``gen_ai.server.time_per_output_token`` (per request, the mean time per
token after the first) and ``gen_ai.server.request.duration``, with
``gen_ai.operation.name``, ``gen_ai.provider.name`` (and the older
``gen_ai.system``), ``gen_ai.request.model``, ``gen_ai.response.model`` and,
on failures, ``error.type``: one sample per choice (each choice of an OpenAI
request is its own request in the core, as in vLLM).  One span per API
request (:meth:`OtelStatsSink.record_request`: every choice, from arrival to
the last one's end, under the id the client read), with a
``gen_ai.first_token`` event; a request not served through the OpenAI API is
its own span.

:meth:`OtelStatsSink.from_environment` exports both over OTLP/HTTP as the
standard ``OTEL_*`` variables say (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_SERVICE_NAME`` …; ``OTEL_TRACES_EXPORTER``
or ``OTEL_METRICS_EXPORTER`` set to ``none`` turns either off).  The providers are
owned by the sink, never installed globally, so several engines (and tests)
do not share state.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial

from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from contracts.catalogue import (
    ITL_BUCKETS_S,
    OTEL_REQUEST_DURATION_HISTOGRAM,
    OTEL_TIME_PER_OUTPUT_TOKEN_HISTOGRAM,
    OTEL_TTFT_HISTOGRAM,
    REQUEST_LATENCY_BUCKETS_S,
    TTFT_BUCKETS_S,
)
from engine.stats import TEXT_COMPLETION, ApiRequestStats, EndedChoice, FinishedRequestStats, StepStats

logger = logging.getLogger("moeslo.otel")

SHUTDOWN_TIMEOUT_S = 3.0
"""The longest the exporters' last flush may hold an exit (a healthy collector takes milliseconds); what a
collector has not taken by then is dropped."""

SUCCESSFUL_FINISHES = ("length", "stop", "repetition")
"""Finish reasons of a complete response (no ``error.type``; TTFT and time per token recorded): vLLM 0.32 ends
a request on a repetitive token pattern with ``repetition``, a response as complete as a stop string's."""
ERROR_TYPES = {"error": "engine_error", "deadline": "timeout"}
"""``error.type`` of the finishes that are the engine's failures (the TTFT SLI's bad events); any other
unsuccessful finish is a client's ``aborted``."""

OPERATION_NAME = TEXT_COMPLETION
"""The operation of a request that does not name one (vLLM's stats, which know none)."""
PROVIDER_NAME = "moeslo"
FIRST_TOKEN_EVENT = "gen_ai.first_token"
OTLP = "otlp"
"""The one exporter of :meth:`OtelStatsSink.from_environment` (over HTTP), the standard variables' default."""


def stop_within(stops: Sequence[Callable[[float], object]], timeout_s: float) -> bool:
    """Run each ``stop(seconds_left)`` on its own daemon thread, side by side, and wait for them ``timeout_s``
    in all; False when one had not finished by then, or finished at the very end (the SDK gives up on a
    collector a hair before the deadline it is given): what it had not sent is dropped.  A stop left behind
    does not hold the exit (a daemon thread; Python 3.11, which the project pins, starts threads in atexit
    hooks too)."""
    started = time.monotonic()
    deadline = started + timeout_s
    threads = [threading.Thread(target=_quietly, args=(stop, timeout_s), name="moeslo-otel-stop", daemon=True)
               for stop in stops]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(thread.is_alive() for thread in threads) and time.monotonic() < started + 0.9 * timeout_s


def _quietly(stop: Callable[[float], object], seconds_left: float) -> None:
    try:
        stop(seconds_left)
    except Exception as exc:  # the SDK raises on a reader it could not stop; exiting must go on
        logger.error("moeslo OTel: stopping an exporter failed: %s", exc)


def stop_provider(provider: object, seconds_left: float) -> None:
    """Flush and stop an OpenTelemetry provider: an SDK meter provider within ``seconds_left`` (it takes a
    timeout); others as their ``shutdown`` goes (the SDK's tracer provider takes none: :func:`stop_within`
    bounds it)."""
    if isinstance(provider, SdkMeterProvider):
        provider.shutdown(timeout_millis=seconds_left * 1000)
        return
    stop = getattr(provider, "shutdown", None)
    if stop is not None:
        stop()


def service_resource(default_name: str, attributes: Mapping[str, AttributeValue] | None = None) -> Resource:
    """The SDK's resource from the environment (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``) plus
    ``attributes``; ``service.name`` is ``default_name`` only where neither variable names the service."""
    extra = dict(attributes or {})
    if not OTELResourceDetector().detect().attributes.get(SERVICE_NAME):
        extra[SERVICE_NAME] = default_name
    return Resource.create(extra)


def exports(variable: str, what: str) -> bool:
    """Whether the standard ``variable`` (``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER``) leaves ``what`` on:
    ``none`` turns it off.  Only OTLP/HTTP is built here: another exporter named is said once, and OTLP used (the
    server was asked for ``--otlp``)."""
    value = os.environ.get(variable, "")
    names = [name.strip().lower() for name in value.split(",") if name.strip()] or [OTLP]
    if any(name not in (OTLP, "none") for name in names):
        logger.warning("moeslo OTel: %s=%s: only OTLP/HTTP is supported; the %s go over OTLP/HTTP", variable,
                       value.strip(), what)  # fmt: skip
    return any(name != "none" for name in names)


class OtelStatsSink:
    """Translate engine steps into OpenTelemetry histograms and per-request spans."""

    def __init__(
        self,
        *,
        meter_provider: MeterProvider,
        tracer_provider: TracerProvider | None,
        model_name: str,
        server_port: int | None = None,
        provider_name: str = PROVIDER_NAME,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        """``provider_name``: ``gen_ai.provider.name`` (``vllm`` when vLLM's stats come through here);
        ``attributes``: more on every data point and span (vLLM's engine index); no ``tracer_provider``, no spans."""
        self.meter_provider = meter_provider
        self.tracer_provider = tracer_provider
        self._stopped = False
        self.model_name = model_name
        meter = meter_provider.get_meter("moeslo.engine")
        self._tracer = tracer_provider.get_tracer("moeslo.engine") if tracer_provider is not None else None
        self._ttft = meter.create_histogram(
            OTEL_TTFT_HISTOGRAM, unit="s",
            description="Time to generate first token for successful responses.",
            explicit_bucket_boundaries_advisory=list(TTFT_BUCKETS_S),
        )
        self._tpot = meter.create_histogram(
            OTEL_TIME_PER_OUTPUT_TOKEN_HISTOGRAM, unit="s",
            description="Time per output token generated after the first token for successful responses.",
            explicit_bucket_boundaries_advisory=list(ITL_BUCKETS_S),
        )
        self._duration = meter.create_histogram(
            OTEL_REQUEST_DURATION_HISTOGRAM, unit="s",
            description="Generative AI server request duration such as time-to-last byte or last output token.",
            explicit_bucket_boundaries_advisory=list(REQUEST_LATENCY_BUCKETS_S),
        )
        attrs: dict[str, AttributeValue] = {
            "gen_ai.provider.name": provider_name,
            "gen_ai.system": provider_name,
            "gen_ai.request.model": model_name,
            "gen_ai.response.model": model_name,
        }
        if server_port is not None:
            attrs["server.port"] = server_port
        attrs.update(attributes or {})
        self._base_attrs = attrs
        self._attrs_by: dict[tuple[str, str | None], dict[str, AttributeValue]] = {}

    @classmethod
    def from_environment(cls, *, model_name: str, server_port: int | None = None) -> OtelStatsSink:
        """OTLP/HTTP exporters configured by the standard ``OTEL_*`` environment variables."""
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        resource = service_resource("moeslo-engine")
        # The SDK's own exit hooks wait up to 30 s each on a collector that does not answer: ours is bounded.
        readers = [PeriodicExportingMetricReader(OTLPMetricExporter())] if exports("OTEL_METRICS_EXPORTER", "metrics") \
            else []
        meter_provider = SdkMeterProvider(resource=resource, shutdown_on_exit=False, metric_readers=readers)
        tracer_provider = None
        if exports("OTEL_TRACES_EXPORTER", "spans"):
            tracer_provider = SdkTracerProvider(resource=resource, shutdown_on_exit=False)
            tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        sink = cls(meter_provider=meter_provider, tracer_provider=tracer_provider, model_name=model_name,
                   server_port=server_port)  # fmt: skip
        atexit.register(sink.shutdown)  # where the server's shutdown hook did not run
        return sink

    def record(self, step: StepStats) -> None:
        for fin in step.finished:
            self._record_finished(fin, step.now_s)

    def record_failed(self, lost: Sequence[FinishedRequestStats]) -> None:
        """Requests ended by the API process because the engine core died: the core never reports them."""
        now_s = time.monotonic()
        for fin in lost:
            self._record_finished(fin, now_s)

    def record_request(self, request: ApiRequestStats) -> None:
        """One OpenAI request once every choice has ended: its span."""
        self._record_span(request)

    def record_first_tokens(self, ttfts_s: Iterable[float]) -> None:
        """TTFT observations reported per step rather than per finished request (vLLM's stats)."""
        attrs = self._attributes(OPERATION_NAME, "stop")
        for ttft_s in ttfts_s:
            self._ttft.record(ttft_s, attrs)

    def _attributes(self, operation: str, finish_reason: str) -> dict[str, AttributeValue]:
        """The data points' attributes for a request of ``operation`` that ended on ``finish_reason``."""
        error = None if finish_reason in SUCCESSFUL_FINISHES else ERROR_TYPES.get(finish_reason, "aborted")
        found = self._attrs_by.get((operation, error))
        if found is None:
            found = {"gen_ai.operation.name": operation, **self._base_attrs}
            if error is not None:
                found["error.type"] = error
            self._attrs_by[(operation, error)] = found
        return found

    def _record_finished(self, fin: FinishedRequestStats, end_s: float) -> None:
        """One choice's samples; its span too when it is a request of its own (else its API request's span)."""
        attrs = self._attributes(fin.operation, fin.finish_reason)
        self._duration.record(fin.e2e_s, attrs)
        if fin.finish_reason in SUCCESSFUL_FINISHES and fin.ttft_s is not None:
            self._ttft.record(fin.ttft_s, attrs)
        if fin.finish_reason in SUCCESSFUL_FINISHES and fin.mean_itl_s is not None:
            self._tpot.record(fin.mean_itl_s, attrs)
        if fin.response_id is None:
            self._record_span(ApiRequestStats(fin.request_id, fin.operation, 1, (EndedChoice(0, end_s, fin),)))

    def _record_span(self, request: ApiRequestStats) -> None:
        """The request's span: from its arrival to its last choice's end, its first token the first of any."""
        if self._tracer is None:
            return
        # Span times are wall-clock (what a trace viewer shows); the engine's are monotonic.
        now_ns, now_s = time.time_ns(), time.monotonic()
        ends_ns = [now_ns - int((now_s - choice.end_s) * 1e9) for choice in request.choices]
        stats = [choice.stats for choice in request.choices]
        start_ns = min(end_ns - int(fin.e2e_s * 1e9) for end_ns, fin in zip(ends_ns, stats, strict=True))
        reasons = tuple(fin.finish_reason for fin in stats)
        # The engine's failures first (an error, then a deadline), then a client's abort.
        outcome = next((r for failure in ERROR_TYPES for r in reasons if r == failure), None) \
            or next((r for r in reasons if r not in SUCCESSFUL_FINISHES), reasons[0])
        attributes: dict[str, AttributeValue] = {
            **self._attributes(request.operation, outcome),
            "gen_ai.response.id": request.response_id,
            "gen_ai.response.finish_reasons": reasons,
            "gen_ai.usage.input_tokens": sum(prompt[0].stats.prompt_tokens for prompt in request.per_prompt()),
            "gen_ai.usage.output_tokens": sum(fin.generation_tokens for fin in stats),
            "moeslo.queue_time_s": min(fin.queue_s for fin in stats),
        }
        if request.n != 1:
            attributes["gen_ai.request.choice.count"] = request.n
        span = self._tracer.start_span(f"{request.operation} {self.model_name}", kind=SpanKind.SERVER,
                                       start_time=start_ns, attributes=attributes)  # fmt: skip
        ttfts = [fin.ttft_s for fin in stats if fin.ttft_s is not None]
        if ttfts:
            span.add_event(FIRST_TOKEN_EVENT, {OTEL_TTFT_HISTOGRAM: min(ttfts)},
                           timestamp=start_ns + int(min(ttfts) * 1e9))  # fmt: skip
        if outcome not in SUCCESSFUL_FINISHES:
            span.set_status(Status(StatusCode.ERROR, f"finish_reason={outcome}"))
        span.end(end_time=max(ends_ns))

    def force_flush(self, timeout_ms: int = 10_000) -> None:
        for provider in self._providers():
            flush = getattr(provider, "force_flush", None)
            if flush is not None:
                flush(timeout_ms)

    def _providers(self) -> list[object]:
        return [provider for provider in (self.meter_provider, self.tracer_provider) if provider is not None]

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Flush and stop the exporters, side by side, within ``timeout_s`` (the server calls this on exit; once
        is enough): a collector that does not answer no longer holds the exit (15 s and more)."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.shutdown)
        if not stop_within([partial(stop_provider, provider) for provider in self._providers()], timeout_s):
            logger.error("moeslo OTel: the collector did not take the last metrics and spans within %g s; they are "
                         "dropped", timeout_s)  # fmt: skip


__all__ = [
    "FIRST_TOKEN_EVENT", "OPERATION_NAME", "OTLP", "PROVIDER_NAME", "SHUTDOWN_TIMEOUT_S", "SUCCESSFUL_FINISHES",
    "OtelStatsSink", "exports", "service_resource", "stop_provider", "stop_within",
]  # fmt: skip
