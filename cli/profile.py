"""``moeslo profile``: sweep load against a running OpenAI-compatible engine, write a profile JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import cli_errors, console, print_json
from cli.main import app


@app.command("profile")
def profile(
    url: Annotated[str, typer.Option(help="Base URL of the engine (ours or vLLM), e.g. http://127.0.0.1:8000.")],
    out: Annotated[Path, typer.Option(help="Where to write the profile JSON.")] = Path("profile.json"),
    rates: Annotated[str, typer.Option(help="Comma-separated request rates (req/s) to sweep, lightest first.")] = (
        "0.25,0.5,1,2,4"
    ),
    duration: Annotated[float, typer.Option(help="Seconds of load per rate.")] = 20.0,
    prompt_tokens: Annotated[int, typer.Option(help="Prompt length of every request.")] = 256,
    output_tokens: Annotated[int, typer.Option(help="Output length of every request (ignore_eos).")] = 64,
    vocab_size: Annotated[int, typer.Option(help="Token ids are drawn below this.")] = 1000,
    model: Annotated[str | None, typer.Option(help="Model name to send (vLLM needs it).")] = None,
    kv_capacity_tokens: Annotated[int, typer.Option(help="KV cache capacity of the replica (tokens).")] = 100_000,
    max_num_seqs: Annotated[int, typer.Option(help="The engine's running-batch limit.")] = 256,
    ttft_limit: Annotated[float, typer.Option(help="Stop the sweep once p99 TTFT exceeds this (s).")] = 5.0,
    name: Annotated[str, typer.Option(help="Profile name.")] = "measured",
    seed: Annotated[int, typer.Option(help="Seed for arrivals and prompts.")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the profile JSON to stdout.")] = False,
) -> None:
    """Record TTFT and ITL against throughput at each rate and fit the per-replica profile."""
    with cli_errors():
        import asyncio
        import time

        from rich.progress import Progress

        from controller.capacity import ProfilePoint
        from controller.profiling import fit_profile, poisson_arrivals
        from harness.loadgen import LoadRequest, run_load, summarize

        levels = [float(r) for r in rates.split(",") if r.strip()]
        points: list[ProfilePoint] = []
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("profiling", total=len(levels))
            for i, rate in enumerate(levels):
                plan = [
                    LoadRequest(arrival_s=t, prompt_tokens=prompt_tokens, max_tokens=output_tokens)
                    for t in poisson_arrivals(rate, duration, seed + i)
                ]
                began = time.monotonic()
                records = asyncio.run(run_load(url, plan, vocab_size=vocab_size, model=model, seed=seed + i))
                stats = summarize(records, wall_s=time.monotonic() - began)
                progress.advance(task)
                if not stats["ok"]:
                    console.print(f"rate {rate:g}: no request succeeded ({stats['status_counts']}); stopping")
                    break
                wall = stats["wall_s"]
                points.append(
                    ProfilePoint(
                        request_rate_rps=stats["ok"] / wall,
                        prompt_tokens_per_s=stats["prompt_tokens"] / wall,
                        output_tokens_per_s=stats["output_tokens"] / wall,
                        ttft_p99_s=stats["ttft_p99_s"] or 0.0,
                        itl_p99_s=stats["itl_p99_s"] or 0.0,
                        ttft_p50_s=stats["ttft_p50_s"],
                        itl_p50_s=stats["itl_p50_s"],
                        requests=stats["ok"],
                    )
                )
                console.print(
                    f"rate {rate:g} req/s: {stats['output_tokens_per_s']:.1f} output tok/s, "
                    f"TTFT p99 {stats['ttft_p99_s']:.3f} s, ITL p99 {stats['itl_p99_s']:.4f} s"
                )
                if (stats["ttft_p99_s"] or 0.0) > ttft_limit:
                    break
        fitted = fit_profile(
            points,
            prompt_tokens=prompt_tokens,
            kv_capacity_tokens=kv_capacity_tokens,
            max_num_seqs=max_num_seqs,
            name=name,
            source=f"moeslo profile against {url}: {len(points)} rates, {prompt_tokens}/{output_tokens} tokens",
        )
        out.write_text(fitted.to_json() + "\n")
        console.print(f"wrote {out}")
        if json_out:
            print_json(fitted.model_dump(mode="json"))
