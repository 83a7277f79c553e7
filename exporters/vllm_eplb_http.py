"""The trigger's HTTP side: routes the plugin adds to vLLM's API server (``vllm.endpoint_plugins``).

vLLM 0.32 loads an endpoint plugin only when ``VLLM_PLUGINS`` names it
(``VLLM_PLUGINS=moeslo,moeslo_eplb``, plus ``moeslo_eplb_policy`` and
``moeslo_otel`` where used).  :class:`EplbEndpoint` adds:

* ``GET /moeslo/eplb``: EPLB's state, the current placement, the routing
  window summed over the workers that count, its measured balance, and the
  log of rearrangements (what the controller's ``VllmEngineControl`` reads);
* ``POST /moeslo/eplb/rebalance``: body ``{"dry_run": false, "when": "now",
  "placement": null, "load": null}`` (all optional).  A dry run returns the
  plan and its predicted balance (CV and balancedness per layer, before and
  after), the experts it would move, and moves nothing.  Otherwise vLLM
  rearranges (see ``engine.vllm_plugin.eplb_control``) and the reply adds
  the step stall, and ``applied`` or (async EPLB) ``pending``.

Both reach the workers through vLLM's ``collective_rpc`` (vLLM's way for an
endpoint plugin, paired with the general plugin that installs the worker
method), on every engine the API server manages: under data parallelism the
routing windows of all engines are summed.  Errors are JSON ``{"error": {"type", "message", "code",
"reason"?, "problems"?}}``: 400 for a bad body, 409 when vLLM's state
refuses (``eplb_off``: EPLB is not enabled; ``eplb_data_parallel``; ``eplb_pipeline_parallel``;
``eplb_busy``: async EPLB still commits an earlier rearrangement; ``no_window``; ``no_placement``;
``plugin_off``: ``MOESLO_VLLM_PLUGIN`` is
off), 503 when a worker fails or a bad ``MOESLO_VLLM_*`` setting switched the
plugin off (``bad_setting``, ``problems`` names each).  The API server reads
the plugin's settings from the environment vLLM hands its workers: with the
plugin off the routes answer at once, and vLLM logs no failed call.
"""

from __future__ import annotations

import json
import logging
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from contracts.errors import ConflictError, MoesloError, UnavailableError, ValidationError
from engine.vllm_plugin.eplb_control import WORKER_METHOD
from engine.vllm_plugin.eplb_requests import (
    EplbRefusedError,
    RebalanceRequest,
    load_for,
    merge_replies,
    merge_status,
)
from engine.vllm_plugin.settings import ENABLE_ENV, PluginSettings

logger = logging.getLogger("moeslo.vllm_plugin")

STATUS_PATH = "/moeslo/eplb"
REBALANCE_PATH = "/moeslo/eplb/rebalance"
RPC_TIMEOUT_S = 300.0


class PluginOffError(UnavailableError):
    """A bad ``MOESLO_VLLM_*`` setting switched the plugin off: no worker counts or answers (HTTP 503)."""

    reason = "bad_setting"

    def __init__(self, problems: tuple[str, ...]) -> None:
        self.problems = problems
        super().__init__(f"the moeslo vLLM plugin is off because of a bad setting: {'; '.join(problems)} "
                         "(fix it and restart vLLM)")  # fmt: skip


def plugin_refusal(env: Mapping[str, str] | None = None) -> MoesloError | None:
    """Why the workers cannot answer, from the plugin's settings (the environment vLLM hands its workers);
    None with the plugin on."""
    try:
        settings = PluginSettings.from_env(env)
    except ValidationError as exc:
        return PluginOffError(exc.problems)
    if not settings.enabled:
        return EplbRefusedError("plugin_off", f"the moeslo vLLM plugin is off: start vLLM with {ENABLE_ENV}=1")
    return None


def status_code(exc: MoesloError) -> int:
    if isinstance(exc, ValidationError):
        return 400
    if isinstance(exc, ConflictError):
        return 409
    return 503


def error_body(exc: MoesloError) -> dict[str, Any]:
    body: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc), "code": status_code(exc)}
    reason = getattr(exc, "reason", None)
    if reason is not None:
        body["reason"] = reason
    problems = getattr(exc, "problems", None)
    if problems is not None:
        body["problems"] = list(problems)
    return {"error": body}


class EplbService:
    """The routes' logic over an engine client (anything with vLLM's ``collective_rpc``)."""

    def __init__(
        self, engine_client: Any, *, timeout_s: float = RPC_TIMEOUT_S, refusal: MoesloError | None = None
    ) -> None:
        """``refusal``: what every request answers instead of calling the workers (:func:`plugin_refusal`)."""
        self.engine_client = engine_client
        self.timeout_s = timeout_s
        self.refusal = refusal

    async def _call(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        if self.refusal is not None:
            # The workers lack the method: vLLM would log each call's traceback. (A fresh traceback each time:
            # raised again as it is, one instance would grow its traceback request by request.)
            raise self.refusal.with_traceback(None)
        if self.engine_client is None:
            raise UnavailableError("no engine behind this API server")
        try:
            replies = await self._every_engines_workers(json.dumps(payload))
        except MoesloError:
            raise
        except Exception as exc:
            # vLLM's engine core reports any worker failure as a plain Exception ("Call to moeslo_eplb method
            # failed: ..."), a missing method included; a timeout arrives the same way.
            if isinstance(exc, AttributeError) or "has no attribute" in str(exc):  # the general plugin is off there
                raise ConflictError(f"the workers lack {WORKER_METHOD}: load the general plugin moeslo too "
                                    f"(VLLM_PLUGINS=moeslo,moeslo_eplb) with {ENABLE_ENV}=1 ({exc})") from exc
            raise UnavailableError(f"the workers' {WORKER_METHOD} call failed: {type(exc).__name__}: {exc}") from exc
        return [dict(r) if isinstance(r, dict) else {"error": {"type": "BadReply", "message": repr(r)}}
                for r in replies]  # fmt: skip

    async def _every_engines_workers(self, payload: str) -> list[Any]:
        """The replies of every worker of every engine this API server manages.  vLLM's ``collective_rpc``
        under data parallelism with its internal load balancer (``DPLBAsyncMPClient``) calls every engine
        but returns only the first engine's workers, so the engines are called through its
        ``call_utility_all_async`` (one list of worker replies per engine) where the client has it."""
        call_all = getattr(getattr(self.engine_client, "engine_core", None), "call_utility_all_async", None)
        if call_all is None:  # a client without vLLM's multi-process core: its collective_rpc is every worker
            return list(await self.engine_client.collective_rpc(WORKER_METHOD, timeout=self.timeout_s,
                                                                args=(payload,)))  # fmt: skip
        per_engine = await call_all("collective_rpc", WORKER_METHOD, self.timeout_s, (payload,), None)
        return [reply for replies in per_engine for reply in replies]

    async def status(self) -> dict[str, Any]:
        return merge_status(await self._call({"action": "status"}))

    async def rebalance(self, request: RebalanceRequest) -> dict[str, Any]:
        status = await self.status()
        load = load_for(request, status)
        reply = merge_replies(await self._call(request.worker_payload(load)))
        reply["measured_status"] = {k: status.get(k) for k in ("steps_in_window", "measured", "counting_workers")}
        return reply


def parse_body(raw: bytes) -> Any:
    """The request body as JSON (an empty body is ``{}``); :class:`ValidationError` when it is not JSON,
    not UTF-8, or nested deeper than the parser goes."""
    try:
        return json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as exc:
        raise ValidationError(f"the body is not JSON: {exc.msg}") from exc
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValidationError(f"the body is not JSON: {type(exc).__name__}: {exc}") from exc


class EplbEndpoint:
    """The ``vllm.endpoint_plugins`` entry point ``moeslo_eplb``."""

    name = "moeslo_eplb"
    required_tasks = None

    def attach_router(self, app: FastAPI) -> None:
        async def respond(request: Request, work: Any) -> JSONResponse:
            service = getattr(request.app.state, "moeslo_eplb", None) or EplbService(
                getattr(request.app.state, "engine_client", None), refusal=plugin_refusal()
            )
            try:
                return JSONResponse(await work(service))
            except MoesloError as exc:
                return JSONResponse(error_body(exc), status_code=status_code(exc))

        @app.get(STATUS_PATH)
        async def eplb_status(request: Request) -> JSONResponse:
            return await respond(request, lambda service: service.status())

        @app.post(REBALANCE_PATH)
        async def eplb_rebalance(request: Request) -> JSONResponse:
            try:
                parsed = RebalanceRequest.from_json(parse_body(await request.body()))
            except ValidationError as exc:
                return JSONResponse(error_body(exc), status_code=400)
            return await respond(request, lambda service: service.rebalance(parsed))

    async def init_state(self, engine_client: Any, state: Any, args: Namespace) -> None:
        state.moeslo_eplb = EplbService(engine_client, refusal=plugin_refusal())


__all__ = [
    "REBALANCE_PATH",
    "STATUS_PATH",
    "EplbEndpoint",
    "EplbService",
    "PluginOffError",
    "error_body",
    "parse_body",
    "plugin_refusal",
    "status_code",
]
