"""``moeslo bench engine``: our engine against transformers on the same checkpoint."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from cli.common import bench_app, cli_errors, console, print_json


@bench_app.command("engine")
def bench_engine(
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint directory; default: a fresh `moeslo model init` one.")
    ] = None,
    batches: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,16",
    prompt_len: Annotated[int, typer.Option(help="Prompt tokens per sequence.")] = 199,
    new_tokens: Annotated[int, typer.Option(help="Tokens generated per sequence (greedy, no early stop).")] = 32,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    repeats: Annotated[int, typer.Option(help="Runs per configuration; the median is reported.")] = 3,
    ep: Annotated[int, typer.Option(help="Expert-parallel ranks for our engine.")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="Print the JSON figures.")] = False,
) -> None:
    """Prefill/decode tokens/s of our engine vs transformers' generate (baseline), routing stats on and off."""
    with cli_errors():
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from bench.engine import run
        from engine.checkpoint import init_random_checkpoint
        from engine.config import ModelConfig

        sizes = tuple(int(b) for b in batches.split(","))
        with tempfile.TemporaryDirectory() as tmp, Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
        ) as progress:
            task = progress.add_task("preparing", total=None)
            ckpt = checkpoint or init_random_checkpoint(Path(tmp) / "ckpt", ModelConfig(), seed=0)
            result = run(ckpt, batches=sizes, prompt_len=prompt_len, new_tokens=new_tokens, dtype=dtype,
                         repeats=repeats, ep=ep, progress=lambda text: progress.update(task, description=text))
        if json_out:
            print_json(result)
        else:
            for batch, figures in result["batches"].items():
                console.print(
                    f"batch {batch}: {figures['moeslo_stats_on']['generated_tokens_per_s']:.0f} tok/s, "
                    f"{figures['speedup_vs_transformers']:.2f}x transformers, "
                    f"stats cost {100 * figures['stats_cost_fraction']:.1f}%"
                )
