"""The rebalancer's engine control for vLLM: the moeslo plugin's routes, and picking the adapter per endpoint.

:class:`VllmEngineControl` is :class:`~controller.actuators.placement.EngineControl`
over a vLLM server that runs the moeslo plugin with its endpoint
(``VLLM_PLUGINS=moeslo,moeslo_eplb``, ``MOESLO_VLLM_PLUGIN=1``):

* ``expert_load`` reads ``GET /moeslo/eplb``: the routing window the plugin
  counted (summed over vLLM's workers), its per-layer CV, the flush
  intervals with traffic (``steps_in_window``: a lower bound on steps) and
  the current placement (EPLB's live map; with EPLB off, vLLM's static EP
  layout, so advisory mode works everywhere);
* ``apply_placement`` posts the controller's plan to
  ``POST /moeslo/eplb/rebalance``; vLLM rearranges with its own code between
  two steps.  vLLM 0.32's default async EPLB answers ``pending`` (its worker
  thread moves the weights, and the next steps commit the map layer by
  layer): the adapter then reads ``GET /moeslo/eplb`` until vLLM's map is the
  plan, for ``commit_timeout_s`` at most, and only then reports it applied, so
  verification measures the new placement (the plugin restarts its window
  when the map changes).  With EPLB off vLLM answers 409 ``eplb_off``, which
  becomes an :class:`~contracts.errors.UnavailableError` naming the reason (a
  ``failed`` rebalance in the decision log); so does a plan vLLM has not
  committed in time;
* ``dry_run`` (vLLM only) returns the plan vLLM's policy would make and its
  predicted balance.

:class:`AutoEngineControl` lets one rebalancer govern both kinds of engine:
it asks each endpoint for ``/moeslo/eplb`` (404 means the embedded engine)
and keeps the answer until a call through that kind fails, then asks again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import numpy as np

from contracts.errors import MoesloError, UnavailableError
from contracts.placement import Placement
from controller.actuators.placement import (
    EngineControl,
    ExpertLoadSnapshot,
    HttpEngineControl,
    JsonHttpControl,
    Rebalancer,
    checked,
    engine_placement,
    totals,
)
from controller.config import ControllerSettings
from controller.errors import CommitUnconfirmedError, EngineRefusalError, malformed_answer
from controller.sources.base import within

STATUS_PATH = "/moeslo/eplb"
REBALANCE_PATH = "/moeslo/eplb/rebalance"
APPLY_TIMEOUT_S = 300.0
COMMIT_TIMEOUT_S = 60.0
"""How long async EPLB may take to commit a plan (it commits one layer per step, so only while vLLM serves)."""
COMMIT_POLL_S = 0.5
PIPELINE_HINT = " (pipeline parallelism? rank 0 reports its own stage's placement only: not rebalanced)"
_T = TypeVar("_T")
SWAP_KEYS = ("applied", "experts_moved", "slots_changed", "stall_s", "plan_source", "async", "pending",
             "commit_wait_s", "workers")  # fmt: skip


def swap_summary(reply: dict[str, Any]) -> dict[str, Any]:
    """What the decision log keeps of vLLM's answer (not the plan's matrix)."""
    out = {k: reply[k] for k in SWAP_KEYS if k in reply}
    for key in ("predicted_before", "predicted_after", "measured_before"):
        if isinstance(reply.get(key), dict):
            out[f"{key}_cv_max"] = reply[key]["cv_max"]
            out[f"{key}_balancedness_min"] = reply[key]["balancedness_min"]
    return out


class VllmEngineControl(JsonHttpControl):
    """:class:`EngineControl` over vLLM with the moeslo plugin's ``/moeslo/eplb`` routes."""

    def __init__(
        self, client: httpx.AsyncClient | None = None, timeout_s: float = 10.0, *,
        commit_timeout_s: float = COMMIT_TIMEOUT_S, commit_poll_s: float = COMMIT_POLL_S,
    ) -> None:  # fmt: skip
        super().__init__(client, timeout_s)
        self.commit_timeout_s = commit_timeout_s
        """How long a plan async EPLB took may stay uncommitted before the apply is a failure."""
        self.commit_poll_s = commit_poll_s

    async def status(self, endpoint: str) -> dict[str, Any]:
        status: dict[str, Any] = await self._call("GET", f"{endpoint}{STATUS_PATH}")
        return status

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        status = await self.status(endpoint)
        with malformed_answer(endpoint):
            return self._snapshot(endpoint, status)

    @staticmethod
    def _snapshot(endpoint: str, status: dict[str, Any]) -> ExpertLoadSnapshot:
        if status.get("expert_tokens") is None:
            raise UnavailableError(f"vLLM at {endpoint} counts no routed tokens (set MOESLO_VLLM_PLUGIN=1)")
        if status.get("phy2log") is None or not status.get("num_ranks"):
            raise UnavailableError(f"vLLM at {endpoint} reports no placement to plan from")
        source = f"vLLM at {endpoint}"
        placement = engine_placement(source, {"phy2log": status["phy2log"], "num_ranks": status["num_ranks"]})
        measured = status.get("measured") or {}
        snap = ExpertLoadSnapshot(
            expert_tokens=np.asarray(status["expert_tokens"], dtype=np.int64),
            imbalance_cv=tuple(float(x) for x in measured.get("cv", ())),
            steps_in_window=int(status.get("steps_in_window") or 0),
            placement=placement,
            expert_tokens_total=totals(status),
        )
        # The plugin's window spans every pipeline stage's layers, its placement rank 0's stage alone.
        staged = snap.expert_tokens.ndim == 2 and snap.expert_tokens.shape[0] > placement.num_layers
        return checked(source, snap, PIPELINE_HINT if staged else "")

    async def apply_placement(self, endpoint: str, placement: Placement) -> dict[str, Any]:
        reply = await self._call("POST", f"{endpoint}{REBALANCE_PATH}", json={"placement": placement.to_json()},
                                 timeout=APPLY_TIMEOUT_S)  # fmt: skip
        if reply.get("pending") and not reply.get("applied"):
            reply = {**reply, **await self._committed(endpoint, placement)}
            if not reply["applied"]:
                raise CommitUnconfirmedError(
                    f"vLLM at {endpoint} took the placement for its async EPLB but had not committed it after "
                    f"{self.commit_timeout_s:g} s (it commits one layer per step, only while it serves; it may "
                    f"still do so): {swap_summary(reply)}", swap=swap_summary(reply))  # fmt: skip
        if not reply.get("applied"):
            raise UnavailableError(f"vLLM at {endpoint} did not commit the placement: {swap_summary(reply)}")
        return swap_summary(reply)

    async def _committed(self, endpoint: str, placement: Placement) -> dict[str, Any]:
        """Async EPLB: wait until vLLM's map is ``placement`` (``applied``), ``commit_timeout_s`` at most.  Each
        read flushes the plugin's counts, so the window it reports from then on is the new map's alone."""
        started = time.monotonic()
        while True:
            status = await self.status(endpoint)
            waited = time.monotonic() - started
            phy2log = status.get("phy2log")
            if phy2log is not None and np.array_equal(np.asarray(phy2log), placement.phy2log):
                return {"applied": True, "commit_wait_s": waited}
            if waited >= self.commit_timeout_s:
                return {"applied": False, "commit_wait_s": waited}
            await asyncio.sleep(self.commit_poll_s)

    async def dry_run(self, endpoint: str, placement: Placement | None = None) -> dict[str, Any]:
        """The plan vLLM would carry out (its EPLB policy's, or ``placement``) with its predicted balance."""
        body: dict[str, Any] = {"dry_run": True}
        if placement is not None:
            body["placement"] = placement.to_json()
        reply: dict[str, Any] = await self._call("POST", f"{endpoint}{REBALANCE_PATH}", json=body,
                                                 timeout=APPLY_TIMEOUT_S)  # fmt: skip
        return reply


class AutoEngineControl:
    """Per endpoint, vLLM's adapter or the embedded engine's, by whether it serves ``/moeslo/eplb``."""

    def __init__(self, client: httpx.AsyncClient | None = None, timeout_s: float = 10.0) -> None:
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self.embedded = HttpEngineControl(self._client)
        self.vllm = VllmEngineControl(self._client)
        self._kind: dict[str, EngineControl] = {}

    async def control_for(self, endpoint: str) -> EngineControl:
        known = self._kind.get(endpoint)
        if known is not None:
            return known
        try:
            response = await within(self._client.get(f"{endpoint}{STATUS_PATH}"), self._client.timeout.read,
                                    f"GET {endpoint}{STATUS_PATH}")  # fmt: skip
        except httpx.HTTPError as exc:
            raise UnavailableError(f"GET {endpoint}{STATUS_PATH}: {exc!r}") from exc
        # Any answer but 404 (200, or 409/503 from the plugin) means the route exists: vLLM with the plugin.
        control: EngineControl = self.embedded if response.status_code == 404 else self.vllm
        self._kind[endpoint] = control
        return control

    def kind(self, endpoint: str) -> str | None:
        """``vllm``, ``embedded``, or None before the first contact (and after a failed call, until the next)."""
        control = self._kind.get(endpoint)
        return None if control is None else ("vllm" if control is self.vllm else "embedded")

    async def _through_kind(self, endpoint: str, call: Callable[[EngineControl], Awaitable[_T]]) -> _T:
        """``call`` on the endpoint's kind of control.  When it fails (other than a refusal on a route the engine
        knew) the kind is forgotten, so the next call asks again: the kind may be wrong (a first probe a proxy
        answered while the pod started, a pod IP reused by the other kind of engine), and one probe more after a
        failure is cheap where a kind kept forever is not."""
        control = await self.control_for(endpoint)
        try:
            return await call(control)
        except MoesloError as exc:
            if isinstance(exc, EngineRefusalError) and exc.understood:
                raise  # the route was known, the request refused (EPLB off, a bad placement): the kind stands
            if self._kind.get(endpoint) is control:
                del self._kind[endpoint]
            raise

    async def expert_load(self, endpoint: str) -> ExpertLoadSnapshot:
        return await self._through_kind(endpoint, lambda control: control.expert_load(endpoint))

    async def apply_placement(self, endpoint: str, placement: Placement) -> dict[str, Any]:
        return await self._through_kind(endpoint, lambda control: control.apply_placement(endpoint, placement))

    async def aclose(self) -> None:
        await self._client.aclose()


def build_rebalancer(settings: ControllerSettings) -> Rebalancer | None:
    """The configured live rebalancer (None: off): one for both engines, each endpoint driven through the
    embedded engine's placement API or vLLM's /moeslo/eplb routes, by what it answers."""
    if not settings.rebalance:
        return None
    return Rebalancer(
        AutoEngineControl(timeout_s=settings.source_timeout_s),
        window_every_s=settings.rebalance_window_s,
        min_windows=settings.rebalance_min_windows,
    )


__all__ = ["AutoEngineControl", "VllmEngineControl", "build_rebalancer", "swap_summary"]
