"""``moeslo-up.png``: the loop in four panels, on one time axis (seconds since the load began).

1. Load: requests sent per second against the controller's forecast (point and interval,
   shifted by its horizon so each forecast sits over the time it was made for) and the rate
   the fleet was sized for;
2. replicas: desired, current and serving, with every scale decision marked and its reason;
3. latency seen by clients (p99 over 30 s) against the objectives;
4. expert imbalance per layer against 0.15, with the sampling-noise floor and rebalances marked.
The injected fault is shaded in every panel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from contracts.slo_defaults import ITL_THRESHOLD_S, MAX_IMBALANCE_CV, TTFT_THRESHOLD_S
from stack.report import taken
from stack.state import Sample, StackState

__all__ = ["decision_time", "write_plots"]


def _series(samples: list[Sample], value: Any) -> list[float]:
    return [np.nan if (v := value(s)) is None else float(v) for s in samples]


def decision_time(decision: dict[str, Any], t0: float) -> tuple[float, str]:
    """Where a decision goes on the time axis (seconds since the load began), at its own time, and a note for its
    label when that is not where it is drawn: one made before the load began (the scale-up from zero during
    start-up) is drawn at 0, where the axis starts, its time in its label."""
    when = float(decision.get("at_s", decision.get("seen_at_s", t0))) - t0
    return (when, "") if when >= 0 else (0.0, f" (at {when:.1f} s)")


def write_plots(state: StackState, out: Path) -> list[Path]:
    """Draw the four panels; nothing when there are no samples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = state.samples
    if not samples:
        return []
    t0 = state.load_started_s
    t = [s.t_s - t0 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(11, 13), sharex=True)
    _load_panel(axes[0], state, samples, t, t0)
    _replica_panel(axes[1], state, samples, t, t0)
    _latency_panel(axes[2], samples, t)
    _imbalance_panel(axes[3], state, samples, t, t0)
    for axis in axes:
        if state.fault is not None:
            axis.axvspan(state.fault[0] - t0, state.fault[1] - t0, color="tab:red", alpha=0.08,
                         label="injected fault")
        axis.axvline(0.0, color="grey", alpha=0.4)
    axes[-1].set_xlabel("seconds since the load began")
    fig.tight_layout()
    path = out / "moeslo-up.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def _load_panel(ax: Any, state: StackState, samples: list[Sample], t: list[float], t0: float) -> None:
    ax.plot(t, [s.arrival_rps for s in samples], color="black", label="requests sent per second (10 s)")
    horizon = [(s.forecast or {}).get("horizon_s") or 0.0 for s in samples]
    shifted = [x + h for x, h in zip(t, horizon, strict=True)]
    point = _series(samples, lambda s: (s.forecast or {}).get("request_rate_rps"))
    lower = _series(samples, lambda s: (s.forecast or {}).get("request_rate_lower_rps"))
    upper = _series(samples, lambda s: (s.forecast or {}).get("request_rate_upper_rps"))
    sized = _series(samples, lambda s: (s.forecast or {}).get("sized_request_rate_rps"))
    ax.plot(shifted, point, color="tab:blue", label="forecast, shifted by its horizon")
    ax.fill_between(shifted, lower, upper, color="tab:blue", alpha=0.2, label="forecast interval")
    ax.plot(t, sized, color="tab:orange", linestyle="--", label="sized for (next lead time, upper quantile)")
    if state.profile is not None:
        for n in (1, 2):
            ax.axhline(n * state.profile["replica_rate_rps"], color="grey", linestyle=":", alpha=0.6)
        ax.text(t[0], state.profile["replica_rate_rps"], " one replica's measured capacity", fontsize="small",
                va="bottom", color="grey")
    ax.set_ylabel("requests / s")
    ax.set_title("Load against the controller's forecast")
    ax.legend(loc="upper left", fontsize="small")


def _replica_panel(ax: Any, state: StackState, samples: list[Sample], t: list[float], t0: float) -> None:
    ax.step(t, _series(samples, lambda s: s.desired_replicas), where="post", linestyle="--", label="desired")
    ax.step(t, _series(samples, lambda s: s.current_replicas), where="post", label="current")
    ax.step(t, [s.ready_engines for s in samples], where="post", linestyle=":", label="serving")
    for decision in state.decisions:
        if decision.get("action") in ("scale_up", "scale_down") and decision.get("outcome") == "applied":
            when, note = decision_time(decision, t0)
            ax.annotate(f"{decision['action']}:{decision.get('reason')}{note}",
                        (when, decision.get("desired_replicas") or 0),
                        xytext=(3, 6), textcoords="offset points", fontsize="small", color="tab:purple")
            ax.axvline(when, color="tab:purple", alpha=0.3)
    ax.set_ylabel("replicas")
    top = max([*(s.desired_replicas or 0 for s in samples), *(s.current_replicas or 0 for s in samples), 1])
    ax.set_ylim(0, top + 0.6)  # room above the highest step for its reason, under the title
    ax.set_title("Replicas: decisions with their reasons")
    ax.legend(loc="upper left", fontsize="small")


def _latency_panel(ax: Any, samples: list[Sample], t: list[float]) -> None:
    ax.plot(t, [v * 1000 for v in _series(samples, lambda s: s.ttft_p99_s)], label="TTFT p99 (30 s)")
    ax.axhline(TTFT_THRESHOLD_S * 1000, color="tab:blue", linestyle="--", alpha=0.6,
               label=f"TTFT objective {TTFT_THRESHOLD_S * 1000:g} ms")
    ax.plot(t, [v * 1000 for v in _series(samples, lambda s: s.itl_p99_s)], color="tab:green",
            label="ITL p99 (30 s)")
    ax.axhline(ITL_THRESHOLD_S * 1000, color="tab:green", linestyle=":", alpha=0.6,
               label=f"ITL objective {ITL_THRESHOLD_S * 1000:g} ms")
    ax.set_yscale("log")
    ax.set_ylabel("ms (log)")
    ax.set_title("Latency seen by clients against the objectives")
    ax.legend(loc="upper left", fontsize="small", ncol=2)


def _imbalance_panel(ax: Any, state: StackState, samples: list[Sample], t: list[float], t0: float) -> None:
    layers = max((len(s.imbalance_cv) for s in samples), default=0)
    for layer in range(layers):
        ax.plot(t, [s.imbalance_cv[layer] if len(s.imbalance_cv) > layer else np.nan for s in samples],
                label=f"layer {layer}")
    noise = [max(s.noise_cv) if s.noise_cv else np.nan for s in samples]
    ax.plot(t, noise, color="grey", linestyle=":", label="sampling-noise floor (worst layer)")
    ax.axhline(MAX_IMBALANCE_CV, color="tab:red", linestyle="--", label=f"objective {MAX_IMBALANCE_CV}")
    marked = [d for d in state.decisions if d.get("action") in ("rebalance", "verify_rebalance")]
    for i, decision in enumerate(marked):
        when, note = decision_time(decision, t0)
        ax.axvline(when, color="tab:purple", alpha=0.5)
        # Staggered: a rebalance of the second replica often lands seconds after the first one's verdict.
        label = f"{decision['action']}:{decision.get('reason')}" + ("" if taken(decision) else
                                                                   f" {decision.get('outcome')}") + note
        ax.annotate(label, (when, MAX_IMBALANCE_CV),
                    xytext=(3, 10 + 12 * (i % 3)), textcoords="offset points", fontsize="small", color="tab:purple")
    ax.set_ylabel("CV of per-rank load")
    ax.set_title("Expert imbalance per layer; rebalances marked")
    ax.legend(loc="upper right", fontsize="small", ncol=2)
