"""Wire an engine, its HTTP API and its exporters together.

This is the one place that knows both sides: ``engine/`` never imports an
exporter, so the factory that subscribes exporters to an engine and hands
``/metrics`` a renderer lives here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from contracts.errors import ValidationError
from contracts.ttft_objective import EXPORTED_BY_DEFAULT, TtftAllowance
from engine.chat_template import load_chat_template
from engine.client import EngineCoreClient
from engine.engine_types import EngineConfig
from engine.executors.options import PARALLEL_MIN_TOKENS, ExecutorOptions
from engine.generation_config import sampling_defaults
from engine.scheduler import SchedulerConfig
from engine.server import MetricsRenderer, create_app
from engine.tokenizer import load_tokenizer
from exporters.prometheus import CONTENT_TYPE, PrometheusStatsSink


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeOptions:
    """Everything ``moeslo serve`` configures (read once at the edge)."""

    checkpoint: Path
    ep: int = 1
    colocate_ranks: bool = False
    """All ranks' expert slots in the engine-core process (see ``ExecutorOptions.colocate_ranks``)."""
    slots_per_rank: int | None = None
    """Expert slots per rank; None: just enough for every expert once (more: room for replicas)."""
    kv_cache_mb: float = 64.0
    block_size: int = 16
    dtype: str | None = None
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 512
    max_waiting: int = 256
    max_model_len: int | None = None
    """The context served (prompt plus output tokens); None: the checkpoint's, capped by the KV cache if it holds
    less.  One the checkpoint or the KV cache cannot hold is refused at start."""
    model_name: str | None = None
    """None: the checkpoint directory's name."""
    engine_id: str = "0"
    prometheus: bool = True
    expert_metrics: bool | None = None
    """Per-(layer, expert) series: None means on up to 4096 series."""
    otlp: bool = False
    routing_stats: bool = True
    port: int | None = None
    threads: int | None = None
    """torch threads per engine process; None: the inherited CPU affinity set, divided among EP ranks."""
    parallel_min_tokens: int = PARALLEL_MIN_TOKENS
    """Steps with fewer tokens run on one thread (see ``ExecutorOptions.parallel_min_tokens``)."""
    request_deadline_s: float | None = None
    """Requests still running this long after arrival end with finish reason ``deadline`` (None: off)."""
    core_silence_timeout_s: float = 150.0
    """An engine core silent this long (stopped, hung in a step) is failed: /health and new requests get 503."""
    enable_prefix_caching: bool = True
    """Share the KV blocks of equal prompt prefixes between requests (vLLM's automatic prefix caching)."""
    ttft_allowances: tuple[TtftAllowance, ...] = EXPORTED_BY_DEFAULT
    """The long-prompt allowances ``moeslo_ttft_normalized_seconds`` has a series for."""

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < self.max_num_seqs:  # as vLLM's SchedulerConfig refuses it
            raise ValidationError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                f"({self.max_num_seqs}): each running sequence takes a token of every step's budget, so no more than "
                f"{self.max_num_batched_tokens} would run; lower --max-num-seqs or raise --max-num-batched-tokens"
            )

    @property
    def served_model_name(self) -> str:
        return self.model_name or Path(self.checkpoint).resolve().name


@dataclass(slots=True)
class ServingStack:
    app: FastAPI
    engine: EngineCoreClient
    """The API process's handle on the engine-core process (already started)."""
    prometheus: PrometheusStatsSink | None


def engine_config(options: ServeOptions) -> EngineConfig:
    """What the engine core is told (its scheduler's limits among it)."""
    return EngineConfig(
        scheduler=SchedulerConfig(
            max_num_seqs=options.max_num_seqs,
            max_num_batched_tokens=options.max_num_batched_tokens,
            max_waiting=options.max_waiting,
            max_model_len=options.max_model_len,
        ),
        request_deadline_s=options.request_deadline_s,
        core_silence_timeout_s=options.core_silence_timeout_s,
        enable_prefix_caching=options.enable_prefix_caching,
    )


def build_stack(options: ServeOptions) -> ServingStack:
    """Start the engine-core process (model loaded) and build the app around its client."""
    executor = ExecutorOptions(
        checkpoint=Path(options.checkpoint), ep=options.ep, colocate_ranks=options.colocate_ranks,
        slots_per_rank=options.slots_per_rank,
        kv_cache_mb=options.kv_cache_mb, block_size=options.block_size, dtype=options.dtype,
        routing_stats=options.routing_stats, threads_per_rank=options.threads,
        parallel_min_tokens=options.parallel_min_tokens,
    )
    model_name = options.served_model_name
    defaults = sampling_defaults(Path(options.checkpoint))  # a bad generation config fails before the core starts
    engine = EngineCoreClient(executor, engine_config(options))
    hooks: list[Callable[[], None]] = []
    if options.otlp:
        from exporters.otel import OtelStatsSink

        otel = OtelStatsSink.from_environment(model_name=model_name, server_port=options.port)
        engine.add_sink(otel)
        hooks.append(otel.shutdown)
    engine.start()
    metrics: MetricsRenderer | None = None
    prometheus = None
    if options.prometheus:
        # After start: the per-request token histograms' edges reach the context the core serves.
        prometheus = PrometheusStatsSink(
            CollectorRegistry(), model_name=model_name, engine=options.engine_id,
            expert_series=options.expert_metrics, max_model_len=engine.max_model_len,
            ttft_allowances=options.ttft_allowances,
        )
        blocks = engine.blocks
        prometheus.record_engine_limits(block_size=blocks.block_size, num_blocks=blocks.num_blocks,
                                        max_num_seqs=options.max_num_seqs,
                                        max_num_batched_tokens=options.max_num_batched_tokens)  # fmt: skip
        if options.routing_stats:  # an engine that counts no routing has no balance to report, now or later
            placement = engine.placement
            prometheus.record_model_shape(num_layers=placement.num_layers, num_experts=engine.num_experts,
                                          num_ranks=placement.num_ranks)  # fmt: skip
        engine.add_sink(prometheus)
        metrics = _renderer(prometheus)
    tokenizer = load_tokenizer(Path(options.checkpoint), engine.vocab_size)
    app = create_app(engine, tokenizer, model_name=model_name, metrics=metrics, on_shutdown=hooks,
                     chat_template=load_chat_template(Path(options.checkpoint)),
                     sampling_defaults=defaults)
    return ServingStack(app=app, engine=engine, prometheus=prometheus)


def _renderer(sink: PrometheusStatsSink) -> MetricsRenderer:
    def render() -> tuple[bytes, str]:
        return sink.render(), CONTENT_TYPE

    return render


__all__ = ["ServeOptions", "ServingStack", "build_stack", "engine_config"]
