"""``moeslo serve``: the engine's OpenAI-compatible server with its exporters."""

from __future__ import annotations

import functools
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.common import cli_errors, console, positive, ttft_allowances_option, uvicorn_log_level
from cli.listen import listener_for, listening_port, run_uvicorn
from contracts.lifetime import DEFAULT_SHUTDOWN_TIMEOUT_S
from contracts.urls import http_url
from engine.executors.options import PARALLEL_MIN_TOKENS

if TYPE_CHECKING:
    from engine.client import EngineCoreClient


# long: a typer command is its option list; the work is in exporters.app.build_stack.
def serve(
    checkpoint: Annotated[Path, typer.Option(help="Checkpoint directory (config.json + model.safetensors).")],
    ep: Annotated[int, typer.Option(min=1, help="Expert-parallel ranks (processes).")] = 1,
    colocate_ranks: Annotated[
        bool,
        typer.Option("--colocate-ranks", help="Keep the EP ranks' expert slots in one process (placement, per-rank "
                                               "loads and rebalancing as with --ep ranks): for ranks that would "
                                               "share one CPU."),
    ] = False,
    slots_per_rank: Annotated[
        int | None,
        typer.Option(min=1, help="Expert slots per rank (default: every expert once; more: room for replicas)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    kv_cache_mb: Annotated[
        float, typer.Option(callback=positive, help="KV cache budget per rank, fixed at start (MiB).")
    ] = 64.0,
    block_size: Annotated[int, typer.Option(min=1, help="Tokens per KV block.")] = 16,
    max_num_seqs: Annotated[int, typer.Option(help="Sequences in the running batch at most.")] = 128,
    max_num_batched_tokens: Annotated[int, typer.Option(help="Tokens computed per step at most.")] = 512,
    max_waiting: Annotated[int, typer.Option(help="Waiting requests at most; more get 429.")] = 256,
    max_model_len: Annotated[
        int | None,
        typer.Option(min=1, help="Context served: prompt plus output tokens of a request at most (default: the "
                                 "checkpoint's max_position_embeddings, capped by the KV cache if it holds less). "
                                 "One the checkpoint or the KV cache cannot hold is refused at start."),
    ] = None,
    model_name: Annotated[str | None, typer.Option(help="Served model name (default: directory name).")] = None,
    dtype: Annotated[str | None, typer.Option(help="float32 or bfloat16 (default: the checkpoint's).")] = None,
    expert_metrics: Annotated[
        bool | None,
        typer.Option("--expert-metrics/--no-expert-metrics",
                     help="Per-(layer, expert) series; default: on up to 4096 series, off above."),
    ] = None,
    exporters: Annotated[
        bool, typer.Option("--exporters/--no-exporters", help="Prometheus /metrics (off: a baseline).")
    ] = True,
    otlp: Annotated[bool, typer.Option(help="Also export over OTLP/HTTP as the OTEL_* variables say.")] = False,
    engine_id: Annotated[str, typer.Option(help="The `engine` label of every metric.")] = "0",
    threads: Annotated[
        int | None,
        typer.Option(min=1, help="torch threads per engine process (default: the CPUs of the inherited affinity set, "
                          "divided among EP ranks)."),
    ] = None,
    parallel_min_tokens: Annotated[
        int,
        typer.Option(min=0, help="Steps with fewer tokens run on one thread, larger ones on --threads (0: every "
                                 "step on all): waking sleeping OpenMP workers costs a small step more than they "
                                 "give it."),
    ] = PARALLEL_MIN_TOKENS,
    request_deadline_s: Annotated[
        float | None,
        typer.Option(help="End a request still running this long after its arrival (finish reason "
                          "`deadline`); default: no deadline."),
    ] = None,
    core_silence_timeout_s: Annotated[
        float,
        typer.Option(min=0.001, help="Fail an engine core that has said nothing this long (stopped, or hung in a "
                                     "step): /health and new requests get 503, requests in flight end with an "
                                     "error. Keep it above the longest step."),
    ] = 150.0,
    enable_prefix_caching: Annotated[
        bool,
        typer.Option("--enable-prefix-caching/--no-enable-prefix-caching",
                     help="Share the KV blocks of equal prompt prefixes between requests (vLLM's automatic "
                          "prefix caching), within the same KV budget."),
    ] = True,
    ttft_allowances: Annotated[
        str,
        typer.Option(callback=ttft_allowances_option,
                     help="Long-prompt allowances to export moeslo_ttft_normalized_seconds for besides 1000:0.05, "
                          "as REFERENCE_TOKENS:SECONDS_PER_1K, comma-separated: each policy's TTFT objective with "
                          "an allowance reads its own series."),
    ] = "",
    shutdown_timeout: Annotated[
        int,
        typer.Option(min=0, help="Seconds a SIGTERM or Ctrl-C lets the requests in flight finish (new connections "
                                 "are refused at once), as vLLM's --shutdown-timeout; the engine core stops after. "
                                 "0: abort them at once."),
    ] = DEFAULT_SHUTDOWN_TIMEOUT_S,
    log_level: Annotated[str, typer.Option(callback=uvicorn_log_level, help="uvicorn log level.")] = "warning",
) -> None:
    """Serve a checkpoint over the OpenAI completions API with /metrics and the control routes."""
    # As a container's PID 1, a process without a SIGTERM handler ignores SIGTERM: a pod removed while its model
    # loaded (before uvicorn's handlers) waited out its whole grace period.  uvicorn puts its own in while it serves.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with cli_errors():
        from contracts.ttft_objective import exported_allowances
        from exporters.app import ServeOptions, build_stack

        listener = listener_for(host, port)
        port = listening_port(listener, port)  # --port 0: the one the system picked, for OTel's server.port too
        options = ServeOptions(
            checkpoint=checkpoint, ep=ep, colocate_ranks=colocate_ranks, slots_per_rank=slots_per_rank,
            kv_cache_mb=kv_cache_mb,
            block_size=block_size, dtype=dtype, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_waiting=max_waiting, max_model_len=max_model_len,
            model_name=model_name, engine_id=engine_id, prometheus=exporters, expert_metrics=expert_metrics,
            otlp=otlp, port=port, threads=threads, parallel_min_tokens=parallel_min_tokens,
            request_deadline_s=request_deadline_s, core_silence_timeout_s=core_silence_timeout_s,
            enable_prefix_caching=enable_prefix_caching, ttft_allowances=exported_allowances(ttft_allowances),
        )
        stack = build_stack(options)
        engine = stack.engine
        console.print(
            f"serving {options.served_model_name} on {http_url(host, port)} "
            f"({engine.blocks.num_blocks} KV blocks of {engine.blocks.block_size} tokens, context "
            f"{engine.max_model_len} tokens, prefix caching {'on' if enable_prefix_caching else 'off'}; "
            f"engine core pid {engine.pid})"
        )
        if engine.context_note is not None:
            console.print(f"context capped at {engine.max_model_len} tokens: {engine.context_note}; raise "
                          f"--kv-cache-mb (now {kv_cache_mb:g}) to serve it all, or set --max-model-len "
                          f"{engine.max_model_len} or less to choose it", soft_wrap=True)
        run_uvicorn(stack.app, host=host, port=port, listener=listener, log_level=log_level,
                    timeout_graceful_shutdown=shutdown_timeout,
                    on_drain_timeout=functools.partial(_end_requests_in_flight, engine, shutdown_timeout))


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _end_requests_in_flight(engine: EngineCoreClient, waited_s: int) -> None:
    ended = engine.abort()
    if ended:
        console.print(f"shutting down: {ended} request(s) still running after {waited_s} s "
                      "(--shutdown-timeout) ended with an error")
