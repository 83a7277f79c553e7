"""``moeslo profile``: sweep load against a running OpenAI-compatible engine, write a profile JSON."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.common import cli_errors, console, nonempty, positive, print_json
from cli.lists import numbers
from contracts.errors import UnavailableError, ValidationError
from contracts.urls import http_url_problem

if TYPE_CHECKING:
    from controller.capacity import PrefixProbe, ReplicaProfile
    from harness.engine_limits import ProfileLimits


def profile(
    url: Annotated[str, typer.Option(help="Base URL of the engine (ours or vLLM), e.g. http://127.0.0.1:8000.")],
    out_file: Annotated[str, typer.Option("--out", callback=nonempty, help="Where to write the profile JSON.")] = (
        "profile.json"
    ),
    rates: Annotated[str, typer.Option(help="Comma-separated request rates (req/s) to sweep, lightest first.")] = (
        "0.25,0.5,1,2,4"
    ),
    duration: Annotated[float, typer.Option(callback=positive, help="Seconds of load per rate.")] = 20.0,
    prompt_tokens: Annotated[int, typer.Option(help="Prompt length of every request.")] = 256,
    output_tokens: Annotated[int, typer.Option(help="Output length of every request (ignore_eos).")] = 64,
    vocab_size: Annotated[int, typer.Option(help="Token ids are drawn below this.")] = 1000,
    model: Annotated[str | None, typer.Option(help="Model name to send (vLLM needs it).")] = None,
    kv_capacity_tokens: Annotated[int | None, typer.Option(
        min=1, help="KV cache capacity (tokens); default: read from the engine's /metrics.")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(
        min=1, help="The engine's running-batch limit; default: read from the engine's /metrics.")] = None,
    prefill_chunk_tokens: Annotated[int | None, typer.Option(
        min=1, help="Prompt tokens prefilled per step (max_num_batched_tokens); default: read from "
                    "the engine's /metrics.")] = None,
    ttft_limit: Annotated[float, typer.Option(callback=positive, help="Stop past this p99 TTFT (s).")] = 5.0,
    name: Annotated[str, typer.Option(help="Profile name.")] = "measured",
    seed: Annotated[int, typer.Option(help="Seed for arrivals and prompts.")] = 0,
    warmup: Annotated[int, typer.Option(min=0, help="Requests sent one at a time before the sweep, not measured.")] = 3,
    prefix_probe: Annotated[bool, typer.Option(
        "--prefix-probe/--no-prefix-probe",
        help="Also time cold prompts against prompts whose first 75 % is cached (idle replica, one at a time) "
             "and fit what a cached prompt token still costs.")] = True,
    probe_pairs: Annotated[int, typer.Option(help="Requests of each kind in the prefix probe.")] = 10,
    json_out: Annotated[bool, typer.Option("--json", help="Print the profile JSON to stdout.")] = False,
) -> None:
    """Record TTFT and ITL against throughput at each rate and fit the per-replica profile."""
    out = Path(out_file)
    with cli_errors():
        from controller.profiling import fit_profile, profile_point
        from harness.sweep import sweep_rates

        levels = numbers("--rates", rates)
        _check_numbers(levels, prompt_tokens=prompt_tokens, output_tokens=output_tokens, vocab_size=vocab_size,
                       probe_pairs=probe_pairs if prefix_probe else 1)  # fmt: skip
        _check_out(out)
        _check_reachable(url)
        limits, assumed = _engine_limits(url, kv_capacity_tokens, max_num_seqs, prefill_chunk_tokens)
        summaries = _sweep(url, levels, warmup, sweep_rates, duration_s=duration, prompt_tokens=prompt_tokens,
                           output_tokens=output_tokens, vocab_size=vocab_size, model=model, seed=seed,
                           ttft_limit_s=ttft_limit)  # fmt: skip
        probe = _probe(url, prompt_tokens, vocab_size, model, seed, probe_pairs) if prefix_probe else None
        fitted = fit_profile(
            [profile_point(stats) for stats in summaries], prompt_tokens=prompt_tokens, name=name, prefix_probe=probe,
            source=f"moeslo profile against {url}: {len(summaries)} rates, {prompt_tokens}/{output_tokens} tokens"
                   f"{assumed}", **limits,
        )
        fitted = _with_held_rate(fitted, summaries, prompt_tokens=prompt_tokens, output_tokens=output_tokens)
        out.write_text(fitted.to_json() + "\n")
        console.print(_describe_fit(fitted))
        console.print(f"wrote {out}")
        if json_out:
            print_json(fitted.model_dump(mode="json"))


def _check_numbers(levels: list[float], *, prompt_tokens: int, output_tokens: int, vocab_size: int,
                   probe_pairs: int) -> None:  # fmt: skip
    """What no sweep can fit a profile from, refused before it runs."""
    if not levels or any(not rate > 0 for rate in levels):
        raise ValidationError(f"--rates: request rates above 0 are needed, got {','.join(map(str, levels))!r}")
    problems = [f"{flag}: must be 1 or more, got {value}"
                for flag, value in (("--prompt-tokens", prompt_tokens), ("--output-tokens", output_tokens),
                                    ("--vocab-size", vocab_size), ("--probe-pairs", probe_pairs))
                if value < 1]  # fmt: skip
    if output_tokens == 1:
        # One token a request leaves no gap between tokens: no level would measure an ITL to fit.
        problems.append(f"--output-tokens: must be 2 or more (the ITL is measured between tokens), got {output_tokens}")
    if len(levels) < 2:
        problems.append(f"--rates: a profile is fitted from two load levels or more, got {len(levels)}")
    elif any(b <= a for a, b in pairwise(levels)):
        # The sweep stops at the first level past the TTFT limit: out of order, the lighter ones are never run.
        problems.append(f"--rates: lightest first, each above the last, got {','.join(f'{r:g}' for r in levels)}")
    if problems:
        raise ValidationError(problems)


def _check_out(out: Path) -> None:
    """Where the profile goes, made and checked before the sweep, not after it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_dir():
        raise IsADirectoryError(21, "Is a directory", str(out))


def _check_reachable(url: str) -> None:
    """Fail at once on an engine that does not answer, instead of after a sweep with no request served."""
    import httpx

    problem = http_url_problem("--url", url)
    if problem is not None:
        raise ValidationError(problem)
    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=10.0)
    except httpx.HTTPError as exc:
        raise UnavailableError(f"engine at {url}: {type(exc).__name__}: {exc}") from exc


def _sweep(url: str, levels: list[float], warmup: int, sweep_rates: Callable[..., list[dict[str, Any]]],
           **load: Any) -> list[dict[str, Any]]:  # fmt: skip
    """The sweep's level summaries, with a progress bar."""
    from rich.progress import Progress

    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("profiling", total=len(levels) + (warmup > 0))

        def progress(line: str) -> None:
            bar.advance(task)
            console.print(line)

        return sweep_rates(url, levels, progress=progress, warmup_requests=warmup, **load)


def _engine_limits(url: str, kv_capacity_tokens: int | None, max_num_seqs: int | None,
                   prefill_chunk_tokens: int | None) -> tuple[ProfileLimits, str]:  # fmt: skip
    """The profile's limits: each flag given, else what the engine exports, else an assumption, said
    (the second part: ``; assumed ...`` and how many engines were added up, for the profile's source, or empty)."""
    from harness.engine_limits import assumed_note, profile_limits

    limits, assumed, engines = profile_limits(url, kv_capacity_tokens=kv_capacity_tokens,
                                              max_num_seqs=max_num_seqs, prefill_chunk_tokens=prefill_chunk_tokens)
    if assumed:
        flags = " / ".join(f"--{key.replace('_', '-')}" for key in assumed)
        console.print(f"the engine does not export {', '.join(assumed)}: assumed "
                      f"{', '.join(f'{v:,}' for v in assumed.values())} (give {flags} to state them)")
    return limits, assumed_note(assumed) + engines


def _probe(
    url: str, prompt_tokens: int, vocab_size: int, model: str | None, seed: int, pairs: int
) -> PrefixProbe | None:
    """Run the prefix probe and say what it measured."""
    from controller.profiling import prefix_probe_record
    from harness.prefix_probe import prefix_probe

    stats = prefix_probe(url, prompt_tokens=prompt_tokens, vocab_size=vocab_size, model=model, seed=seed, pairs=pairs)
    probe = prefix_probe_record(stats)
    if probe is None:
        console.print("prefix probe: no successful request of one kind; cached tokens are taken to cost nothing")
    else:
        console.print(f"prefix probe: TTFT p50 {probe.cold_ttft_p50_s * 1000:.1f} ms cold, "
                      f"{probe.cached_ttft_p50_s * 1000:.1f} ms with {probe.cached_share:.0%} of the prompt cached "
                      f"({stats['cached_share_source']})")
    return probe


def _with_held_rate(fitted: ReplicaProfile, summaries: list[dict[str, Any]], *, prompt_tokens: int,
                    output_tokens: int) -> ReplicaProfile:  # fmt: skip
    """The profile with its measured ceiling and what it was measured under, and a line saying what it is."""
    from contracts.slo_defaults import ITL_THRESHOLD_S, TTFT_THRESHOLD_S
    from controller.profile_levels import GAP_SHARE, HELD_SHARE, MIN_HELD_REQUESTS, held_rate_rps, with_held_ceiling
    from controller.replica_profile import CEILING_LENGTH_FACTOR, CeilingConditions

    # The sweep's summaries score each request against the mission's objectives (harness.loadgen.summarize).
    measured_at = CeilingConditions(ttft_s=TTFT_THRESHOLD_S, itl_s=ITL_THRESHOLD_S, prompt_tokens=prompt_tokens,
                                    output_tokens=output_tokens)  # fmt: skip
    ceiled = with_held_ceiling(fitted, summaries, measured_at)
    if ceiled.max_request_rate_rps is None and all(int(s.get("requests") or 0) < MIN_HELD_REQUESTS
                                                   for s in summaries):  # fmt: skip
        console.print(f"no level served the {MIN_HELD_REQUESTS} requests a level needs to count (longer "
                      "--duration or higher --rates): the profile has no measured ceiling")
    elif ceiled.max_request_rate_rps is None and (held := held_rate_rps([summaries])) is not None:
        console.print(f"every level held: no ceiling measured; sweep higher --rates (the {held:.2f} requests/s "
                      "of the top level is only a lower bound of what a replica holds)")
    elif ceiled.max_request_rate_rps is None:
        console.print(f"no level held {HELD_SHARE:.0%} of its requests within both objectives and {GAP_SHARE:.1%} "
                      "of its token gaps within the ITL objective: the profile has no measured ceiling")
    else:
        console.print(f"held the objectives up to {ceiled.max_request_rate_rps:.2f} requests/s: the capacity "
                      f"model's ceiling (max_request_rate_rps) for policies with TTFT {TTFT_THRESHOLD_S * 1000:g} ms "
                      f"and ITL {ITL_THRESHOLD_S * 1000:g} ms objectives or stricter and lengths no shorter than "
                      f"{prompt_tokens}/{output_tokens} tokens by more than {CEILING_LENGTH_FACTOR:g}x")
    return ceiled


def _describe_fit(fitted: ReplicaProfile) -> str:
    cost = "" if fitted.prefix_probe is None else (
        f", a cached prompt token costs {fitted.cached_token_cost:.2f} of a computed one")
    return (f"prefill {fitted.prefill_tokens_per_s:.0f} tokens/s, ITL {fitted.itl_base_s * 1000:.1f} ms "
            f"+ {fitted.itl_per_seq_s * 1000:.3f} ms per sequence{cost}")
