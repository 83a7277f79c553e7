"""The Prometheus source: PromQL against a real Prometheus scraping a /metrics page on loopback,
plus its fault handling (down, erroring, recovering)."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from contracts.catalogue import KV_CACHE_USAGE, LAYER_IMBALANCE_CV, RUNNING, WAITING
from contracts.errors import UnavailableError
from controller.policy import Policy
from controller.sources import PrometheusClient, PrometheusSource
from controller.types import PolicyObservation
from harness.monitoring import prometheus_command
from harness.processes import free_port, start_process, stop_process, wait_healthy
from tests.controller.sources.engine_page import EngineMetrics, MetricsServer, RouterPage, TrickleServer

MODEL = "Qwen/Qwen3-30B-A3B"
POLICY = Policy.model_validate({"name": "p", "target": {"kind": "model", "model": MODEL}})
SCRAPE_S = 1


def _mock_source(handler: httpx.MockTransport) -> PrometheusSource:
    client = httpx.AsyncClient(transport=handler)
    return PrometheusSource(PrometheusClient("http://prom.invalid", client=client))


def _vector(value: float, **labels: str) -> dict:
    return {"metric": {"model_name": MODEL, **labels}, "value": [0, str(value)]}


def test_queries_are_grouped_by_model_and_carry_the_selector() -> None:
    source = PrometheusSource(PrometheusClient("http://prom.invalid"), selector='namespace="prod"')
    queries = source.queries([POLICY, POLICY.model_copy(update={"name": "q"})])
    count = 'sum by (model_name) (increase(vllm:time_to_first_token_seconds_count{model_name="Qwen/Qwen3-30B-A3B",' \
        'namespace="prod"}[1h]))'
    # The TTFT events: the histogram's count and the requests the engines ended before a first token, as the rules.
    unserved = ('sum by (model_name) (increase(moeslo_requests_without_first_token_total{model_name='
                '"Qwen/Qwen3-30B-A3B",finished_reason=~"deadline|error",namespace="prod"}[1h]))')
    assert (
        f'label_replace({count}\n+ ({unserved} or 0 * {count}), "moeslo_window", "1h", "", "")'
    ) in queries["ttft:total"]
    windows = re.findall(r'"moeslo_window", "(\w+)"', queries["itl:good"])
    assert windows == ["5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d"]
    assert queries["itl:good"].count(" or ") == len(windows) - 1
    assert queries["ttft:p99"].startswith("histogram_quantile(0.99, sum by (model_name, le) (rate(")
    asyncio.run(source.aclose())


def test_rates_are_taken_over_the_configured_window() -> None:
    default = PrometheusSource(PrometheusClient("http://prom.invalid"))
    short = PrometheusSource(PrometheusClient("http://prom.invalid"), rate_window_s=10)
    for key in ("requests", "prompt_tokens", "output_tokens"):
        assert default.queries([POLICY])[key].endswith("[1m]))")
        assert short.queries([POLICY])[key].endswith("[10s]))")
    assert short.queries([POLICY])["ttft:p99"] == default.queries([POLICY])["ttft:p99"]  # SLI windows unchanged
    # The peak: rates over about 30 s of samples at 15 s and 30 s scrapes, every 5 s of the SLI window.
    peak = 'max_over_time(sum by (model_name) (rate(vllm:request_success_total{model_name="Qwen/Qwen3-30B-A3B"}[45s]))'
    assert default.queries([POLICY])["requests_peak"] == f"{peak}[5m:5s])"
    with pytest.raises(ValueError, match="whole number of seconds"):
        PrometheusSource(PrometheusClient("http://prom.invalid"), rate_window_s=2.5)
    for source in (default, short):
        asyncio.run(source.aclose())


def test_the_sli_window_is_taken_from_the_settings_beside_the_burn_windows() -> None:
    source = PrometheusSource(PrometheusClient("http://prom.invalid"), sli_window_s=30)
    queries = source.queries([POLICY])
    assert "[30s]" in queries["ttft:p99"] and "[30s]" in queries["prompt_lengths"]
    for slo in ("ttft", "itl"):
        assert "[30s]" in queries[f"{slo}:good"] and "[5m]" in queries[f"{slo}:good"]  # the burn windows stay
    default = PrometheusSource(PrometheusClient("http://prom.invalid"))
    assert "[5m]" in default.queries([POLICY])["ttft:p99"] and "[30s]" not in default.queries([POLICY])["itl:good"]
    for one in (source, default):
        asyncio.run(one.aclose())


def test_prometheus_errors_hold_the_last_good_values_and_recover() -> None:
    state = {"mode": "ok"}

    def handle(request: httpx.Request) -> httpx.Response:
        if state["mode"] == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if state["mode"] == "error":
            return httpx.Response(422, json={"status": "error", "errorType": "bad_data", "error": "parse error"})
        query = request.content.decode()
        if "waiting" in query:
            return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector",
                                                                          "result": [_vector(7)]}})
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    source = _mock_source(httpx.MockTransport(handle))
    good = asyncio.run(source.observe([POLICY], 10.0))["p"]
    assert good.errors == () and good.queue_depth == 7 and good.observed_at_s == 10.0
    state["mode"] = "down"
    held = asyncio.run(source.observe([POLICY], 20.0))["p"]
    assert held.queue_depth == 7 and held.observed_at_s == 10.0  # ages into stale_data in the core
    assert held.errors and "prometheus unavailable" in held.errors[0] and "ConnectError" in held.errors[0]
    state["mode"] = "error"
    erroring = asyncio.run(source.observe([POLICY], 30.0))["p"]
    assert "HTTP 422 bad_data: parse error" in erroring.errors[0]
    state["mode"] = "ok"
    recovered = asyncio.run(source.observe([POLICY], 40.0))["p"]
    assert recovered.errors == () and recovered.observed_at_s == 40.0


def test_never_seen_prometheus_down_reports_nothing_known() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    obs = asyncio.run(_mock_source(httpx.MockTransport(handle)).observe([POLICY], 5.0))["p"]
    assert obs.queue_depth is None and obs.sli is None and obs.errors


SECRET_URL = "http://moeslo:s3cr3t@127.0.0.1:9"
"""A user:password that httpx sends as basic auth (port 9: nothing listens, the connection is refused)."""


@pytest.mark.parametrize("answer", [None, httpx.Response(502, text="bad gateway"), httpx.Response(200, json=[1]),
                                    httpx.Response(503, json={"status": "error", "error": "down"})])
def test_no_error_repeats_the_urls_password(answer: httpx.Response | None) -> None:
    """The errors reach /v1/status, the status page and the log: the URL is named, its password never."""
    client = None if answer is None else httpx.AsyncClient(transport=httpx.MockTransport(lambda _r: answer))
    source = PrometheusSource(PrometheusClient(SECRET_URL, timeout_s=2.0, client=client))
    errors = asyncio.run(source.observe([POLICY], 5.0))["p"].errors
    asyncio.run(source.aclose())
    assert errors and all("s3cr3t" not in e and "moeslo:" not in e and "***@127.0.0.1:9" in e for e in errors)


ROUTED = Policy.model_validate({"name": "routed", "target": {"kind": "model", "model": MODEL}, "router": {}})


def test_a_policy_naming_its_router_queries_the_router_queue_by_its_labels() -> None:
    source = PrometheusSource(PrometheusClient("http://prom.invalid"), selector='namespace="prod"')
    other = ROUTED.model_copy(update={"name": "other"})  # the same router: one query for both
    own = Policy.model_validate({"name": "own", "target": {"kind": "model", "model": MODEL},
                                 "router": {"prometheus_labels": {"service": 'a"b', "job": "r"}}})  # fmt: skip
    queries = source.queries([POLICY, ROUTED, other, own])
    router_queries = sorted(q for k, q in queries.items() if k.startswith("router_queued:"))
    assert router_queries == [
        'sum(moeslo_router_queued_requests{job="moeslo-router",namespace="prod"})',
        'sum(moeslo_router_queued_requests{job="r",service="a\\"b",namespace="prod"})',
    ]
    assert not any(k.startswith("router_queued:") for k in source.queries([POLICY]))
    refused = sorted(q for k, q in queries.items() if k.startswith("router_refused:"))
    assert refused == [
        'sum(rate(moeslo_router_requests_total{job="moeslo-router",outcome="rejected",namespace="prod"}[1m]))',
        'sum(rate(moeslo_router_requests_total{job="r",service="a\\"b",outcome="rejected",namespace="prod"}[1m]))',
    ]
    asyncio.run(source.aclose())


def test_the_router_queue_from_prometheus_and_a_router_it_does_not_see() -> None:
    answer: dict[str, list[dict]] = {"router": [{"metric": {}, "value": [0, "4"]}], "refused": []}

    def handle(request: httpx.Request) -> httpx.Response:
        query = request.content.decode()
        result = (answer["router"] if "moeslo_router_queued_requests" in query
                  else answer["refused"] if "moeslo_router_requests_total" in query else [])  # fmt: skip
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    source = _mock_source(httpx.MockTransport(handle))
    seen = asyncio.run(source.observe([POLICY, ROUTED], 10.0))
    assert seen["routed"].router_queued == 4.0 and seen["routed"].errors == ()
    # No rejected series yet: the router was read and has refused nothing.
    assert seen["routed"].router_refused_rps == 0.0
    assert seen["p"].router_queued is None and seen["p"].router_refused_rps is None
    answer["refused"] = [{"metric": {}, "value": [0, "2.5"]}]
    assert asyncio.run(source.observe([ROUTED], 15.0))["routed"].router_refused_rps == 2.5
    answer["router"] = []  # no series: the router is down or not scraped, which is not a zero
    unseen = asyncio.run(source.observe([ROUTED], 20.0))["routed"]
    assert unseen.router_queued is None and unseen.router_refused_rps is None
    assert unseen.errors == ("router: no moeslo_router_queued_requests series with labels {'job': 'moeslo-router'}",)


def _answer_per_query(answers: dict[str, object]) -> httpx.MockTransport:
    """Each query answered with the answer of the first metric name it names (an empty vector for the rest)."""
    def handle(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        empty = {"status": "success", "data": {"resultType": "vector", "result": []}}
        return httpx.Response(200, json=next((a for name, a in answers.items() if name in query), empty))

    return httpx.MockTransport(handle)


def _success(result: object, kind: str = "vector") -> dict[str, object]:
    return {"status": "success", "data": {"resultType": kind, "result": result}}


@pytest.mark.parametrize(
    "answer",
    [[1, 2], {"status": "success", "data": "x"}, _success("x"), _success({"x": 1}), _success([{"metric": {}}]),
     _success([_vector(1) | {"value": [0, "abc"]}]), _success([_vector(1) | {"value": [0, None]}]),
     _success([_vector(1) | {"value": 3}]), _success([{"metric": ["model_name"], "value": [0, "1"]}]),
     _success([{"metric": {"model_name": MODEL, "layer": 3}, "value": [0, "0.5"]}])],
)  # fmt: skip
def test_an_answer_of_the_wrong_shape_is_that_query_unavailable_and_the_rest_stands(answer: object) -> None:
    """Valid JSON but not a vector of samples: it raised out of observe (a TypeError, a KeyError...) and the whole
    tick failed; now that query is unavailable, like a Prometheus error, and every other value still comes in."""
    source = _mock_source(_answer_per_query({KV_CACHE_USAGE: answer, LAYER_IMBALANCE_CV: answer,
                                             WAITING: _success([_vector(7)])}))  # fmt: skip
    obs = asyncio.run(source.observe([POLICY], 10.0))["p"]
    assert obs.queue_depth == 7 and obs.kv_cache_usage is None and obs.sli is not None
    kv, imbalance = (next(e for e in obs.errors if e.startswith(f"{key}: ")) for key in ("kv", "imbalance"))
    assert kv.startswith("kv: prometheus http://prom.invalid") and "malformed answer" in kv
    assert "malformed answer" in imbalance


def test_a_sample_of_nan_or_a_layer_not_a_number_is_left_out() -> None:
    layers = [{"metric": {"model_name": MODEL, "layer": layer}, "value": [0, value]}
              for layer, value in (("0", "0.3"), ("\u00b2", "0.9"), ("1", "NaN"))]  # "²".isdigit(), but not int()
    source = _mock_source(_answer_per_query({LAYER_IMBALANCE_CV: _success(layers), WAITING: _success([_vector(7)]),
                                             KV_CACHE_USAGE: _success([_vector(float("nan"))])}))  # fmt: skip
    obs = asyncio.run(source.observe([POLICY], 10.0))["p"]
    assert obs.errors == () and obs.queue_depth == 7 and obs.kv_cache_usage is None
    assert obs.sli is not None and obs.sli.imbalance_cv_per_layer == (0.3,)


@pytest.mark.parametrize("values", [[[0, "abc"]], [["t", "1"]], "x", [[0]]])
def test_a_range_answer_of_the_wrong_shape_is_unavailable(values: object) -> None:
    transport = _answer_per_query({"up": _success([{"metric": {}, "values": values}], kind="matrix")})
    client = PrometheusClient("http://prom.invalid", client=httpx.AsyncClient(transport=transport))
    with pytest.raises(UnavailableError, match=r"^prometheus http://prom.invalid: malformed answer \("):
        asyncio.run(client.query_range("up", start_s=0, end_s=60, step_s=15))


def test_a_prometheus_that_trickles_its_answer_is_unavailable_within_the_timeout() -> None:
    """A byte every 0.2 s never trips httpx's per-read timeout; the whole query is bounded (the tick awaits it)."""
    slow = TrickleServer()
    client = PrometheusClient(slow.url, timeout_s=0.5)

    async def query() -> None:
        try:
            await asyncio.wait_for(client.query("up"), 5.0)
        finally:
            await client.aclose()

    try:
        with pytest.raises(UnavailableError, match=rf"^prometheus {slow.url}: no complete answer within 0.5 s$"):
            asyncio.run(query())
    finally:
        slow.stop()


# ---- a real Prometheus ------------------------------------------------------------------------


class Prometheus:
    def __init__(self, target: str | list[str], tmp: Path, *, router: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        engines = [target] if isinstance(target, str) else target
        jobs = {"engine": engines} | ({"moeslo-router": [router]} if router is not None else {})
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\nscrape_configs:\n"
            + "".join(f"  - job_name: {job}\n    static_configs:\n      - targets: {urls!r}\n"
                      for job, urls in jobs.items())
        )
        self.argv = prometheus_command(shutil.which("prometheus") or "prometheus", tmp, port=self.port,
                                       config=config.read_text())
        self.log_path = tmp / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = start_process(self.argv, log_path=self.log_path)
        wait_healthy(f"{self.url}/-/ready", self.process, 30.0, name="prometheus", log_path=self.log_path,
                     interval_s=0.2)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, 20.0)
            self.process = None

    def wait_for_scrapes(self, count: int) -> None:
        """Wait until ``count`` more scrapes of the engine have landed."""
        def samples() -> int:
            body = httpx.post(f"{self.url}/api/v1/query",
                              data={"query": "count_over_time(up[1h])"}, timeout=2).json()
            result = body["data"]["result"]
            return int(float(result[0]["value"][1])) if result else 0

        start = samples()
        deadline = time.monotonic() + 30
        while samples() < start + count:
            assert time.monotonic() < deadline, "prometheus did not scrape in time"
            time.sleep(0.2)


@contextmanager
def prometheus_scraping(page: Any, tmp_path: Path) -> Iterator[Prometheus]:
    """A real Prometheus scraping ``page`` (anything with ``render()``) served on loopback; skips without one."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus binary not installed (apt-get install prometheus)")
    server = MetricsServer(page)
    prom = Prometheus(server.url.removeprefix("http://"), tmp_path)
    try:
        prom.start()
        yield prom
    finally:
        prom.stop()
        server.stop()


@pytest.fixture()
def prometheus_and_engine(tmp_path: Path) -> Iterator[tuple[Prometheus, EngineMetrics]]:
    engine = EngineMetrics(MODEL, stock_vllm_itl=True)
    with prometheus_scraping(engine, tmp_path) as prom:
        yield prom, engine


@pytest.mark.integration
def test_slis_from_a_real_prometheus(prometheus_and_engine: tuple[Prometheus, EngineMetrics]) -> None:
    prom, engine = prometheus_and_engine
    prom.wait_for_scrapes(2)  # baseline at zero
    engine.requests([0.1] * 180 + [0.9] * 20, [0.005] * 60 + [0.03] * 40)
    engine.waiting.set(6)
    engine.kv.set(0.4)
    engine.set_imbalance([0.08, 0.31])
    engine.prefills([3_000] * 100 + [1_000] * 100, [0.15] * 100 + [0.05] * 100)
    prom.wait_for_scrapes(2)
    time.sleep(5.0)  # the peak rate's subquery steps are 5 s apart, aligned to the epoch: one after the burst
    source = PrometheusSource(PrometheusClient(prom.url))

    async def scenario() -> None:
        obs = (await source.observe([POLICY], 100.0))["p"]
        assert obs.errors == ()
        assert obs.sli is not None
        assert obs.sli.ttft_good_ratio == pytest.approx(0.9, abs=1e-9)
        assert obs.sli.ttft_good_ratio_by_window["3d"] == pytest.approx(0.9, abs=1e-9)
        # Stock vLLM ITL buckets (no 0.02 edge): 60 at <= 0.01, 40 in (0.025, 0.05]: 0.6 at 0.02.
        assert obs.sli.itl_good_ratio == pytest.approx(0.6, abs=1e-9)
        # 100 token gaps against 200 requests over the same window (the ITL burn is judged over the gaps).
        assert obs.sli.itl_events_in_window is not None and obs.sli.requests_in_window is not None
        assert obs.sli.itl_events_in_window / obs.sli.requests_in_window == pytest.approx(0.5, rel=1e-6)
        assert obs.sli.ttft_p99_s is not None and 0.75 < obs.sli.ttft_p99_s <= 1.0
        assert obs.queue_depth == 6 and obs.kv_cache_usage == 0.4 and obs.ready_replicas == 1
        # The 200 requests landed between two scrapes: the peak's 45 s range holds all of them (at these 1 s
        # scrapes its samples span the whole range), a rate at least 200 / 45; the minute's is lower.
        assert obs.request_rate_peak_rps is not None and obs.request_rate_rps is not None
        assert obs.request_rate_peak_rps >= 200 / 45 - 1e-9
        assert obs.request_rate_peak_rps > obs.request_rate_rps
        assert obs.sli.imbalance_cv_per_layer == (0.08, 0.31)
        # 400,000 prompt tokens over 20 s of prefill (both sums scraped together: the same extrapolation).
        assert obs.prefill_tokens_per_s == pytest.approx(20_000, rel=1e-6)
        # Prometheus goes down: the last good values are held with the error; it comes back: recovered.
        prom.stop()
        down = (await source.observe([POLICY], 110.0))["p"]
        assert down.errors and down.observed_at_s == 100.0 and down.queue_depth == 6
        prom.start()
        back = (await source.observe([POLICY], 120.0))["p"]
        assert back.errors == () and back.observed_at_s == 120.0 and back.queue_depth == 6
        await source.aclose()

    asyncio.run(scenario())


@pytest.mark.integration
def test_requests_without_a_first_token_are_bad_ttft_events_through_a_real_prometheus(
    prometheus_and_engine: tuple[Prometheus, EngineMetrics],
) -> None:
    prom, engine = prometheus_and_engine
    for reason in ("deadline", "error", "abort"):
        engine.ended_before_first_token(0, reason)  # the series exist at zero before the load
    prom.wait_for_scrapes(2)
    engine.requests([0.1] * 90)
    engine.ended_before_first_token(6, "deadline")
    engine.ended_before_first_token(4, "error")
    engine.ended_before_first_token(20, "abort")  # a client's abort is not the engine's failure
    prom.wait_for_scrapes(2)
    source = PrometheusSource(PrometheusClient(prom.url))

    async def scenario() -> None:
        obs = (await source.observe([POLICY], 100.0))["p"]
        assert obs.errors == () and obs.sli is not None
        # The same events as the generated rules' total: 90 good of 100.
        assert obs.sli.ttft_good_ratio == pytest.approx(0.9, abs=1e-9)
        assert obs.sli.ttft_good_ratio_by_window["3d"] == pytest.approx(0.9, abs=1e-9)
        await source.aclose()

    asyncio.run(scenario())


@pytest.mark.integration
def test_the_router_queue_through_a_real_prometheus(tmp_path: Path) -> None:
    """deploy/ and ``moeslo up`` scrape the router as job moeslo-router: the default router labels find it."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus binary not installed (apt-get install prometheus)")
    engine, router = MetricsServer(EngineMetrics(MODEL)), RouterPage()
    router_server = MetricsServer(router)  # type: ignore[arg-type]
    router.hold(5)
    prom = Prometheus(engine.url.removeprefix("http://"), tmp_path, router=router_server.url.removeprefix("http://"))

    async def observe() -> PolicyObservation:
        source = PrometheusSource(PrometheusClient(prom.url))
        try:
            return (await source.observe([ROUTED], 100.0))["routed"]
        finally:
            await source.aclose()

    try:
        prom.start()
        prom.wait_for_scrapes(2)
        obs = asyncio.run(observe())
        assert obs.router_queued == 5.0 and obs.queue_depth == 0 and obs.errors == ()
        assert obs.router_refused_rps == 0.0  # nothing refused yet: no rejected series, read as zero
        router.refuse(1)  # the rejected series is born here; rate() counts increases after its first sample
        prom.wait_for_scrapes(2)
        router.refuse(40)
        prom.wait_for_scrapes(2)
        refusing = asyncio.run(observe())
        assert refusing.router_refused_rps is not None and refusing.router_refused_rps > 0
    finally:
        prom.stop()
        engine.stop()
        router_server.stop()


class DataParallelPage:
    """One vLLM server's page with data parallelism: one series per engine (engine="0".."N-1")."""

    def __init__(self, engines: int) -> None:
        self.registry = CollectorRegistry()
        running = Gauge(RUNNING, "running", ["model_name", "engine"], registry=self.registry)
        for engine in range(engines):
            running.labels(model_name=MODEL, engine=str(engine)).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)


@pytest.mark.integration
def test_a_data_parallel_server_is_one_replica_not_one_per_engine(tmp_path: Path) -> None:
    """A replica is a scrape target: a server running four data-parallel engines read as four replicas."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus binary not installed (apt-get install prometheus)")
    servers = [MetricsServer(DataParallelPage(4)) for _ in range(2)]  # type: ignore[arg-type]
    prom = Prometheus([server.url.removeprefix("http://") for server in servers], tmp_path)

    async def observe() -> PolicyObservation:
        source = PrometheusSource(PrometheusClient(prom.url))
        try:
            return (await source.observe([POLICY], 100.0))["p"]
        finally:
            await source.aclose()

    try:
        prom.start()
        prom.wait_for_scrapes(2)
        obs = asyncio.run(observe())
        assert obs.ready_replicas == 2 and obs.running_requests == 8
    finally:
        prom.stop()
        for server in servers:
            server.stop()
