"""``moeslo bench ...``: each benchmark is a function in ``bench/``; these commands parse, call and print.

Every benchmark reports JSON figures as ratios against a named baseline measured
in the same run; progress goes to stderr so stdout stays parseable.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from cli.common import cli_errors, console, dim, positive, print_error, print_json

bench_app = typer.Typer(
    help="Benchmarks: JSON figures as ratios against a named baseline measured in the same run.",
    no_args_is_help=True,
)

T = TypeVar("T")


def _config(factory: Callable[..., T], **values: Any) -> T:
    """A benchmark's config; its ValueError (a bad combination of options) is a usage error."""
    try:
        return factory(**values)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _with_tick_bar(label: str, total: int, run: Callable[[Callable[[int, int], None]], T]) -> T:
    """Run a tick benchmark with a progress bar fed by its ``progress(done, total)`` callback."""
    from rich.progress import Progress

    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        return run(lambda done, _total: bar.update(task, completed=done))


@bench_app.command("controller-service")
def bench_controller_service(
    policies: Annotated[int, typer.Option(min=1, help="SLO policies.")] = 100,
    replicas: Annotated[int, typer.Option(min=1, help="Replicas over all policies.")] = 1000,
    ticks: Annotated[int, typer.Option(min=1, help="Timed ticks (after the warm-up).")] = 100,
    warmup_ticks: Annotated[int, typer.Option(min=0, help="Untimed ticks first.")] = 10,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic fleet.")] = 0,
    goal_ms: Annotated[float, typer.Option(min=0.0, help="Goal for the p99 of one service tick.")] = 100.0,
    predictive: Annotated[bool, typer.Option("--predictive", help="The core the service builds (forecasts).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """One service tick (store, source, actuator, core, decision log, metrics) against the core alone, and how
    long the service's event loop stalls meanwhile (every other tick)."""
    from bench.controller_service import ServiceBenchConfig, report_lines, run_service_bench

    cfg = _config(ServiceBenchConfig, policies=policies, replicas=replicas, ticks=ticks, warmup_ticks=warmup_ticks,
                  seed=seed, goal_ms=goal_ms, predictive=predictive)
    figures = _with_tick_bar("service ticks", cfg.warmup_ticks + 2 * cfg.ticks,
                             lambda progress: run_service_bench(cfg, progress=progress))
    if json_out:
        print_json(figures)
        return
    for line in report_lines(figures):
        console.print(line)


@bench_app.command("controller")
def bench_controller(
    policies: Annotated[int, typer.Option(min=1, help="SLO policies in the fleet.")] = 100,
    replicas: Annotated[int, typer.Option(min=1, help="Replicas over all policies.")] = 1000,
    ticks: Annotated[int, typer.Option(min=1, help="Timed ticks (after the warm-up).")] = 300,
    warmup_ticks: Annotated[int, typer.Option(min=0, help="Untimed ticks first.")] = 20,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic fleet.")] = 0,
    goal_ms: Annotated[float, typer.Option(min=0.0, help="Goal for the p99 of one full tick.")] = 100.0,
    predictive: Annotated[
        bool,
        typer.Option("--predictive", help="Time the core the service builds (forecasts, capacity model, fallback)."),
    ] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """One tick over POLICIES policies and REPLICAS replicas: median and p99 against a baseline."""
    from bench.controller import ControllerBenchConfig, run_controller_bench

    cfg = _config(ControllerBenchConfig, policies=policies, replicas=replicas, ticks=ticks,
                  warmup_ticks=warmup_ticks, seed=seed, goal_ms=goal_ms, predictive=predictive)
    figures = _with_tick_bar("controller ticks", cfg.warmup_ticks + cfg.ticks,
                             lambda progress: run_controller_bench(cfg, progress=progress))
    if json_output:
        print_json(figures)
        return
    baseline = figures["baseline"]
    assert isinstance(baseline, dict)
    console.print(
        f"baseline {baseline['name']}: median {baseline['median_ms']:.3f} ms, p99 {baseline['p99_ms']:.3f} ms "
        f"(cpu median {baseline['cpu_median_ms']:.3f} ms)"
    )
    results = figures["results"]
    assert isinstance(results, list)
    for result in results:
        console.print(
            f"{result['name']}: median {result['median_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms "
            f"(cpu median {result['cpu_median_ms']:.3f} ms, p99 {result['cpu_p99_ms']:.3f} ms; "
            f"{result['median_ratio_vs_baseline']:.2f}x baseline median)"
        )
    verdict = "meets" if figures["meets_goal"] else "MISSES"
    with_refits = "meets" if figures["meets_goal_with_refits"] else "misses"
    console.print(f"{verdict} the goal: p99 of a full tick to its decisions <= {cfg.goal_ms:g} ms "
                  f"({with_refits} it with the refits after them)")  # fmt: skip


@bench_app.command("engine")
def bench_engine(
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint directory; default: a fresh `moeslo model init` one.")
    ] = None,
    batches: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,16",
    prompt_len: Annotated[int, typer.Option(min=1, help="Prompt tokens per sequence.")] = 199,
    new_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per sequence (greedy, no early stop).")] = 32,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    repeats: Annotated[int, typer.Option(min=1, help="Runs per configuration; the median is reported.")] = 3,
    ep: Annotated[int, typer.Option(min=1, help="Expert-parallel ranks for our engine.")] = 1,
    colocate_ranks: Annotated[
        bool, typer.Option("--colocate-ranks", help="Keep the EP ranks' expert slots in one process.")
    ] = False,
    threads: Annotated[
        int | None, typer.Option(min=1, help="torch threads per rank of our engine (default: the CPU affinity set, "
                                             "shared among rank processes); transformers gets our ranks' total.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the JSON figures.")] = False,
) -> None:
    """Prefill/decode tokens/s of our engine vs transformers' generate (baseline), routing stats on and off."""
    import os

    # Both engines run with OpenMP workers that sleep at barriers, as `moeslo serve`'s engine core does.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    with cli_errors():
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from bench.engine import run
        from cli.lists import integers
        from engine.checkpoint import init_random_checkpoint
        from engine.config import ModelConfig

        sizes = tuple(integers("--batches", batches))
        if not sizes or min(sizes) < 1:
            raise typer.BadParameter(f"batch sizes must be >= 1, got {batches!r}", param_hint="--batches")
        with tempfile.TemporaryDirectory() as tmp, Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
        ) as progress:
            task = progress.add_task("preparing", total=None)
            ckpt = checkpoint or init_random_checkpoint(Path(tmp) / "ckpt", ModelConfig(), seed=0)
            result = run(ckpt, batches=sizes, prompt_len=prompt_len, new_tokens=new_tokens, dtype=dtype,
                         repeats=repeats, ep=ep, colocate_ranks=colocate_ranks, threads=threads,
                         progress=lambda text: progress.update(task, description=text))
        if json_out:
            print_json(result)
        else:
            for batch, figures in result["batches"].items():
                console.print(
                    f"batch {batch}: {figures['moeslo_stats_on']['generated_tokens_per_s']['median']:.0f} tok/s, "
                    f"{figures['speedup_vs_transformers']:.2f}x transformers, "
                    f"stats cost {100 * figures['stats_cost_fraction']:.1f}%"
                )


@bench_app.command("step-profile")
def bench_step_profile(
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint directory; default: a fresh `moeslo model init` one.")
    ] = None,
    batch: Annotated[int, typer.Option(min=1, help="Decoding sequences.")] = 16,
    prompt_len: Annotated[int, typer.Option(min=1, help="Prompt tokens per sequence.")] = 199,
    steps: Annotated[int, typer.Option(min=2, help="Decode steps (half timed, half profiled).")] = 20,
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: the affinity set).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the JSON figures.")] = False,
) -> None:
    """Where a decode step's time goes (torch.profiler): self-CPU time per step by category and top ops."""
    with cli_errors():
        from bench.step_profile import run
        from engine.checkpoint import init_random_checkpoint
        from engine.config import ModelConfig

        with tempfile.TemporaryDirectory() as tmp:
            ckpt = checkpoint or init_random_checkpoint(Path(tmp) / "ckpt", ModelConfig(), seed=0)
            result = run(ckpt, batch=batch, prompt_len=prompt_len, steps=steps, dtype=dtype, threads=threads)
        if json_out:
            print_json(result)
            return
        console.print(f"decode step at batch {batch}: {result['step_wall_ms']['median']} ms wall, "
                      f"{result['step_cpu_ms_median']} ms CPU")
        for name, us in result["self_cpu_us_per_step_by_category"].items():
            console.print(f"  {name}: {us / 1000:.2f} ms")


@bench_app.command("forecast")
def bench_forecast(
    bin: Annotated[float, typer.Option("--bin", help="Bin width (s).")] = 30.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON to stdout.")] = False,
) -> None:
    """WAPE of our forecasters against the best baseline on the shared traces."""
    with cli_errors():
        from bench.forecast import run

        with console.status("backtesting forecasters on the shared traces"):
            report = run(bin_s=bin, progress=console.print)
        if json_out:
            print_json(report)
            return
        for name, case in report["cases"].items():
            for horizon, entry in case["horizons"].items():
                console.print(
                    f"{name} {horizon}: best model {entry.get('best_model')} / best baseline "
                    f"{entry.get('best_baseline')} = {entry.get('best_model_vs_best_baseline')}"
                )


@bench_app.command("rebalance")
def bench_rebalance(
    data: Annotated[
        Path | None, typer.Option("--data", help="Folder of SGLang expert-load JSON files (default: shared data).")
    ] = None,
    max_files: Annotated[int, typer.Option("--max-files", help="Use at most this many files (0: all).")] = 0,
    repeat: Annotated[int, typer.Option("--repeat", help="Timed runs of each planner per plan, alternating.")] = 3,
    out_of_sample_only: Annotated[
        bool, typer.Option("--out-of-sample-only", help="Only the leave-one-out and ordered-pair section.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Our planner against DeepSeek's EPLB on real expert-load files: balance in and out of sample, plan time,
    re-plan moves."""
    with cli_errors():
        from bench.rebalance import expert_load_dir
        from bench.rebalance_oos import run_all
        from controller.rebalance.allocator import keep_freed_memory

        keep_freed_memory()  # as the controller runs its planner (controller/rebalance/allocator.py)
        with console.status("planning every file with both planners") as status:
            result = run_all(data or expert_load_dir(), max_files=max_files, repeat=repeat,
                             out_of_sample_only=out_of_sample_only, progress=status.update)
        if as_json:
            print_json(result)
        else:
            console.print_json(data=result)


@bench_app.command("live-rebalance")
def bench_live_rebalance(
    phase_s: Annotated[float, typer.Option(min=1.0, help="Seconds the load stays on one prompt kind.")] = 8.0,
    phases: Annotated[int, typer.Option(min=2, help="Phases of each compare run (last window, history).")] = 7,
    trials: Annotated[int, typer.Option(min=0, help="History-planned rebalances judged against a prediction.")] = 10,
    history_windows: Annotated[int, typer.Option(min=2, help="Load windows the history planner keeps.")] = 4,
    json_out: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """The embedded engine's hot experts drift between prompt kinds: planning from history against planning
    from the last window (CV at each phase's end), and each rebalance's CV against its held-out prediction."""
    with cli_errors():
        from bench.live_rebalance import LiveOptions, run_live

        options = _config(LiveOptions, phase_s=phase_s, phases=phases, trials=trials,
                          history_windows=history_windows)
        with tempfile.TemporaryDirectory() as tmp, console.status("starting the engine") as status:
            result = run_live(Path(tmp), options, trials=trials > 0, progress=status.update)
        if json_out:
            print_json(result)
        else:
            console.print_json(data=result)


@bench_app.command("replay")
def bench_replay(
    week: Annotated[
        str, typer.Option(help="Week tuning cases STARTUP:ERROR, comma-separated ('' for none).")
    ] = "300:-0.2",
    traces: Annotated[
        str, typer.Option(help="Report traces: conv, code, mooncake, or .jsonl/.csv files ('' for none).")
    ] = "conv,code",
    startups: Annotated[str, typer.Option(help="Start-up times (s) of the report matrix.")] = "60,300,600",
    errors: Annotated[str, typer.Option(help="Capacity errors of the report matrix.")] = "-0.2,0.2",
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per report case.")] = 3,
    scale: Annotated[
        float | None, typer.Option(callback=positive, help="Rate scale of the report traces (default 10).")
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes.")] = 2,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON to stdout.")] = False,
) -> None:
    """Every policy tuned over its knob; replica-hours at equal attainment, ours over the best baseline."""
    with cli_errors():
        from bench.replay import run
        from cli.lists import numbers

        week_cases = [(float(a), float(b)) for a, _, b in (c.partition(":") for c in week.split(",") if c.strip())]
        with console.status("replaying the shared traces through every policy and knob") as status:
            report = run(
                week_cases=week_cases, traces=[t.strip() for t in traces.split(",") if t.strip()],
                startups=numbers("--startups", startups), errors=numbers("--errors", errors),
                seeds=list(range(seeds)), scale=scale, workers=workers, progress=status.update,
            )  # fmt: skip
        if json_out:
            print_json(report)
            return
        console.print_json(data={"goals": report.get("goals"), "wall_s": report.get("wall_s")})


@bench_app.command("serve")
def bench_serve(
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint to serve (default: a fresh `moeslo model init` one).")
    ] = None,
    trace: Annotated[
        Path | None, typer.Option(help="Request trace (default: Azure 2023 conversation, shared or bundled).")
    ] = None,
    duration_s: Annotated[float, typer.Option(help="Wall time of each replay run.")] = 20.0,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds of exporters off and on (ABBA), compared per round.")] = 2,
    skip_baseline: Annotated[
        bool, typer.Option(help="Only the exporters-on run (long RSS runs); no ratios.")
    ] = False,
    speedup: Annotated[float, typer.Option(help="Time compression of the trace.")] = 1.0,
    length_scale: Annotated[float, typer.Option(help="Factor on the trace's token lengths.")] = 1 / 16,
    kv_cache_mb: Annotated[float, typer.Option(help="KV cache budget of the server (MiB).")] = 64.0,
    max_in_flight: Annotated[int, typer.Option(min=1, help="Client-side bound on concurrent requests.")] = 128,
    scrape_interval_s: Annotated[float, typer.Option(help="GET /metrics this often in the exporters-on run.")] = 1.0,
    render_layers: Annotated[int, typer.Option(min=1, help="Layers of the /metrics render benchmark.")] = 58,
    render_experts: Annotated[int, typer.Option(min=1, help="Experts of the /metrics render benchmark.")] = 256,
    json_out: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Replay a trace against the server with exporters on and off (baseline); latency, throughput, RSS."""
    with cli_errors():
        from bench.serve import ServeBenchOptions, run_serve_bench

        options = ServeBenchOptions(
            checkpoint=checkpoint, trace=trace, duration_s=duration_s, speedup=speedup,
            length_scale=length_scale, kv_cache_mb=kv_cache_mb, max_in_flight=max_in_flight,
            scrape_interval_s=scrape_interval_s, rounds=rounds, skip_baseline=skip_baseline,
            render_layers=render_layers,
            render_experts=render_experts,
        )
        result = run_serve_bench(options, progress=dim)
        if json_out:
            print_json(result)
        else:
            console.print_json(data=result)


@bench_app.command("vllm-eplb")
def bench_vllm_eplb(
    data: Annotated[
        Path | None, typer.Option("--data", help="Folder of SGLang expert-load JSON files (default: shared data).")
    ] = None,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Timed calls per plan (the best is kept).")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """Our planner as vLLM's EPLB policy against vLLM's default policy, through vLLM's policy interface."""
    with cli_errors():
        from bench.vllm_eplb import run_vllm_eplb_bench

        with console.status("planning every file with both policies inside the vLLM venv"):
            try:
                result = run_vllm_eplb_bench(data, repeat=repeat)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print_error(exc)
                raise typer.Exit(code=2) from exc
        if as_json:
            print_json(result)
        else:
            console.print_json(data=result)


@bench_app.command("vllm")
def bench_vllm(
    checkpoint: Annotated[
        Path | None, typer.Option(help="Checkpoint for both engines (default: a fresh random one, bf16).")
    ] = None,
    prompts: Annotated[int, typer.Option(min=1, help="Requests per round, sent at once.")] = 16,
    prompt_tokens: Annotated[int, typer.Option(min=1, help="Prompt length (random token ids).")] = 199,
    new_tokens: Annotated[int, typer.Option(min=1, help="Tokens generated per request (greedy, no early stop).")] = 32,
    min_pairs: Annotated[int, typer.Option(min=1, help="Plugin off/on pairs before the spread may stop it.")] = 10,
    max_pairs: Annotated[int, typer.Option(min=1, help="Most plugin off/on pairs.")] = 200,
    max_minutes: Annotated[float, typer.Option(min=0.0, help="Time budget of the pairs.")] = 20.0,
    target_spread_pct: Annotated[
        float, typer.Option(min=0.0, help="Stop once the on/off ratio's 95 % CI half-width is below this.")
    ] = 1.0,
    repeats: Annotated[int, typer.Option(min=1, help="Paired rounds of our engine and vLLM (plugin off), ABBA.")] = 5,
    ours: Annotated[bool, typer.Option(help="Also run our engine (`moeslo serve`).")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
) -> None:
    """vLLM CPU with the plugin off (baseline) and on in interleaved pairs, and our engine, on the same workload."""
    with cli_errors():
        from bench.vllm import VllmBenchOptions, run_vllm_bench
        from bench.vllm_overhead import OverheadOptions

        overhead = _config(OverheadOptions, min_pairs=min_pairs, max_pairs=max(max_pairs, min_pairs),
                           max_measure_s=60.0 * max_minutes, target_spread_pct=target_spread_pct)  # fmt: skip
        options = VllmBenchOptions(checkpoint=checkpoint, prompts=prompts, prompt_tokens=prompt_tokens,
                                   new_tokens=new_tokens, repeats=repeats, overhead=overhead, ours=ours)  # fmt: skip
        try:
            result = run_vllm_bench(options, progress=dim)
        except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
            print_error(exc)
            raise typer.Exit(code=2) from exc
        if json_out:
            print_json(result)
            return
        for name, run in result["runs"].items():
            console.print(f"{name:16} {run['output_tokens_per_s']:8.1f} tok/s  TTFT p50 {run['ttft_p50_s']:.3f} s  "
                          f"ITL p50 {run['itl_p50_s'] * 1000:.1f} ms")  # fmt: skip
        ratios = result["overhead"]["ratios"]
        for key, label in (("tokens_per_s", "tokens/s"), ("cpu_s_per_token", "CPU s per token")):
            console.print(f"plugin on/off, {label}: median {ratios[key]['median']:.4f}, "
                          f"spread ±{ratios[key]['spread_pct']:.2f} % over {ratios[key]['pairs']} pairs")
        if paired := result.get("moeslo_over_vllm_tokens_per_s_paired"):
            console.print(f"moeslo over vLLM (plugin off), tokens/s: median {paired['median']:.3f} "
                          f"({paired['min']:.3f}-{paired['max']:.3f}) over {paired['rounds']} paired rounds")


@bench_app.command("status-page")
def bench_status_page(
    policies: Annotated[int, typer.Option(min=1, help="SLO policies.")] = 100,
    hours: Annotated[float, typer.Option(min=0.01, help="Hours of decisions in the log.")] = 24.0,
    tick_s: Annotated[float, typer.Option("--tick-s", min=0.1, help="Seconds between logged ticks.")] = 15.0,
    requests: Annotated[int, typer.Option(min=1, help="Timed requests of each page (after the warm-up).")] = 50,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed requests of each page first.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic fleet.")] = 0,
    goal_ms: Annotated[float, typer.Option(min=0.0, help="Goal for the p99 of one page.")] = 300.0,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The status pages (overview, one policy over 6 h and 1 d, cached and cold) against GET /v1/status."""
    from rich.progress import Progress

    from bench.status_page import StatusPageBenchConfig, run_status_page_bench

    cfg = _config(StatusPageBenchConfig, policies=policies, hours=hours, tick_s=tick_s, requests=requests,
                  warmup=warmup, seed=seed, goal_ms=goal_ms)
    with Progress(console=console, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task("writing the decision log" if stage == "fleet" else "requests", total=total)
            bar.update(tasks[stage], completed=done)

        figures = run_status_page_bench(cfg, progress=progress)
    if json_out:
        print_json(figures)
        return
    results = figures["results"]
    assert isinstance(results, list)
    for entry in [figures["baseline"], *results]:
        assert isinstance(entry, dict)
        server = f", server {entry['server_median_ms']:.1f} / {entry['server_p99_ms']:.1f} ms" if (
            "server_median_ms" in entry) else ""
        console.print(f"{entry['name']} ({entry['path']}): median {entry['median_ms']:.1f} ms, "
                      f"p99 {entry['p99_ms']:.1f} ms (cpu {entry['cpu_median_ms']:.1f} / {entry['cpu_p99_ms']:.1f} ms)"
                      f"{server}, {entry['bytes'] / 1024:.0f} KiB")
    verdict = "meets" if figures["meets_goal"] else "MISSES"
    console.print(f"{verdict} the goal: p99 server time of every page <= {cfg.goal_ms:g} ms "
                  f"({figures['decisions_logged']} decisions logged)")


@bench_app.command("router")
def bench_router(
    policy: Annotated[str, typer.Option(help="The router's policy: cost|prefix|least-loaded|round-robin.")] = "cost",
    rounds: Annotated[int, typer.Option(help="Interleaved latency rounds (direct, proxied).")] = 6,
    requests_per_round: Annotated[int, typer.Option(help="Sequential requests per path and round.")] = 300,
    throughput_rounds: Annotated[int, typer.Option(help="Interleaved throughput rounds.")] = 4,
    throughput_s: Annotated[float, typer.Option(help="Seconds of each throughput run.")] = 3.0,
    connections: Annotated[int, typer.Option(help="Concurrent client connections in throughput runs.")] = 32,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The router's overhead per request against direct calls to a stub upstream, and proxied requests/s."""
    from bench.router import RouterBenchConfig, run_router_bench

    cfg = _config(RouterBenchConfig, policy=policy, rounds=rounds, requests_per_round=requests_per_round,
                  throughput_rounds=throughput_rounds, throughput_s=throughput_s, connections=connections)
    figures = run_router_bench(cfg, progress=dim)
    if json_out:
        print_json(figures)
        return
    overhead, rate = figures["overhead"], figures["throughput"]
    console.print(f"overhead: p50 {overhead['overhead_p50_ms']:.3f} ms, p99 {overhead['overhead_p99_ms']:.3f} ms "
                  f"(goal <= {cfg.goal_overhead_p99_ms:g} ms: {'met' if overhead['goal_met'] else 'MISSED'})")
    console.print(f"throughput: {rate['proxied_requests_per_s']:.0f} req/s proxied, "
                  f"{rate['direct_requests_per_s']:.0f} direct "
                  f"(goal >= {cfg.goal_requests_per_s:g}: {'met' if rate['goal_met'] else 'MISSED'})")


from cli.bench_prefix import bench_prefix  # noqa: E402  (its own module: this one is near its size limit)

bench_app.command("prefix")(bench_prefix)

from cli.bench_sampler import bench_sampler  # noqa: E402

bench_app.command("sampler")(bench_sampler)
