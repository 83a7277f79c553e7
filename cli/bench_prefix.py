"""``moeslo bench prefix``: TTFT with a cached shared prefix against cold, and the cost without reuse."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from cli.common import cli_errors, console, dim, print_json


def bench_prefix(
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint directory; default: a fresh `moeslo model init` one.")
    ] = None,
    prompt_tokens: Annotated[int, typer.Option(min=2, help="Prompt of the measured request.")] = 2048,
    shared_tokens: Annotated[int, typer.Option(min=1, help="Its leading tokens cached by an earlier request.")] = 1536,
    rounds: Annotated[int, typer.Option(min=1, help="Interleaved A/B rounds; medians and spreads over them.")] = 5,
    requests: Annotated[int, typer.Option(min=1, help="Requests of the no-reuse workload.")] = 32,
    request_prompt_tokens: Annotated[int, typer.Option(min=1, help="Prompt tokens per no-reuse request.")] = 256,
    new_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per no-reuse request.")] = 32,
    max_num_batched_tokens: Annotated[int, typer.Option(min=1, help="The engine's tokens per step.")] = 512,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    threads: Annotated[int | None, typer.Option(help="torch threads (default: the CPU affinity set).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the JSON figures.")] = False,
) -> None:
    """Prefix caching: TTFT of a request sharing a cached prefix vs cold (baseline); tokens/s on vs off, no reuse."""
    from bench.prefix import PrefixBenchConfig, run

    try:
        cfg = PrefixBenchConfig(prompt_tokens=prompt_tokens, shared_tokens=shared_tokens, rounds=rounds,
                                requests=requests, request_prompt_tokens=request_prompt_tokens, new_tokens=new_tokens,
                                max_num_batched_tokens=max_num_batched_tokens, dtype=dtype, threads=threads)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    with cli_errors():
        from engine.checkpoint import init_random_checkpoint
        from engine.config import ModelConfig

        with tempfile.TemporaryDirectory() as tmp:
            ckpt = checkpoint or init_random_checkpoint(Path(tmp) / "ckpt", ModelConfig(), seed=0)
            result = run(ckpt, cfg, progress=dim)
        if json_out:
            print_json(result)
            return
        ttft, cost = result["ttft"], result["no_reuse_overhead"]
        console.print(f"TTFT with {shared_tokens} of {prompt_tokens} tokens cached: "
                      f"{ttft['ratio_hit_over_cold']['median']:.2f}x cold (goal <= {ttft['goal_ratio']})")
        console.print(f"no-reuse overhead: {100 * cost['overhead_fraction']['median']:.2f}% of generated tokens/s "
                      f"(goal <= {100 * cost['goal_overhead_fraction']:.0f}%); measured in the scheduler, where "
                      f"caching's work is done: {100 * cost['bookkeeping_fraction']['median']:.3f}% of the run")
