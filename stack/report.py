"""The end of ``moeslo up``: ``summary.json`` (the plots are :mod:`stack.plots`).

Two per-request readings of "within both SLOs" are reported: the request's TTFT at
or under 500 ms and its mean inter-token gap at or under 20 ms
(:func:`contracts.attainment.within_objectives`, how the replay and the serving
literature score a request), and the strict one where no single gap may exceed
20 ms (``requests_within_both_slos``, kept from earlier runs).  Requests that
overlap the injected fault (plus ``FAULT_MARGIN_S`` for the queue it leaves) are
counted apart.  Every share of requests (``ttft_good_ratio`` and the ``requests_within_*`` ones) is of all
the requests it covers: a failed one is not within, nor is one still in flight when the load ended (recorded
as failed).  The gap shares (``itl_good_ratio*``) are of token gaps, as the controller's ITL SLI is: every gap
a request streamed, a failed one's included; a refused request has none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from contracts.attainment import every_gap_within, gaps_within_share, within_objectives
from contracts.slo_defaults import TTFT_THRESHOLD_S
from harness.loadgen import RequestRecord
from stack.state import StackState

__all__ = ["FAULT_MARGIN_S", "TAKEN_OUTCOMES", "outside_fault", "request_rows", "summarize", "taken"]

FAULT_MARGIN_S = 5.0
"""After the fault ends, its backlog drains: requests arriving this soon after still count as in it."""


TAKEN_OUTCOMES = ("applied", "held", "verified", "unverified")
"""Outcomes of a decision the controller carried out: a scale or rebalance applied, a hold held, a verification
made (its verdict is its reason).  Failed, advisory, standby and interrupted ones were not."""


def taken(decision: dict[str, Any]) -> bool:
    """Whether the controller carried ``decision`` out (a failed scale-up is no scale-up)."""
    return decision.get("outcome") in TAKEN_OUTCOMES


def _label(decision: dict[str, Any]) -> str:
    return f"{decision.get('action')}:{decision.get('reason')}"


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _share(hits: int, total: int) -> float | None:
    return hits / total if total else None


def _within(records: list[RequestRecord], verdict: Callable[[float | None, list[float]], bool]) -> float | None:
    """The share of ``records`` within the objectives by ``verdict``: a failed request is one not within (the
    shares were of the successful ones only, and a run whose router refused requests read as perfect)."""
    return _share(sum(r.ok and verdict(r.ttft_s, r.itls_s) for r in records), len(records))


def _first_token_within(ttft_s: float | None, _itls_s: list[float]) -> bool:
    return ttft_s is not None and ttft_s <= TTFT_THRESHOLD_S


def recent_requests(state: StackState, now_s: float, window_s: float) -> tuple[list[RequestRecord], int]:
    """The requests that finished in the last ``window_s`` (what the live p99s are of), and how many of them
    the fault touched."""
    pairs = [(r, t) for r, t in zip(state.records, state.done_at_s, strict=True) if t >= now_s - window_s]
    records = [r for r, _ in pairs]
    return records, len(records) - len(outside_fault(state, records, [t for _, t in pairs]))


def outside_fault(state: StackState, records: list[RequestRecord], done_at_s: list[float]) -> list[RequestRecord]:
    """Requests whose lifetime (arrival to finish, stack seconds) does not touch the fault window."""
    if state.fault is None:
        return list(records)
    start, end = state.fault
    out = []
    for record, done in zip(records, done_at_s, strict=True):
        arrived = state.load_started_s + record.arrival_s
        if done < start or arrived > end + FAULT_MARGIN_S:
            out.append(record)
    return out



def _alerts_firing(posts: list[dict[str, Any]]) -> int:
    """The alerts that fired in ``posts``, each once: a group is notified again when an alert joins it (a second
    burn window), and that post repeats the alerts it had paged already."""
    return len({alert.get("fingerprint") or repr(sorted(alert.get("labels", {}).items()))
                for post in posts if post.get("status") == "firing"
                for alert in post.get("alerts", []) if alert.get("status", "firing") == "firing"})

def summarize(state: StackState) -> dict[str, Any]:
    records = state.records
    ok = [r for r in records if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    itls = [x for r in ok for x in r.itls_s]
    clear = outside_fault(state, records, state.done_at_s)
    all_gaps = [x for r in records for x in r.itls_s]  # a failed stream's gaps were seen all the same
    clear_gaps = [x for r in clear for x in r.itls_s]
    cv_series = [s.imbalance_cv for s in state.samples if s.imbalance_cv]
    actions = Counter(_label(d) for d in state.decisions if taken(d))
    not_taken = Counter(f"{_label(d)} {d.get('outcome')}" for d in state.decisions if not taken(d))
    replicas = [s.current_replicas for s in state.samples if s.current_replicas is not None]
    # The load's seconds, not the stack's: the set-up before it (checkpoint, profile, start-up) is no load time.
    wall = max(0.0, state.samples[-1].t_s - state.load_started_s) if state.samples else 0.0
    pages = [p for p in state.pages if p.get("receiver") == "page"]
    return {
        "duration_s": round(wall, 1),
        "interrupted": state.interrupted,
        "requests": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "unfinished_at_end": state.unfinished,
        "output_tokens_per_s": sum(r.output_tokens for r in ok) / wall if wall else None,
        "ttft_p50_s": _pct(ttfts, 50), "ttft_p99_s": _pct(ttfts, 99),
        "itl_p50_s": _pct(itls, 50), "itl_p99_s": _pct(itls, 99),
        "ttft_good_ratio": _within(records, _first_token_within),
        "itl_good_ratio": gaps_within_share(all_gaps),
        "requests_within_both_slos": _within(records, every_gap_within),
        "requests_within_both_slos_outside_fault": _within(clear, within_objectives),
        "requests_within_both_slos_outside_fault_every_gap": _within(clear, every_gap_within),
        "itl_good_ratio_outside_fault": gaps_within_share(clear_gaps),
        "requests_outside_fault": len(clear),
        "fault_window_s": None if state.fault is None else [round(t - state.load_started_s, 1) for t in state.fault],
        "imbalance_cv_max_first": max(cv_series[0]) if cv_series else None,
        "imbalance_cv_max_last": max(cv_series[-1]) if cv_series else None,
        "replicas_max": max(replicas) if replicas else None,
        "decisions": dict(actions),
        "decisions_not_applied": dict(not_taken),
        "forecast_scale_ups": actions.get("scale_up:forecast", 0),
        "forecast_models": forecast_models(state),
        "rebalances_verified": actions.get("verify_rebalance:verified", 0),
        "alerts_seen": sorted({a for s in state.samples for a in s.alerts}),
        # Alertmanager posts again when an alert resolves (send_resolved): that is no page, nor a ticket.
        "pages_delivered": sum(p.get("status") == "firing" for p in pages),
        "alerts_paged": _alerts_firing(pages),
        "pages_resolved": sum(p.get("status") == "resolved" for p in pages),
        "tickets_delivered": sum(p.get("receiver") == "ticket" and p.get("status") == "firing" for p in state.pages),
        "pages": [{"at_s": round(p["delivered_at_s"] - state.load_started_s, 1), "status": p.get("status"),
                   "alerts": sorted({a["labels"].get("alertname", "?") for a in p.get("alerts", [])})}
                  for p in pages],
        "profile": state.profile,
        "prometheus": state.prometheus_url is not None,
        "router_requests": state.router_requests if state.router_url is not None else None,
        **_control_loop(state),
        # In time order: a decision or page is recorded at its own time, which may come before lines seen earlier.
        "events": [f"{t - state.load_started_s:6.1f}s {text}" for t, text in sorted(state.events, key=lambda e: e[0])],
    }


def forecast_models(state: StackState) -> list[dict[str, Any]]:
    """The forecaster's model over the run, each with the load's second it was first seen at (the selection
    refits as the history grows: moving average first, Holt and ARIMA once their fits have the bins)."""
    models: list[dict[str, Any]] = []
    for sample in state.samples:
        model = (sample.forecast or {}).get("model")
        if model and (not models or models[-1]["model"] != model):
            models.append({"model": model, "from_s": round(sample.t_s - state.load_started_s, 1)})
    return models


def _control_loop(state: StackState) -> dict[str, Any]:
    """Whether the controller lived through the run and every process is gone; when not, for how long the loop
    was dead (from the controller's exit to the stop)."""
    exited = None
    if state.controller_exit is not None:
        at, code = state.controller_exit
        end = state.stopping_s if state.stopping_s is not None else state.elapsed()
        exited = {"code": code, "at_s": round(at - state.load_started_s, 1), "loop_dead_s": round(end - at, 1)}
    return {
        "control_loop_ok": exited is None and not state.still_running,
        "controller_exit": exited,
        "controller_unanswered": state.controller_unanswered,
        "still_running": list(state.still_running),
    }


def request_rows(state: StackState) -> list[dict[str, Any]]:
    """One row per request, for ``requests.csv``: when it came, what it saw, and whether it met the objectives, by
    each rule the summary's shares use."""
    clear = {id(r) for r in outside_fault(state, state.records, state.done_at_s)}
    rows = []
    for record in sorted(state.records, key=lambda r: r.arrival_s):
        gaps = record.itls_s
        rows.append({
            "arrival_s": round(record.arrival_s, 3), "prompt_tokens": record.prompt_tokens,
            "output_tokens": record.output_tokens, "status": record.status,
            "ttft_s": None if record.ttft_s is None else round(record.ttft_s, 4),
            "itl_mean_s": round(sum(gaps) / len(gaps), 4) if gaps else None,
            "itl_max_s": round(max(gaps), 4) if gaps else None,
            # By the summary's rules: ``requests_within_both_slos`` is every gap within (the column of that
            # name read the mean gap), ``requests_within_both_slos_outside_fault`` the mean gap.
            "within_both_slos": record.ok and every_gap_within(record.ttft_s, gaps),
            "within_both_slos_mean_gap": record.ok and within_objectives(record.ttft_s, gaps),
            "outside_fault": id(record) in clear, "error": record.error or "",
        })
    return rows

