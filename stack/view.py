"""The live terminal view of ``moeslo up`` (rich)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from contracts.slo_defaults import ITL_THRESHOLD_S, MAX_IMBALANCE_CV, TTFT_THRESHOLD_S

if TYPE_CHECKING:
    from rich.console import Console

    from stack.state import Sample, StackState


def _ms(value: float | None, slo_s: float) -> Text:
    if value is None:
        return Text("-", style="dim")
    return Text(f"{value * 1000:.0f} ms", style="green" if value <= slo_s else "bold red")


def _forecast(sample: Sample) -> Text:
    forecast = sample.forecast
    if not forecast:
        return Text(f"{sample.arrival_rps:.2f} / warming up", style="dim")
    style = "" if forecast.get("in_use") else "yellow"
    return Text(f"{sample.arrival_rps:.2f} / {forecast['request_rate_rps']:.2f} "
                f"(sized {forecast['sized_request_rate_rps']:.2f}, {forecast.get('model', '?')})", style=style)


def render(state: StackState) -> Group:
    sample = state.samples[-1] if state.samples else None
    title = "SLOs (client side, last 30 s)"
    if sample is not None and sample.fault_requests:
        title += f"; {sample.fault_requests} of the window's requests met the fault"
    slo = Table(title=title, expand=True)
    for column in ("TTFT p99", "ITL p99", "requests ok / failed", "replicas (current/desired)", "engines",
                   "load / forecast (req/s)"):
        slo.add_column(column)
    if sample is not None:
        slo.add_row(
            Text.assemble(_ms(sample.ttft_p99_s, TTFT_THRESHOLD_S), f" / {TTFT_THRESHOLD_S * 1000:.0f}"),
            Text.assemble(_ms(sample.itl_p99_s, ITL_THRESHOLD_S), f" / {ITL_THRESHOLD_S * 1000:.0f}"),
            f"{sample.requests_ok} / {sample.requests_failed}",
            f"{sample.current_replicas} / {sample.desired_replicas}",
            str(sample.ready_engines),
            _forecast(sample),
        )
    layers = Table(title=f"Expert imbalance per layer (CV of per-rank load; SLO {MAX_IMBALANCE_CV})", expand=True)
    layers.add_column("layer")
    layers.add_column("CV")
    layers.add_column("")
    for layer, cv in enumerate(sample.imbalance_cv if sample else []):
        bar = "█" * min(40, round(cv * 40))
        layers.add_row(str(layer), f"{cv:.3f}", Text(bar, style="green" if cv <= MAX_IMBALANCE_CV else "red"))
    events = Text()
    for when, text in state.events[-12:]:
        events.append(f"{when - state.load_started_s:6.1f}s  {text}\n")
    alerts = ", ".join(sample.alerts) if sample and sample.alerts else "none"
    load_s = state.elapsed() - state.load_started_s  # the load's seconds, as --duration counts them
    head = Text(f"moeslo up: {load_s:.0f} / {state.options.duration_s:.0f} s   alerts firing: {alerts}", style="bold")
    return Group(head, slo, layers, Panel(events, title="decisions and events"))


def print_status_line(state: StackState, console: Console, every: int = 5) -> None:
    """Without a terminal: one line every ``every`` samples, plus each new event."""
    for when, text in state.events[state.printed_events:]:
        console.print(f"{when - state.load_started_s:6.1f}s  {text}")
    state.printed_events = len(state.events)
    if not state.samples or len(state.samples) % every:
        return
    s = state.samples[-1]
    ttft = "-" if s.ttft_p99_s is None else f"{s.ttft_p99_s * 1000:.0f}ms"
    itl = "-" if s.itl_p99_s is None else f"{s.itl_p99_s * 1000:.1f}ms"
    cv = "-" if not s.imbalance_cv else f"{max(s.imbalance_cv):.3f}"
    forecast = "-" if not s.forecast else f"{s.forecast['request_rate_rps']:.2f}"
    console.print(f"{s.t_s - state.load_started_s:6.1f}s  TTFT p99 {ttft}  ITL p99 {itl}  max CV {cv}  "
                  f"ok {s.requests_ok} failed {s.requests_failed}  replicas {s.current_replicas}/{s.desired_replicas}"
                  f"  load {s.arrival_rps:.2f} forecast {forecast} req/s"
                  + (f"  ({s.fault_requests} of the p99s' requests met the fault)" if s.fault_requests else ""))
