"""``moeslo bench sampler``: the batched sampler against drawing one row at a time."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.common import cli_errors, console, dim, print_json


def bench_sampler(
    batch: Annotated[int, typer.Option(min=1, help="Rows sampled per step.")] = 16,
    vocab_size: Annotated[list[int] | None, typer.Option(
        min=2, help="Vocabulary sizes (repeat the option); default 4,096 and Qwen3's 151,936.")] = None,
    rounds: Annotated[int, typer.Option(min=1, help="Interleaved A/B rounds; medians and spreads over them.")] = 5,
    steps: Annotated[int, typer.Option(min=1, help="Steps timed per round.")] = 10,
    json_out: Annotated[bool, typer.Option("--json", help="Print the JSON figures.")] = False,
) -> None:
    """The engine's sampler: CPU ms per batch of draws against one row at a time (baseline), one thread."""
    from bench.sampler import SamplerBenchConfig, run

    cfg = SamplerBenchConfig(batch=batch, rounds=rounds, steps=steps,
                             **({"vocab_sizes": tuple(vocab_size)} if vocab_size else {}))
    with cli_errors():
        result = run(cfg, progress=dim)
    if json_out:
        print_json(result)
        return
    for case in result["cases"]:
        ratio = case["batched_over_one_row_at_a_time"]
        console.print(f"{case['vocab_size']:>7,} {case['logits']:<6} {case['sampling']:<44} "
                      f"{case['batched_ms']['median']:8.2f} ms against {case['one_row_at_a_time_ms']['median']:8.2f} "
                      f"ms: {ratio['median']:.2f}x ({ratio['min']:.2f}-{ratio['max']:.2f})")
