"""The service-tick benchmark: timed and watched ticks alternate, and the loop's stalls are measured."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.controller_service import ServiceBenchConfig, _watched, report_lines, run_service_bench


@pytest.mark.parametrize("predictive", [False, True])
def test_timed_and_watched_ticks_alternate(predictive: bool) -> None:
    out = run_service_bench(ServiceBenchConfig(policies=3, replicas=9, ticks=4, warmup_ticks=1, predictive=predictive))
    config, stall, results = out["config"], out["loop_stall"], out["results"]
    assert isinstance(config, dict) and isinstance(stall, dict) and isinstance(results, list)
    assert config["core"] == ("predictive" if predictive else "reactive")
    assert results[0]["ticks"] == 4 and stall["ticks"] == 4
    assert 0 <= stall["median_ms"] <= stall["p99_ms"]
    assert out["decisions_logged"] == 3 * (1 + 2 * 4)  # every tick, watched or not, decides and logs
    assert report_lines(out)[-1].startswith("loop stall: median ")


def test_a_tick_that_blocks_the_loop_shows_as_a_stall() -> None:
    async def blocking() -> None:
        await asyncio.sleep(0.002)
        time.sleep(0.05)  # on the loop: nothing else runs meanwhile

    async def in_a_thread() -> None:
        await asyncio.to_thread(time.sleep, 0.05)

    async def both() -> tuple[float, float]:
        return (await _watched(blocking()))[1], (await _watched(in_a_thread()))[1]

    blocked_s, threaded_s = asyncio.run(both())
    assert blocked_s >= 0.045
    assert threaded_s < 0.045
