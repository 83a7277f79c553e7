"""The end of ``moeslo up``: a summary and PNG plots."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from contracts.slo_defaults import ITL_THRESHOLD_S, MAX_IMBALANCE_CV, TTFT_THRESHOLD_S
from stack.state import Sample, StackState


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(state: StackState) -> dict[str, Any]:
    records = state.records
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    itls = [x for r in ok for x in r.itls_s]
    within = [r for r in ok if r.ttft_s is not None and r.ttft_s <= TTFT_THRESHOLD_S
              and all(x <= ITL_THRESHOLD_S for x in r.itls_s)]
    cv_series = [s.imbalance_cv for s in state.samples if s.imbalance_cv]
    actions = Counter(f"{d.get('action')}:{d.get('reason')}" for d in state.decisions)
    replicas = [s.current_replicas for s in state.samples if s.current_replicas is not None]
    wall = state.samples[-1].t_s if state.samples else 0.0
    return {
        "duration_s": round(wall, 1),
        "requests": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "unfinished_at_end": state.unfinished,
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / wall if wall else None,
        "ttft_p50_s": _pct(ttfts, 50), "ttft_p99_s": _pct(ttfts, 99),
        "itl_p50_s": _pct(itls, 50), "itl_p99_s": _pct(itls, 99),
        "ttft_good_ratio": sum(t <= TTFT_THRESHOLD_S for t in ttfts) / len(ttfts) if ttfts else None,
        "itl_good_ratio": sum(x <= ITL_THRESHOLD_S for x in itls) / len(itls) if itls else None,
        "requests_within_both_slos": len(within) / len(ok) if ok else None,
        "imbalance_cv_max_first": max(cv_series[0]) if cv_series else None,
        "imbalance_cv_max_last": max(cv_series[-1]) if cv_series else None,
        "replicas_max": max(replicas) if replicas else None,
        "decisions": dict(actions),
        "alerts_seen": sorted({a for s in state.samples for a in s.alerts}),
        "pages_delivered": len(state.pages),
        "prometheus": state.prometheus_url is not None,
        "events": [f"{t:6.1f}s {text}" for t, text in state.events],
    }


def write_plots(state: StackState, out: Path) -> list[Path]:
    """``moeslo-up.png``: latency against the SLOs, imbalance per layer, replicas (empty without samples)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not state.samples:
        return []
    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    _latency(axes[0], state.samples)
    _imbalance(axes[1], state)
    _replicas(axes[2], state.samples)
    for axis in axes:
        axis.axvline(state.load_started_s, color="grey", alpha=0.4)
    fig.tight_layout()
    path = out / "moeslo-up.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def _latency(ax: Any, samples: list[Sample]) -> None:
    t = [s.t_s for s in samples]
    ax.plot(t, [np.nan if s.ttft_p99_s is None else s.ttft_p99_s * 1000 for s in samples], label="TTFT p99 (30 s)")
    ax.axhline(TTFT_THRESHOLD_S * 1000, color="tab:red", linestyle="--",
               label=f"TTFT SLO {TTFT_THRESHOLD_S * 1000:g} ms")
    ax2 = ax.twinx()
    ax2.plot(t, [np.nan if s.itl_p99_s is None else s.itl_p99_s * 1000 for s in samples], color="tab:green",
             label="ITL p99 (30 s)")
    ax2.axhline(ITL_THRESHOLD_S * 1000, color="tab:olive", linestyle=":",
                label=f"ITL SLO {ITL_THRESHOLD_S * 1000:g} ms")
    ax.set_yscale("log")
    ax2.set_yscale("log")
    ax.set_ylabel("TTFT ms (log)")
    ax2.set_ylabel("ITL ms (log)")
    ax.legend(loc="upper left")
    ax2.legend(loc="upper right")
    ax.set_title("Latency seen by clients against the SLOs")


def _imbalance(ax: Any, state: StackState) -> None:
    samples = state.samples
    t = [s.t_s for s in samples]
    layers = max((len(s.imbalance_cv) for s in samples), default=0)
    for layer in range(layers):
        ax.plot(t, [s.imbalance_cv[layer] if len(s.imbalance_cv) > layer else np.nan for s in samples],
                label=f"layer {layer}")
    ax.axhline(MAX_IMBALANCE_CV, color="tab:red", linestyle="--", label=f"CV SLO {MAX_IMBALANCE_CV:g}")
    for when, text in state.events:
        if "rebalance" in text:
            ax.axvline(when, color="tab:purple", alpha=0.5)
    ax.set_ylabel("per-rank load CV")
    ax.set_title("Expert imbalance per layer (rebalances marked)")
    ax.legend(loc="upper right", fontsize="small", ncol=2)


def _replicas(ax: Any, samples: list[Sample]) -> None:
    t = [s.t_s for s in samples]
    ax.step(t, [np.nan if s.current_replicas is None else s.current_replicas for s in samples], where="post",
            label="current replicas")
    ax.step(t, [np.nan if s.desired_replicas is None else s.desired_replicas for s in samples], where="post",
            linestyle="--", label="desired replicas")
    ax.step(t, [s.ready_engines for s in samples], where="post", linestyle=":", label="serving engines")
    ax.set_ylabel("replicas")
    ax.set_xlabel("seconds since the stack started")
    ax.legend(loc="upper left")
    ax.set_title("Replicas: controller decisions")
