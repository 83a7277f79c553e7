"""Rebalance on request, the pure half: the request, a plan's predicted figures, the workers' replies merged.

``POST /moeslo/eplb/rebalance`` on vLLM's API server (``exporters.vllm_eplb_http``)
runs two collective RPCs through vLLM's ``collective_rpc``; every worker
answers each (``engine.vllm_plugin.eplb_control``)::

    {"action": "status"}                 -> merge_status: the routing window summed over the
                                            workers that count, the current placement
    {"action": "plan" | "apply", "load": ..., "placement": ..., "when": ...}
                                         -> merge_replies: rank 0's plan and figures, the
                                            longest stall over the ranks

A dry run (``plan``) returns the plan and its predicted balance and moves
nothing.  ``apply`` makes vLLM rearrange now (between two steps, with its
own rearrangement code; async EPLB commits it over the next steps, and the
reply says ``pending``) or, with ``"when": "next_window"``, after one fresh
EPLB window.  numpy only; errors are :mod:`contracts.errors`' with a
``reason`` code when vLLM's state refuses the request::

    ConflictError
    └── EplbRefusedError   409: eplb_off, eplb_data_parallel, eplb_pipeline_parallel, eplb_busy, no_window,
                                no_placement
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from contracts.errors import ConflictError, UnavailableError, ValidationError
from contracts.imbalance import rank_load
from engine.vllm_plugin.placement_log import balance_summary

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

WHEN = ("now", "next_window")


class EplbRefusedError(ConflictError):
    """vLLM's state does not allow the request (HTTP 409); ``reason`` says which state."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def error_json(exc: BaseException) -> dict[str, Any]:
    """A worker's error, as the ``error`` member of its reply."""
    body: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, EplbRefusedError):
        body["reason"] = exc.reason
    if isinstance(exc, ValidationError):
        body["problems"] = list(exc.problems)
    return body


def raise_worker_error(body: dict[str, Any]) -> None:
    """Re-raise a worker's error on the API server side, as the same kind of error."""
    kind, message = str(body.get("type", "")), str(body.get("message", "worker failed"))
    if "reason" in body:
        raise EplbRefusedError(str(body["reason"]), message)
    if kind in ("ValidationError", "PlacementError"):
        raise ValidationError(body.get("problems") or message)
    raise UnavailableError(f"a vLLM worker failed: {kind}: {message}")


def _matrix(raw: Any, name: str, problems: list[str], *, whole: bool = False) -> npt.NDArray[Any] | None:
    """``raw`` (JSON) as a float64 matrix, or int64 with ``whole`` (expert ids: fractions are refused, not
    truncated); None with a problem added when it is not a non-empty matrix of non-negative numbers."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(isinstance(row, list) and row for row in raw):
        problems.append(f"{name} must be a non-empty layers x columns matrix (a list of lists of numbers)")
        return None
    if any(isinstance(x, bool) or not isinstance(x, int | float) for row in raw for x in row):
        problems.append(f"{name} must hold numbers only (not true/false, strings, lists or null)")
        return None
    try:
        arr = np.asarray(raw, dtype=np.float64)
    except (ValueError, OverflowError) as exc:  # rows of different lengths; an integer past float64's range
        problems.append(f"{name} must be a layers x columns matrix of numbers: {exc}")
        return None
    if not np.isfinite(arr).all() or (arr < 0).any():
        problems.append(f"{name} must hold finite, non-negative numbers")
        return None
    if not whole:
        return arr
    if (arr != np.rint(arr)).any() or (arr >= 2.0**63).any():
        problems.append(f"{name} must hold whole numbers (expert ids), below 2**63")
        return None
    return arr.astype(np.int64)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class RebalanceRequest:
    """The body of ``POST /moeslo/eplb/rebalance``; every field optional."""

    dry_run: bool = False
    """Return the plan and its predicted balance; move nothing."""
    when: str = "now"
    """``now``: rearrange between the next two steps; ``next_window``: after one fresh EPLB window (vLLM's policy)."""
    placement: IntArray | None = None
    """(layers, physical slots) the caller planned (e.g. the controller); None: vLLM's EPLB policy plans."""
    load: FloatArray | None = None
    """(layers, logical experts) load to plan for; None: the plugin's routing window."""
    placement_ranks: int | None = None
    """The ranks the caller's placement was planned for (its ``num_ranks``), checked against vLLM's."""

    @classmethod
    def from_json(cls, raw: Any) -> RebalanceRequest:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ValidationError("the body must be a JSON object")
        problems: list[str] = []
        unknown = sorted(set(raw) - {"dry_run", "when", "placement", "load"})
        if unknown:
            problems.append(f"unknown fields {unknown} (dry_run, when, placement, load)")
        dry_run = raw.get("dry_run", False)
        if not isinstance(dry_run, bool):
            problems.append(f"dry_run must be true or false, got {dry_run!r}")
        when = raw.get("when", "now")
        if when not in WHEN:
            problems.append(f"when must be one of {list(WHEN)}, got {when!r}")
        placement_raw = raw.get("placement")
        placement_ranks = None
        if isinstance(placement_raw, dict):  # a Placement's JSON ({"num_ranks", "phy2log"}) or the bare matrix
            placement_ranks = placement_raw.get("num_ranks")
            if placement_ranks is not None and (isinstance(placement_ranks, bool)
                                                or not isinstance(placement_ranks, int) or placement_ranks < 1):
                problems.append(f"placement.num_ranks must be a whole number >= 1, got {placement_ranks!r}")
            if "phy2log" not in placement_raw:  # else vLLM's own policy would plan in place of the caller's
                problems.append("placement: an object needs phy2log (layers x physical slots)")
            placement_raw = placement_raw.get("phy2log")
        placement = _matrix(placement_raw, "placement.phy2log", problems, whole=True)
        load = _matrix(raw.get("load"), "load", problems)
        if placement is not None and when == "next_window":
            problems.append("a placement is applied now: when='next_window' lets vLLM's policy plan")
        if problems:
            raise ValidationError(problems)
        return cls(dry_run=bool(dry_run), when=str(when), placement=placement, load=load,
                   placement_ranks=placement_ranks)

    def worker_payload(self, load: FloatArray | None) -> dict[str, Any]:
        """What every worker gets: the action, and the load (summed window) and placement as lists."""
        return {
            "action": "plan" if self.dry_run else "apply",
            "when": self.when,
            "placement": None if self.placement is None else self.placement.tolist(),
            "placement_ranks": self.placement_ranks,
            "load": None if load is None else load.tolist(),
        }


def rank_moves(previous: IntArray, new: IntArray, num_ranks: int) -> IntArray:
    """Per layer: replicas copied onto a rank that did not hold them ((rank, expert) pairs new to a rank)."""
    layers, num_slots = new.shape
    num_experts = int(max(previous.max(initial=0), new.max(initial=0))) + 1
    rank_of = np.arange(num_slots) // (num_slots // num_ranks)

    def counts(p2l: IntArray) -> IntArray:
        flat = (np.arange(layers)[:, None] * num_ranks + rank_of[None, :]) * num_experts + p2l
        return np.bincount(flat.ravel(), minlength=layers * num_ranks * num_experts).reshape(layers, -1)

    moved: IntArray = np.maximum(counts(new) - counts(previous), 0).sum(axis=1)
    return moved


def plan_figures(load: FloatArray, before: IntArray, after: IntArray, num_ranks: int) -> dict[str, Any]:
    """Predicted balance of ``load`` on the current and the planned placement, and the moves between them."""
    moves = rank_moves(before, after, num_ranks)
    return {
        "predicted_before": balance_summary(rank_load(before, load, num_ranks)),
        "predicted_after": balance_summary(rank_load(after, load, num_ranks)),
        "experts_moved": int(moves.sum()),
        "experts_moved_per_layer": [int(x) for x in moves],
        "slots_changed": int((before != after).sum()),
    }


def check_plan(phy2log: IntArray, shape: tuple[int, int], num_experts: int) -> None:
    """What vLLM's rearrangement needs of a plan (it checks the shape only): every expert has a replica."""
    problems = []
    if phy2log.shape != shape:
        problems.append(f"the placement is {phy2log.shape[0]} layers x {phy2log.shape[1]} slots, vLLM runs "
                        f"{shape[0]} x {shape[1]}")  # fmt: skip
    elif phy2log.min() < 0 or phy2log.max() >= num_experts:
        problems.append(f"expert ids must be in [0, {num_experts})")
    else:
        for layer, row in enumerate(phy2log):
            missing = np.setdiff1d(np.arange(num_experts), row)
            if missing.size:
                problems.append(f"layer {layer}: experts {missing[:8].tolist()} have no replica")
    if problems:
        raise ValidationError(problems)


def _check_replies(replies: list[dict[str, Any]]) -> None:
    if not replies:
        raise UnavailableError("no vLLM worker answered")
    for reply in replies:
        if reply.get("error"):
            raise_worker_error(reply["error"])


def merge_status(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """One status from every worker's: rank 0's placement and EPLB state, the windows summed."""
    _check_replies(replies)
    first = replies[0]
    windows = [r["window"] for r in replies if r.get("window")]
    out: dict[str, Any] = {
        "eplb": first.get("eplb"),
        "policy": first.get("policy"),
        "num_ranks": first.get("num_ranks"),
        "phy2log": first.get("phy2log"),
        "placement_source": first.get("placement_source"),
        "workers": len(replies),
        "counting_workers": len(windows),
        "layer_ids": None,
        "expert_tokens": None,
        "expert_tokens_total": None,
        "steps_in_window": 0,
        "placement_log": next((r["placement_log"] for r in replies if r.get("placement_log")), None),
    }
    if not windows:
        return out
    layer_ids, tokens = _tokens_by_layer(windows)
    out.update(layer_ids=layer_ids, expert_tokens=tokens.tolist(),
               steps_in_window=max(int(w["active_flushes"]) for w in windows))  # fmt: skip
    if all(w.get("expert_tokens_total") is not None for w in windows):
        _, totals = _tokens_by_layer(windows, key="expert_tokens_total")
        out["expert_tokens_total"] = totals.tolist()
    if out["phy2log"] is not None and out["num_ranks"]:
        phy2log = np.asarray(out["phy2log"], dtype=np.int64)
        if phy2log.shape[0] == tokens.shape[0]:
            out["measured"] = balance_summary(rank_load(phy2log, tokens.astype(np.float64), int(out["num_ranks"])))
    return out


def _tokens_by_layer(windows: list[dict[str, Any]], key: str = "expert_tokens") -> tuple[list[int], IntArray]:
    """The workers' windows (or totals) merged layer by layer: summed where workers count the same
    layer (data parallel), side by side where each counts its own (pipeline stages)."""
    rows: dict[int, IntArray] = {}
    for window in windows:
        counts = np.asarray(window[key], dtype=np.int64)
        if counts.ndim != 2 or counts.shape[0] != len(window["layer_ids"]):
            raise UnavailableError(f"a worker's window is {counts.shape}, for {len(window['layer_ids'])} layers")
        for layer, row in zip(window["layer_ids"], counts, strict=True):
            if int(layer) in rows and rows[int(layer)].shape != row.shape:
                raise UnavailableError(f"workers count layer {layer} over different numbers of experts")
            rows[int(layer)] = rows[int(layer)] + row if int(layer) in rows else row
    layer_ids = sorted(rows)
    return layer_ids, np.stack([rows[layer] for layer in layer_ids])


def merge_replies(replies: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's answer to ``plan`` or ``apply`` (the first worker that answered), with the longest stall of any rank."""
    _check_replies(replies)
    answers = [r for r in replies if not r.get("skipped")]
    if not answers:
        raise EplbRefusedError("no_placement", f"no worker could plan: {replies[0]['skipped']}")
    out = dict(answers[0])
    stalls = [float(r["stall_s"]) for r in replies if r.get("stall_s") is not None]
    if stalls:
        out["stall_s"] = max(stalls)
        out["stall_s_per_rank"] = stalls
    out["workers"] = len(replies)
    return out


def load_for(request: RebalanceRequest, status: dict[str, Any]) -> FloatArray | None:
    """The load to plan for: the caller's, else the plugin's window (None when neither exists)."""
    if request.load is not None:
        return request.load
    if status.get("expert_tokens") is None:
        return None
    return np.asarray(status["expert_tokens"], dtype=np.float64)


__all__ = [
    "WHEN",
    "EplbRefusedError",
    "RebalanceRequest",
    "check_plan",
    "error_json",
    "load_for",
    "merge_replies",
    "merge_status",
    "plan_figures",
    "raise_worker_error",
    "rank_moves",
]
