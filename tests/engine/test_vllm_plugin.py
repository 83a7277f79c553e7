"""The vLLM plugin inside a real vLLM CPU server (``make vllm-venv``), and the controller's source and
rebalancer on it.

Two servers start once for the module, concurrently: the plugin enabled and
disabled, both with multiprocess Prometheus (``PROMETHEUS_MULTIPROC_DIR``),
as a multi-API-server deployment runs.  Requests use token-id prompts (the
checkpoint has no tokenizer).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import re
import shutil
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from contracts.imbalance import balancedness, imbalance_cv
from engine.vllm_plugin import contiguous_rank_weights, rank_loads
from harness.monitoring import prometheus_command
from harness.processes import free_port, start_process, stop_process
from harness.vllm_server import VllmServer, slo_bucket_args, vllm_python
from tests.exporters.otlp_receiver import OtlpReceiver

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.slow]

MODEL = "moeslo-vllm"
LAYERS, EXPERTS, TOP_K, VIRTUAL_RANKS = 4, 32, 4, 8
STARTUP_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, otlp: OtlpReceiver) -> Iterator[dict[str, VllmServer]]:
    if vllm_python() is None:
        pytest.skip("vLLM venv absent: run `make vllm-venv` to build .venv-vllm")
    from engine.checkpoint import init_random_checkpoint
    from engine.config import ModelConfig

    tmp = tmp_path_factory.mktemp("vllm")
    config = ModelConfig(torch_dtype="bfloat16", num_hidden_layers=LAYERS, num_experts=EXPERTS,
                         num_experts_per_tok=TOP_K)
    checkpoint = init_random_checkpoint(tmp / "ckpt", config, seed=0, router_skew=0.5)
    (tmp / "mp-on").mkdir()
    (tmp / "mp-off").mkdir()
    # The enabled server also exports: GenAI histograms (our stat logger) and vLLM's own request spans.
    on = VllmServer(
        checkpoint, model_name=MODEL, log_path=tmp / "on.log",
        extra_args=[*slo_bucket_args(), "--otlp-traces-endpoint", f"{otlp.endpoint}/v1/traces"],
        env={
            "MOESLO_VLLM_PLUGIN": "1", "MOESLO_VLLM_FLUSH_S": "0.25", "MOESLO_VLLM_WINDOW_S": "3600",
            "MOESLO_VLLM_EP_RANKS": str(VIRTUAL_RANKS), "PROMETHEUS_MULTIPROC_DIR": str(tmp / "mp-on"),
            "MOESLO_VLLM_OTEL": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
            "OTEL_METRIC_EXPORT_INTERVAL": "500", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "cumulative", "OTEL_BSP_SCHEDULE_DELAY": "500",
            # The trigger's routes and our EPLB policy (EPLB itself cannot run on vLLM CPU).
            "VLLM_PLUGINS": "moeslo,moeslo_otel,moeslo_ttft,moeslo_eplb,moeslo_eplb_policy",
            "MOESLO_VLLM_EPLB_POLICY": "1",
            "MOESLO_TTFT_ALLOWANCES": "2000:0.1",  # a policy's allowance besides the default one
        },
    )  # fmt: skip
    off = VllmServer(checkpoint, model_name=MODEL, log_path=tmp / "off.log",
                     env={"PROMETHEUS_MULTIPROC_DIR": str(tmp / "mp-off")})
    started: list[VllmServer] = []
    try:
        for server in (on, off):
            server.start()
            started.append(server)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for future in [pool.submit(s.wait_healthy, STARTUP_TIMEOUT_S) for s in started]:
                future.result()
        yield {"on": on, "off": off}
    finally:
        for server in started:
            server.stop()


def complete(base_url: str, prompts: list[list[int]], max_tokens: list[int]) -> list[dict]:
    """Send the requests concurrently (so vLLM batches them); their ``usage`` blocks."""
    def one(prompt: list[int], n: int) -> dict:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": n, "temperature": 0.0, "ignore_eos": True}
        resp = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)
        resp.raise_for_status()
        return dict(resp.json()["usage"])

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts, max_tokens))


def samples(base_url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def expert_matrix(found: dict[str, list[tuple[dict[str, str], float]]]) -> np.ndarray:
    counts = np.zeros((LAYERS, EXPERTS))
    for labels, value in found.get("moe_expert_tokens_total", []):
        assert labels["model_name"] == MODEL and labels["engine"] == "0"
        counts[int(labels["layer"]), int(labels["expert"])] += value
    return counts


def prompts_for(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 4096, size=n).tolist() for n in lengths]


def test_expert_counters_sum_to_routed_tokens_times_top_k(servers: dict[str, VllmServer]) -> None:
    base = servers["on"].base_url
    before = expert_matrix(samples(base))
    usages = complete(base, prompts_for(1, [17, 23, 31, 40, 9, 64]), [6, 7, 8, 9, 5, 4])
    # Every prompt token and every generated token but the last goes through each MoE layer once.
    routed = sum(u["prompt_tokens"] + u["completion_tokens"] - 1 for u in usages)
    deadline = time.monotonic() + 30
    while True:
        delta = expert_matrix(samples(base)) - before
        if (delta.sum(axis=1) == routed * TOP_K).all() or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert delta.sum(axis=1).tolist() == [routed * TOP_K] * LAYERS
    assert (delta >= 0).all() and np.count_nonzero(delta) > TOP_K  # the router spread tokens over experts
    # vLLM's own counters agree: prompt + generated - finished requests.
    found = samples(base)
    vllm_routed = (sum(v for _, v in found["vllm:prompt_tokens_total"])
                   + sum(v for _, v in found["vllm:generation_tokens_total"])
                   - sum(v for _, v in found["vllm:request_success_total"]))
    assert expert_matrix(found).sum(axis=1).tolist() == [vllm_routed * TOP_K] * LAYERS


def test_the_plugins_lines_are_in_vllms_log_in_vllms_format(servers: dict[str, VllmServer]) -> None:
    """vLLM configures only its own logger: the plugin's info line was dropped before it followed it."""
    log_path = servers["on"].log_path
    assert log_path is not None
    lines = [line for line in log_path.read_text(errors="replace").splitlines()
             if f"moeslo: counting routed tokens of {LAYERS} MoE layers" in line]  # fmt: skip
    assert lines, "the plugin's info line is not in vLLM's log"
    assert re.search(r"INFO \d\d-\d\d \d\d:\d\d:\d\d", lines[0]), lines[0]  # vLLM's format: level, date, time


def test_imbalance_gauges_follow_the_virtual_ep_layout(servers: dict[str, VllmServer]) -> None:
    base = servers["on"].base_url
    complete(base, prompts_for(2, [12, 20]), [3, 3])
    time.sleep(1.0)  # a flush
    found = samples(base)
    counts = expert_matrix(found)
    # The window (1 h) covers all traffic, so the gauges are a function of the counters.
    loads = rank_loads(counts, contiguous_rank_weights(EXPERTS, VIRTUAL_RANKS))
    cv = {int(labels["layer"]): v for labels, v in found["moe_layer_imbalance_cv"]}
    bal = {int(labels["layer"]): v for labels, v in found["moe_layer_balancedness"]}
    assert sorted(cv) == sorted(bal) == list(range(LAYERS))
    assert [cv[layer] for layer in range(LAYERS)] == pytest.approx(imbalance_cv(loads).tolist())
    assert [bal[layer] for layer in range(LAYERS)] == pytest.approx(balancedness(loads).tolist())
    assert all(0 < b <= 1 for b in bal.values()) and all(math.isfinite(c) and c > 0 for c in cv.values())
    across = {labels["stat"]: v for labels, v in found["moe_imbalance_cv_across_layers"]}
    assert across["max"] == pytest.approx(max(cv.values()))
    assert across["min"] == pytest.approx(min(cv.values()))
    ranks = sum(v for _, v in found["moe_rank_tokens_total"])
    assert ranks == pytest.approx(counts.sum())


def test_disabled_plugin_adds_nothing_and_enabled_adds_only_moe_families(servers: dict[str, VllmServer]) -> None:
    for server in servers.values():
        complete(server.base_url, prompts_for(3, [10, 11]), [4, 4])
    families, texts = {}, {}
    deadline = time.monotonic() + 10.0  # the workers publish their counts every 0.25 s, not at once
    while "moe_rank_tokens" not in families.get("on", set()) and time.monotonic() < deadline:
        for key, server in servers.items():
            texts[key] = httpx.get(f"{server.base_url}/metrics", timeout=10).text
            families[key] = {f.name for f in text_string_to_metric_families(texts[key])}
        time.sleep(0.25)
    on = {f.name: f for f in text_string_to_metric_families(texts["on"])}
    normalized = on["moeslo_ttft_normalized_seconds"]
    allowances = {(s.labels["reference_prompt_tokens"], s.labels["per_1k_prompt_tokens_s"])
                  for s in normalized.samples if s.name.endswith("_count")}  # fmt: skip
    assert allowances == {("1000", "0.05"), ("2000", "0.1")}
    assert not {name for name in families["off"] if name.startswith("moe_")}
    added = families["on"] - families["off"]
    assert added == {"moe_expert_tokens", "moe_rank_tokens", "moe_layer_imbalance_cv", "moe_layer_balancedness",
                     "moe_layer_imbalance_cv_noise_floor",
                     "moe_imbalance_cv_across_layers", "moe_balancedness_across_layers",
                     "moeslo_ttft_normalized_seconds",  # the length-aware TTFT objective's series
                     "moeslo_requests_without_first_token"}  # its unserved requests, at 0 from the engine's start
    assert families["off"] <= families["on"]


def _policy():  # type: ignore[no-untyped-def]
    from controller.policy import ModelTarget, Policy

    return Policy(name="vllm", target=ModelTarget(model=MODEL))


def _observe_around_traffic(server: VllmServer, seed: int):  # type: ignore[no-untyped-def]
    from controller.sources import ScrapeSource

    async def run():  # type: ignore[no-untyped-def]
        source = ScrapeSource(lambda policy: [server.base_url])
        try:
            await source.observe([_policy()], time.monotonic())  # baseline
            await asyncio.to_thread(complete, server.base_url, prompts_for(seed, [30, 25, 20, 15]), [8, 8, 8, 8])
            return (await source.observe([_policy()], time.monotonic() + 1.0))["vllm"]
        finally:
            await source.aclose()

    return asyncio.run(run())


def test_controller_scrape_source_reads_slis_from_vllm(servers: dict[str, VllmServer]) -> None:
    obs = _observe_around_traffic(servers["on"], seed=4)
    assert obs.errors == ()
    sli = obs.sli
    assert sli is not None
    assert sli.ttft_p99_s is not None and 0 < sli.ttft_p99_s < 60
    assert sli.itl_p99_s is not None and 0 < sli.itl_p99_s < 60
    assert sli.requests_in_window == 4
    assert sli.ttft_good_ratio is not None and 0 <= sli.ttft_good_ratio <= 1
    # --custom-histogram-buckets puts 0.02 s on an ITL edge, so the exact good ratio exists.
    assert sli.itl_good_ratio is not None and 0 <= sli.itl_good_ratio <= 1
    assert len(sli.imbalance_cv_per_layer) == LAYERS
    assert obs.queue_depth == 0 and obs.running_requests == 0
    assert obs.kv_cache_usage is not None and 0 <= obs.kv_cache_usage <= 1
    assert obs.ready_replicas == 1


def _itl_buckets(base_url: str) -> dict[float, float]:
    found = samples(base_url)["vllm:inter_token_latency_seconds_bucket"]
    return {float(labels["le"]): value for labels, value in found}


def test_controller_scrape_source_on_vllm_default_buckets(servers: dict[str, VllmServer]) -> None:
    """vLLM 0.32's own ITL edges skip 0.02 s (0.01, 0.025): the source interpolates inside that bucket."""
    base = servers["off"].base_url
    before = _itl_buckets(base)
    obs = _observe_around_traffic(servers["off"], seed=5)
    after = _itl_buckets(base)
    assert 0.02 not in after and 0.01 in after and 0.025 in after
    delta = {edge: after[edge] - before.get(edge, 0.0) for edge in after}
    expected = (delta[0.01] + (delta[0.025] - delta[0.01]) * (0.02 - 0.01) / (0.025 - 0.01)) / delta[math.inf]
    assert obs.errors == ()
    sli = obs.sli
    assert sli is not None and sli.ttft_p99_s is not None and sli.itl_p99_s is not None
    assert sli.ttft_good_ratio is not None
    assert sli.itl_good_ratio == pytest.approx(expected)
    assert sli.imbalance_cv_per_layer == ()

def _attrs(item) -> dict[str, object]:  # type: ignore[no-untyped-def]
    out: dict[str, object] = {}
    for kv in item.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
    return out


def test_vllm_latencies_reach_otlp_as_genai_histograms_and_spans(servers: dict[str, VllmServer],
                                                                 otlp: OtlpReceiver) -> None:
    base = servers["on"].base_url
    complete(base, prompts_for(6, [14, 22, 30]), [5, 6, 7])
    deadline = time.monotonic() + 30
    while True:
        found = samples(base)
        vllm_count = sum(v for _, v in found["vllm:time_to_first_token_seconds_count"])
        vllm_sum = sum(v for _, v in found["vllm:time_to_first_token_seconds_sum"])
        ours = [p for p in otlp.histogram_points("gen_ai.server.time_to_first_token")
                if _attrs(p).get("gen_ai.request.model") == MODEL]
        duration = [p for p in otlp.histogram_points("gen_ai.server.request.duration")
                    if _attrs(p).get("gen_ai.request.model") == MODEL]
        # Durations are recorded when a request finishes, TTFTs earlier: wait for an export holding both.
        settled = ours and ours[-1].count == vllm_count and duration and duration[-1].count == vllm_count
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert ours, "no gen_ai.server.time_to_first_token points for the model"
    latest = ours[-1]  # cumulative temporality: the last export holds every request so far
    assert latest.count == vllm_count >= 3
    # The same observations as vLLM's own TTFT histogram.
    assert latest.sum == pytest.approx(vllm_sum, rel=1e-6)
    attrs = _attrs(latest)
    assert attrs["gen_ai.provider.name"] == "vllm" and attrs["gen_ai.operation.name"] == "text_completion"
    assert otlp.resource_attributes()["vllm.engine.index"] == "0"  # data-parallel engines export apart
    tpot = otlp.histogram_points("gen_ai.server.time_per_output_token")
    assert tpot and tpot[-1].count > 0 and duration and duration[-1].count == vllm_count
    # vLLM's own tracing (documented, not rewritten): one span per request with gen_ai.* latency attributes.
    spans = [_attrs(s) for s in otlp.spans()]
    traced = [a for a in spans if "gen_ai.latency.time_to_first_token" in a]
    assert len(traced) >= 3
    assert all(a["gen_ai.latency.time_to_first_token"] > 0 and a["gen_ai.usage.prompt_tokens"] > 0 for a in traced)


@pytest.fixture(scope="module")
def prometheus(servers: dict[str, VllmServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus binary absent (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("prometheus")
    config = tmp / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: vllm\n    static_configs: [{{targets: ['127.0.0.1:{servers['on'].port}']}}]\n"
    )
    port = free_port()
    proc = start_process(prometheus_command(binary, tmp, port=port, config=config.read_text()),
                         log_path=tmp / "prometheus.log")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                up = httpx.get(f"{url}/api/v1/query", params={"query": 'up{job="vllm"}'}, timeout=2).json()
                if [r["value"][1] for r in up["data"]["result"]] == ["1"]:
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            assert time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-2000:]
            time.sleep(0.5)
        yield url
    finally:
        stop_process(proc, 30.0)


def test_controller_prometheus_source_reads_slis_from_vllm(servers: dict[str, VllmServer], prometheus: str) -> None:
    from controller.sources import PrometheusClient, PrometheusSource

    time.sleep(2.5)  # scrapes before the traffic
    complete(servers["on"].base_url, prompts_for(7, [30, 25, 20, 15]), [8, 8, 8, 8])
    time.sleep(3.5)  # scrapes after it

    async def observe():  # type: ignore[no-untyped-def]
        source = PrometheusSource(PrometheusClient(prometheus))
        try:
            return (await source.observe([_policy()], time.monotonic()))["vllm"]
        finally:
            await source.aclose()

    obs = asyncio.run(observe())
    assert obs.errors == ()
    sli = obs.sli
    assert sli is not None
    assert sli.ttft_p99_s is not None and 0 < sli.ttft_p99_s < 60
    assert sli.itl_p99_s is not None and 0 < sli.itl_p99_s < 60
    assert sli.ttft_good_ratio is not None and sli.itl_good_ratio is not None
    assert len(sli.imbalance_cv_per_layer) == LAYERS
    assert obs.ready_replicas == 1 and obs.queue_depth == 0
    assert obs.kv_cache_usage is not None


# ---- the rebalance trigger on a real server (one rank, EPLB off: vLLM CPU cannot run EPLB) ----------------


def test_eplb_routes_dry_run_and_refuse_without_eplb(servers: dict[str, VllmServer]) -> None:
    base = servers["on"].base_url
    complete(base, prompts_for(8, [40, 30, 20]), [6, 6, 6])
    status = httpx.get(f"{base}/moeslo/eplb", timeout=60).json()
    assert status["eplb"] is None and status["policy"] == "MoesloEplbPolicy"  # registered in the worker
    assert status["placement_source"] == "virtual" and status["num_ranks"] == VIRTUAL_RANKS
    assert status["counting_workers"] == 1 and np.asarray(status["expert_tokens"]).shape == (LAYERS, EXPERTS)
    dry = httpx.post(f"{base}/moeslo/eplb/rebalance", json={"dry_run": True}, timeout=60)
    assert dry.status_code == 200, dry.text
    plan = dry.json()
    assert plan["dry_run"] is True and plan["eplb"] is False and plan["plan_source"] == "MoesloEplbPolicy"
    assert np.asarray(plan["phy2log"]).shape == (LAYERS, EXPERTS)
    assert plan["predicted_after"]["cv_max"] <= plan["predicted_before"]["cv_max"]
    refused = httpx.post(f"{base}/moeslo/eplb/rebalance", json={}, timeout=60)
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["reason"] == "eplb_off" and "--enable-eplb" in error["message"]
    bad = httpx.post(f"{base}/moeslo/eplb/rebalance", json={"dry_run": "yes", "when": "soon"}, timeout=60)
    assert bad.status_code == 400 and len(bad.json()["error"]["problems"]) == 2
    deadline = time.monotonic() + 10
    while True:  # the worker publishes every flush (multiprocess Prometheus here)
        found = {(lab["action"], lab["outcome"]): v for lab, v in samples(base).get("moe_placement_requests_total", [])}
        if found.get(("apply", "refused")) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert found[("plan", "ok")] >= 1 and found[("apply", "refused")] >= 1


def test_controller_rebalancer_drives_vllm_and_logs_the_refusal(servers: dict[str, VllmServer]) -> None:
    from controller.actuators.placement import Rebalancer
    from controller.actuators.vllm_control import AutoEngineControl
    from controller.policy import ImbalanceObjective, Mode, ModelTarget, Objectives, Policy
    from controller.rebalance import TriggerSettings

    base = servers["on"].base_url
    complete(base, prompts_for(9, [40, 30, 20]), [6, 6, 6])
    objective = ImbalanceObjective(max_cv=0.001, sustain_s=0)  # any imbalance triggers
    policies = {mode: Policy(name=f"vllm-{mode}", target=ModelTarget(model=MODEL), mode=mode,
                             objectives=Objectives(imbalance=objective)) for mode in (Mode.ADVISORY, Mode.ENFORCE)}

    async def tick() -> list:  # type: ignore[type-arg]
        control = AutoEngineControl(timeout_s=60)
        rebalancer = Rebalancer(control, TriggerSettings(cooldown_s=600, margin=0.0), min_window_steps=1)
        try:
            return [e for p in policies.values() for e in await rebalancer.tick(p, [base], time.monotonic())]
        finally:
            assert control.kind(base) == "vllm"
            await control.aclose()

    advisory, failed = asyncio.run(tick())
    assert (advisory.kind, advisory.outcome) == ("rebalance", "advisory")
    assert advisory.plan["imbalance_after_cv"] <= advisory.plan["imbalance_before_cv"]
    assert (failed.kind, failed.outcome) == ("rebalance", "failed")
    assert "HTTP 409: eplb_off: EPLB is off" in failed.error
