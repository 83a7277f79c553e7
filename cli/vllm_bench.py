"""``moeslo bench vllm``: our engine against vLLM CPU, and the vLLM plugin's overhead."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import bench_app, cli_errors, console, print_json


@bench_app.command("vllm")
def bench_vllm(
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint for both engines (default: a fresh random one, bf16).")
    ] = None,
    prompts: Annotated[int, typer.Option(help="Requests per round, sent at once.")] = 16,
    prompt_tokens: Annotated[int, typer.Option(help="Prompt length (random token ids).")] = 199,
    new_tokens: Annotated[int, typer.Option(help="Tokens generated per request (greedy, no early stop).")] = 32,
    repeats: Annotated[int, typer.Option(help="Measured rounds per server; the fastest is reported.")] = 5,
    ours: Annotated[bool, typer.Option(help="Also run our engine (`moeslo serve`).")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """vLLM CPU with the plugin off (baseline) and on, and our engine, on the same workload and checkpoint."""
    with cli_errors():
        from bench.vllm import VllmBenchOptions, run_vllm_bench

        if repeats < 1 or prompts < 1 or prompt_tokens < 1 or new_tokens < 1:
            raise typer.BadParameter("prompts, prompt-tokens, new-tokens and repeats must be >= 1")
        options = VllmBenchOptions(checkpoint=checkpoint, prompts=prompts, prompt_tokens=prompt_tokens,
                                   new_tokens=new_tokens, repeats=repeats, ours=ours)  # fmt: skip
        try:
            result = run_vllm_bench(options, progress=lambda msg: console.print(f"[dim]{msg}[/]"))
        except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
            console.print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(code=2) from exc
        if json_out:
            print_json(result)
            return
        for name, run in result["runs"].items():
            console.print(f"{name:16} {run['output_tokens_per_s']:8.1f} tok/s  TTFT p50 {run['ttft_p50_s']:.3f} s  "
                          f"ITL p50 {run['itl_p50_s'] * 1000:.1f} ms")  # fmt: skip
        console.print(f"plugin overhead {result['plugin_overhead_pct']:.2f} %")
