"""The direct-scrape source over hours of history: windows that reach into the thinned points older than an
hour, where only the bucket edges the policies used then were kept."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from contracts.histograms import histogram_quantile
from controller.policy import Policy
from controller.sources import ScrapeSource

MODEL = "m"
INF = float("inf")
EDGES = (0.1, 0.25, 0.4, 0.5, 1.0, INF)
MINUTE_S = 60


def _policy(ttft_s: float) -> Policy:
    objectives = {"ttft": {"threshold_s": ttft_s, "target": 0.99}, "itl": {"threshold_s": 0.02, "target": 0.99}}
    target = {"kind": "local", "model": MODEL, "endpoints": ["http://e1:8000"]}
    return Policy.model_validate({"name": "p", "window": "30d", "objectives": objectives, "target": target})


def _histogram(name: str, cumulative: dict[float, float]) -> str:
    labels = f'model_name="{MODEL}",engine="0"'
    lines = [f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{{labels},le="{"+Inf" if e == INF else repr(e)}"}} {c}' for e, c in cumulative.items()]
    lines += [f"{name}_count{{{labels}}} {cumulative[INF]}", f"{name}_sum{{{labels}}} 0"]
    return "\n".join(lines)


def _page(requests: float, slow_share: float = 0.0) -> str:
    """``requests`` served so far, ``slow_share`` of them at 0.45 s and the rest at 0.2 s."""
    fast = requests * (1 - slow_share)
    ttft = {e: (0.0 if e < 0.2 else fast if e < 0.45 else requests) for e in EDGES}
    itl = {0.02: requests, INF: requests}
    return "\n".join([_histogram("vllm:time_to_first_token_seconds", ttft),
                      _histogram("vllm:inter_token_latency_seconds", itl), ""])  # fmt: skip


class _Engine:
    def __init__(self) -> None:
        self.text = ""

    def handle(self, _request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=self.text)


def _source(engine: _Engine, **settings: float) -> ScrapeSource:
    client = httpx.AsyncClient(transport=httpx.MockTransport(engine.handle))
    return ScrapeSource(lambda p: p.target.endpoints, client=client, **settings)  # type: ignore[union-attr]


def test_a_threshold_edited_after_an_hour_leaves_the_windows_its_edge_does_not_cover_unknown() -> None:
    """Older points kept only the old threshold's edge: the new edge's increase covered the last hour while the
    count's covered the whole window, and every request good read as a good ratio of about a half."""
    engine = _Engine()
    source = _source(engine)

    async def scenario() -> None:
        served = 0
        for at_s in range(0, 2 * 3600 + 1, MINUTE_S):  # two hours at threshold 0.5 s, 10 requests a minute
            engine.text = _page(served)
            await source.observe([_policy(0.5)], float(at_s))
            served += 10
        engine.text = _page(served)
        edited = (await source.observe([_policy(0.4)], float(at_s + MINUTE_S)))["p"]  # the threshold: 0.5 -> 0.4
        assert edited.sli is not None
        ratios = edited.sli.ttft_good_ratio_by_window
        for window in ("5m", "30m"):
            assert ratios[window] == pytest.approx(1.0)
        for window in ("2h", "6h", "1d", "3d", "30d"):
            assert window not in ratios  # unknown, never a ratio over mismatched spans
        await source.aclose()

    asyncio.run(scenario())


def test_an_sli_window_longer_than_an_hour_reads_every_bucket_over_the_whole_window() -> None:
    """Beyond an hour only the threshold's edges were kept: the other buckets covered the last hour and the
    kept ones the whole window, so the p99 was read from buckets that were not cumulative."""
    engine = _Engine()
    source = _source(engine, sli_window_s=7200.0)

    async def scenario() -> None:
        served = 0
        for at_s in range(0, 3 * 3600 + 1, MINUTE_S):  # 100 requests a minute, 2 % of them at 0.45 s
            engine.text = _page(served, slow_share=0.02)
            observed = (await source.observe([_policy(0.5)], float(at_s)))["p"]
            served += 100
        assert observed.sli is not None
        steady = histogram_quantile(0.99, {0.1: 0, 0.25: 0.98, 0.4: 0.98, 0.5: 1, 1.0: 1, INF: 1})
        assert observed.sli.ttft_p99_s == pytest.approx(steady)
        await source.aclose()

    asyncio.run(scenario())
