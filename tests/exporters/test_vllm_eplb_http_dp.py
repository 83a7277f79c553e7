"""``GET /moeslo/eplb`` under data parallelism: the routing windows of every engine, summed."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from exporters.vllm_eplb_http import EplbService
from harness.vllm_server import vllm_python

ROOT = Path(__file__).resolve().parents[2]


def worker_reply(tokens: list[int]) -> dict[str, Any]:
    """One engine's counting worker: its own routing window over one layer of four experts on two ranks."""
    return {"eplb": None, "policy": "DefaultEplbPolicy", "num_ranks": 2, "phy2log": [[0, 1, 2, 3]],
            "placement_source": "ep", "placement_log": None,
            "window": {"layer_ids": [0], "expert_tokens": [tokens], "expert_tokens_total": [tokens],
                       "active_flushes": 3, "rank_source": "ep"}}  # fmt: skip


ENGINE_REPLIES = {"engine0": [worker_reply([100, 100, 0, 0])], "engine1": [worker_reply([0, 0, 100, 100])]}


class StandinDpCore:
    """vLLM 0.32's ``DPLBAsyncMPClient`` (internal load balancer): ``collective_rpc_async`` goes through
    ``call_utility_async``, which calls every engine and returns the first engine's result only."""

    core_engines = ("engine0", "engine1")

    async def _call_utility_async(self, method: str, *args: Any, engine: str) -> Any:
        assert method == "collective_rpc"
        return ENGINE_REPLIES[engine]

    async def call_utility_all_async(self, method: str, *args: Any) -> list[Any]:
        return list(await asyncio.gather(*(self._call_utility_async(method, *args, engine=e)
                                           for e in self.core_engines)))  # fmt: skip

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        return (await self.call_utility_all_async(method, *args))[0]


class StandinAsyncLlm:
    """vLLM's ``AsyncLLM.collective_rpc``: the engine core's ``collective_rpc_async``."""

    def __init__(self) -> None:
        self.engine_core = StandinDpCore()

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple[Any, ...] = (),
                             kwargs: dict[str, Any] | None = None) -> Any:  # fmt: skip
        return await self.engine_core.call_utility_async("collective_rpc", method, timeout, args, kwargs)


def test_the_status_sums_the_routing_windows_of_every_data_parallel_engine() -> None:
    """Under `vllm serve --data-parallel-size 2` the status held engine 0's window alone (one worker, its
    experts only): measured CV 1.0 on a load that was balanced across the engines, and the controller
    rebalanced for half the traffic."""
    status = asyncio.run(EplbService(StandinAsyncLlm()).status())
    assert status["workers"] == 2 and status["counting_workers"] == 2
    assert status["expert_tokens"] == [[100, 100, 100, 100]]
    assert status["measured"]["cv_max"] == 0.0 and status["measured"]["balancedness_min"] == 1.0


DP_SCRIPT_TEMPLATE = """
import asyncio
from types import SimpleNamespace
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.core_client import DPLBAsyncMPClient
from exporters.vllm_eplb_http import EplbService
ENGINE_REPLIES = {ENGINE_REPLIES!r}
client = object.__new__(DPLBAsyncMPClient)  # vLLM's own class and methods, no engines started
client.core_engines = list(ENGINE_REPLIES)
async def _call_utility_async(method, *args, engine):
    assert method == "collective_rpc"
    return ENGINE_REPLIES[engine]
client._call_utility_async = _call_utility_async
engine_client = SimpleNamespace(engine_core=client)
engine_client.collective_rpc = lambda *a, **k: AsyncLLM.collective_rpc(engine_client, *a, **k)
status = asyncio.run(EplbService(engine_client).status())
print("summed", status["expert_tokens"], status["workers"])
"""
DP_SCRIPT = DP_SCRIPT_TEMPLATE.replace("{ENGINE_REPLIES!r}", repr(ENGINE_REPLIES))


@pytest.mark.vllm
def test_vllms_own_data_parallel_client_gives_every_engines_window() -> None:
    python = vllm_python()
    if python is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    done = subprocess.run([str(python), "-c", DP_SCRIPT], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "summed [[100, 100, 100, 100]] 2" in done.stdout
