"""The messages between the API process and the engine-core process, as msgpack.

Every message is one msgpack array whose first item is its kind.  API -> core
(one PUSH/PULL socket)::

    [ADD, request_id, prompt_token_ids, sampling_params (map), arrival_s]
    [ABORT, [request_id, ...], reason]     reason: "abort" (client gone) or "stop" (a stop the API found)
    [CALL, call_id, method, [args...]]     utility calls: placement, kv_state, check_invariants, ...
    [SHUTDOWN]

core -> API (one PUSH/PULL socket, in order)::

    [READY, info (map)]                    once, after the model loaded
    [STEP, [output, ...], stats or nil]    once per step: stats first, so /metrics is never behind a token
    [REJECT, request_id, error]            the request was not admitted (400, 429)
    [REPLY, call_id, ok, value or error]
    [HEALTH, broken or nil]                while idle, every second
    [GOODBYE, final state (map)]           last, after SHUTDOWN: every request aborted, blocks freed

An output is ``[request_id, token_id, finished, finish_reason, is_stop_token,
error, prompt_tokens, generation_tokens]``; new per-token fields (logprobs,
then the prompt's logprobs with a request's first token) go at the end, so
older readers still read the first eight.  Times are
``time.monotonic()`` seconds, which both processes share on one host.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import numpy as np

from contracts.errors import (
    MoesloError,
    NotFoundError,
    OverloadedError,
    PlacementError,
    UnavailableError,
    ValidationError,
)
from engine.engine_types import RequestOutput
from engine.errors import PromptTooLongError
from engine.sampling import SamplingParams, TokenLogprob
from engine.stats import FinishedRequestStats, PlacementSwapStats, RoutingDelta, StepStats

ADD, ABORT, CALL, SHUTDOWN = 1, 2, 3, 4
READY, STEP, REJECT, REPLY, HEALTH, GOODBYE = 11, 12, 13, 14, 15, 16


def pack(message: list[Any]) -> bytes:
    return msgpack.packb(message, use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> list[Any]:
    message = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if not isinstance(message, list) or not message:
        raise ValueError(f"malformed engine message: {message!r:.200}")
    return message


# ----------------------------------------------------------------- requests


def params_to_wire(params: SamplingParams) -> dict[str, Any]:
    raw = dataclasses.asdict(params)
    raw["stop_token_ids"] = list(params.stop_token_ids)
    return raw


def params_from_wire(raw: dict[str, Any]) -> SamplingParams:
    bias = tuple((int(token), float(value)) for token, value in raw.get("logit_bias", ()))
    return SamplingParams(**{**raw, "stop_token_ids": tuple(raw.get("stop_token_ids", ())), "logit_bias": bias})


def output_to_wire(out: RequestOutput) -> list[Any]:
    return [out.request_id, out.token_id, out.finished, out.finish_reason, out.is_stop_token, out.error,
            out.prompt_tokens, out.generation_tokens, out.logprobs, out.prompt_logprobs]  # fmt: skip


def _logprob_from_wire(raw: list[Any]) -> TokenLogprob:
    chosen, top = raw
    return float(chosen), tuple((int(token), float(value)) for token, value in top)


def output_from_wire(raw: list[Any]) -> RequestOutput:
    logprobs = _logprob_from_wire(raw[8]) if len(raw) > 8 and raw[8] is not None else None
    prompt = tuple(_logprob_from_wire(p) for p in raw[9]) if len(raw) > 9 and raw[9] is not None else None
    return RequestOutput(raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7], logprobs, prompt)


# ----------------------------------------------------------------- errors


def error_to_wire(exc: BaseException) -> dict[str, Any]:
    raw: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, ValidationError):
        raw["problems"] = list(exc.problems)
    if isinstance(exc, OverloadedError):
        raw["retry_after_s"] = exc.retry_after_s
    if isinstance(exc, PromptTooLongError):
        raw["fields"] = {"prompt_tokens": exc.prompt_tokens, "max_tokens": exc.max_tokens,
                         "max_model_len": exc.max_model_len, "context_note": exc.context_note}
    if isinstance(exc, NotFoundError):
        raw["fields"] = {"kind": exc.kind, "name": exc.name}
    return raw


def error_from_wire(raw: dict[str, Any]) -> MoesloError:
    """The error the core raised, rebuilt; anything unexpected becomes UnavailableError."""
    kind, message = raw.get("type"), str(raw.get("message", ""))
    if kind == "PromptTooLongError":
        return PromptTooLongError(**raw["fields"])
    if kind == "PlacementError":
        return PlacementError(raw.get("problems") or message)
    if kind == "ValidationError":
        return ValidationError(raw.get("problems") or message)
    if kind == "OverloadedError":
        return OverloadedError(message, retry_after_s=float(raw.get("retry_after_s", 1.0)))
    if kind == "NotFoundError":
        return NotFoundError(**raw["fields"])
    if kind == "UnavailableError":
        return UnavailableError(message)
    return UnavailableError(f"engine core failed: {kind}: {message}")


# ----------------------------------------------------------------- statistics


def _array_to_wire(arr: np.ndarray[Any, Any]) -> list[Any]:
    return [list(arr.shape), np.ascontiguousarray(arr, dtype=np.int64).tobytes()]


def _array_from_wire(raw: list[Any]) -> np.ndarray[Any, np.dtype[np.int64]]:
    return np.frombuffer(raw[1], dtype=np.int64).reshape(raw[0]).copy()


def stats_to_wire(stats: StepStats) -> dict[str, Any]:
    raw: dict[str, Any] = {
        f.name: getattr(stats, f.name) for f in dataclasses.fields(stats)
        if f.name not in ("finished", "routing", "placement_swap")
    }  # fmt: skip
    raw["ttfts_s"], raw["itls_s"] = list(stats.ttfts_s), list(stats.itls_s)
    raw["finished"] = [dataclasses.astuple(f) for f in stats.finished]
    if stats.routing is not None:
        r = stats.routing
        raw["routing"] = [_array_to_wire(r.expert_tokens), _array_to_wire(r.rank_tokens), r.steps]
    if stats.placement_swap is not None:
        raw["placement_swap"] = dataclasses.astuple(stats.placement_swap)
    return raw


def stats_from_wire(raw: dict[str, Any]) -> StepStats:
    fields = dict(raw)
    fields["ttfts_s"], fields["itls_s"] = tuple(raw["ttfts_s"]), tuple(raw["itls_s"])
    fields["finished"] = tuple(FinishedRequestStats(*f) for f in raw["finished"])
    routing = raw.get("routing")
    fields["routing"] = None if routing is None else RoutingDelta(
        _array_from_wire(routing[0]), _array_from_wire(routing[1]), int(routing[2])
    )
    swap = raw.get("placement_swap")
    fields["placement_swap"] = None if swap is None else PlacementSwapStats(*swap)
    return StepStats(**fields)


__all__ = [
    "ABORT", "ADD", "CALL", "GOODBYE", "HEALTH", "READY", "REJECT", "REPLY", "SHUTDOWN", "STEP",
    "error_from_wire", "error_to_wire", "output_from_wire", "output_to_wire", "pack", "params_from_wire",
    "params_to_wire", "stats_from_wire", "stats_to_wire", "unpack",
]  # fmt: skip
