"""The HTTP API against the real executor on uvicorn (127.0.0.1), driven by a real HTTP client."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from contracts.placement import Placement
from engine.client import EngineCoreClient
from engine.server import ServerThread
from exporters.app import ServeOptions, build_stack
from harness.processes import free_port

pytestmark = pytest.mark.integration

MODEL = "tiny-moe"


@dataclass
class Served:
    url: str
    engine: EngineCoreClient
    client: httpx.Client


def serve(checkpoint: Path, **overrides: object) -> tuple[ServerThread, EngineCoreClient]:
    port = free_port()
    options = ServeOptions(checkpoint=checkpoint, model_name=MODEL, kv_cache_mb=1.0, port=port,
                           **overrides)  # type: ignore[arg-type]
    stack = build_stack(options)
    return ServerThread(stack.app, port=port).start(), stack.engine


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path) -> Iterator[Served]:
    server, engine = serve(tiny_checkpoint, max_waiting=8)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield Served(server.url, engine, client)
    server.stop()
    assert not engine.is_alive


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    want = {"model_name": MODEL, "engine": "0", **labels}
    key = (name, tuple(sorted(want.items())))
    return samples.get(key, 0.0)


def stream_completion(client: httpx.Client, payload: dict[str, object]) -> tuple[float, list[float], list[dict]]:
    """(client TTFT, client inter-event gaps, events) of one streamed completion."""
    start = time.monotonic()
    times, events = [], []
    with client.stream("POST", "/v1/completions", json={**payload, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            times.append(time.monotonic())
            events.append(json.loads(data))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return times[0] - start, gaps, events


def test_streaming_ttft_and_itl_in_metrics_agree_with_the_client(served: Served) -> None:
    before = metric_samples(served.client.get("/metrics").text)
    client_ttfts, client_gaps, n_tokens = [], [], 0
    for i in range(4):
        ttft, gaps, events = stream_completion(
            served.client, {"model": MODEL, "prompt": f"hello moe {i} " * 8, "max_tokens": 12, "temperature": 0}
        )
        assert len(events) == 12
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
        client_ttfts.append(ttft)
        client_gaps.extend(gaps)
        n_tokens += len(events)
    after = metric_samples(served.client.get("/metrics").text)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("vllm:time_to_first_token_seconds_count") == 4
    assert delta("vllm:inter_token_latency_seconds_count") == 4 * 11
    assert delta("vllm:generation_tokens_total") == n_tokens
    assert delta("vllm:request_success_total", finished_reason="length") == 4
    # Tolerance: the engine stamps tokens before the HTTP layer sends them, so its TTFT is at most
    # the client's, and no more than 200 ms below it on average (HTTP parsing, JSON and the thread
    # hand-off, on 2 shared cores).
    engine_ttft_mean = delta("vllm:time_to_first_token_seconds_sum") / 4
    client_ttft_mean = sum(client_ttfts) / 4
    assert engine_ttft_mean <= client_ttft_mean + 0.002
    assert client_ttft_mean - engine_ttft_mean < 0.2
    # ITL: the mean gap between SSE events equals the engine's mean ITL within 10 ms (both sides see
    # the same steps; only the delivery jitter differs).
    engine_itl_mean = delta("vllm:inter_token_latency_seconds_sum") / (4 * 11)
    client_itl_mean = sum(client_gaps) / len(client_gaps)
    assert abs(engine_itl_mean - client_itl_mean) < 0.01
    # Cumulative buckets: the le="+Inf" bucket counts every observation.
    assert delta("vllm:time_to_first_token_seconds_bucket", le="+Inf") == 4
    assert value(after, "vllm:inter_token_latency_seconds_bucket", le="0.02") >= 0  # the SLO edge exists
    assert ("vllm:inter_token_latency_seconds_bucket",
            tuple(sorted({"model_name": MODEL, "engine": "0", "le": "0.02"}.items()))) in after


def test_non_streaming_completion_with_token_ids_and_seeded_sampling(served: Served) -> None:
    payload = {"prompt": [1, 2, 3, 4, 5], "max_tokens": 7, "temperature": 0.8, "seed": 42}
    first = served.client.post("/v1/completions", json=payload)
    second = served.client.post("/v1/completions", json=payload)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["text"] == second.json()["choices"][0]["text"]


def test_models_health_and_metrics_routes(served: Served) -> None:
    models = served.client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] > 0
    assert served.client.get("/health").json() == {"status": "ok"}
    served.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    text = served.client.get("/metrics").text
    samples = metric_samples(text)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert (name, (("engine", "0"), ("model_name", MODEL))) in samples
    # 2 MoE layers x 8 experts: per-(layer, expert) counters are on, and each layer sums to tokens x top-k.
    per_layer: dict[str, float] = {}
    for (name, labels), v in samples.items():
        if name == "moe_expert_tokens_total":
            layer = dict(labels)["layer"]
            per_layer[layer] = per_layer.get(layer, 0.0) + v
    assert sorted(per_layer) == ["0", "1"]
    tokens = value(samples, "vllm:prompt_tokens_total") + value(samples, "vllm:generation_tokens_total")
    assert per_layer["0"] == per_layer["1"] > 0
    assert per_layer["0"] <= 2 * tokens
    assert "moe_layer_imbalance_cv" in text and "moe_balancedness_across_layers" in text


def test_prompt_tokens_count_whole_prompts_with_prefix_cache_hits(served: Served) -> None:
    """``vllm:prompt_tokens_total`` counts each prompt whole, its cached prefix included, as vLLM's does."""
    before = metric_samples(served.client.get("/metrics").text)
    shared = [(11 * i) % 500 + 1 for i in range(48)]
    prompts = [[*shared, 7 + i, 9 + i] for i in range(3)]
    usage = [served.client.post("/v1/completions", json={"prompt": p, "max_tokens": 2}).json()["usage"]
             for p in prompts]
    after = metric_samples(served.client.get("/metrics").text)

    def delta(name: str) -> float:
        return value(after, name) - value(before, name)

    assert delta("vllm:prefix_cache_hits_total") > 0
    assert delta("vllm:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usage) == 3 * 50


def test_the_most_generated_tokens_are_observed_once_per_request_of_n_choices(served: Served) -> None:
    """``n=3``: three requests in the core, one observation of the most tokens a choice generated (vLLM's)."""
    before = metric_samples(served.client.get("/metrics").text)
    body = served.client.post("/v1/completions", json={"prompt": "n3", "n": 3, "max_tokens": 3, "ignore_eos": True})
    assert [c["finish_reason"] for c in body.json()["choices"]] == ["length"] * 3
    after = metric_samples(served.client.get("/metrics").text)

    def delta(name: str) -> float:
        return value(after, name) - value(before, name)

    assert delta("vllm:request_generation_tokens_count") == 3
    assert (delta("vllm:request_max_num_generation_tokens_count"),
            delta("vllm:request_max_num_generation_tokens_sum")) == (1, 3)


@pytest.mark.parametrize(
    ("payload", "status", "needle"),
    [
        ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"prompt": "x", "temperature": -1}, 400, "temperature"),
        ({"prompt": "x", "n": 33}, 400, "n:"),
        ({"prompt": "x", "max_tokens": 2, "min_tokens": 3}, 400, "min_tokens"),
        ({"prompt": "x", "top_p": 0}, 400, "top_p"),
        ({"max_tokens": 3}, 400, "prompt"),
        ({"prompt": [1, 99999], "max_tokens": 3}, 400, "[0, 512)"),
        ({"prompt": "", "max_tokens": 3}, 400, "at least one token"),
        ({"prompt": "x", "model": "nope"}, 404, "nope"),
        ({"prompt": [1] * 600, "max_tokens": 1}, 400, "600 input tokens"),
    ],
)
def test_bad_input_is_refused_naming_the_field(served: Served, payload: dict, status: int, needle: str) -> None:
    resp = served.client.post("/v1/completions", json=payload)
    assert resp.status_code == status, resp.text
    assert needle in resp.json()["error"]["message"]


def test_prompt_too_long_states_the_limits(served: Served) -> None:
    limit = served.client.get("/v1/models").json()["data"][0]["max_model_len"]
    resp = served.client.post("/v1/completions", json={"prompt": [1] * limit, "max_tokens": 1})
    assert resp.status_code == 400
    message = resp.json()["error"]["message"]
    assert f"maximum context length is {limit} tokens" in message and f"contains {limit} input tokens" in message


@pytest.mark.parametrize("stream", [False, True])
def test_max_tokens_past_the_context_is_cut_to_it_and_ends_with_length(served: Served, stream: bool) -> None:
    """As vLLM (``get_max_tokens``): min(max_tokens, context - prompt), not a 400."""
    limit = served.client.get("/v1/models").json()["data"][0]["max_model_len"]
    prompts = [[5] * (limit - 3), [6] * (limit - 200)]  # two prompts, each with its own room
    resp = served.client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 50, "ignore_eos": True,
                                                       "stream": stream, "stream_options": {"include_usage": True}
                                                       if stream else None})
    assert resp.status_code == 200, resp.text
    if stream:
        events = [json.loads(line[6:]) for line in resp.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        reasons = {c["index"]: c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]}
        usage = events[-1]["usage"]
    else:
        reasons = {c["index"]: c["finish_reason"] for c in resp.json()["choices"]}
        usage = resp.json()["usage"]
    assert reasons == {0: "length", 1: "length"}
    assert usage["completion_tokens"] == 3 + 50


def test_chat_max_tokens_past_the_context_is_cut_to_it(served: Served) -> None:
    limit = served.client.get("/v1/models").json()["data"][0]["max_model_len"]
    messages = [{"role": "user", "content": "word " * 100}]
    probe = served.client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    room = limit - probe.json()["usage"]["prompt_tokens"]
    resp = served.client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": room + 40,
                                                            "ignore_eos": True})
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    assert resp.json()["usage"]["completion_tokens"] == room
    # A prompt that leaves no room for one token is still a 400, naming the messages.
    huge = [{"role": "user", "content": "word " * limit}]
    too_long = served.client.post("/v1/chat/completions", json={"messages": huge, "max_tokens": 1})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "messages"


def test_malformed_json_is_400(served: Served) -> None:
    resp = served.client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert resp.status_code == 400


def test_client_disconnects_abort_requests_and_free_every_block(served: Served) -> None:
    before = metric_samples(served.client.get("/metrics").text)
    for _ in range(3):
        with httpx.Client(base_url=served.url, timeout=30) as other, other.stream(
            "POST", "/v1/completions", json={"prompt": "long one " * 10, "max_tokens": 400, "stream": True}
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    break  # one token arrived: walk away mid-stream
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (served.engine.kv_state()[0] or sum(served.engine.num_requests())):
        time.sleep(0.05)
    assert served.engine.kv_state()[0] == 0, "KV blocks still held after disconnects"
    served.engine.blocks.check_invariants()
    after = metric_samples(served.client.get("/metrics").text)
    aborted = value(after, "vllm:request_success_total", finished_reason="abort") - value(
        before, "vllm:request_success_total", finished_reason="abort"
    )
    assert aborted == 3


def test_placement_routes_apply_valid_and_refuse_invalid(served: Served) -> None:
    current = served.client.get("/v1/placement").json()
    assert current["num_ranks"] == 1 and len(current["phy2log"]) == 2
    reversed_rows = [list(reversed(row)) for row in current["phy2log"]]
    resp = served.client.post("/v1/placement", json={**current, "phy2log": reversed_rows})
    assert resp.status_code == 200, resp.text
    assert {"duration_s", "experts_moved", "bytes_moved"} <= set(resp.json())
    assert served.client.get("/v1/placement").json()["phy2log"] == reversed_rows
    bad = {**current, "phy2log": [[0] * len(row) for row in current["phy2log"]]}
    resp = served.client.post("/v1/placement", json=bad)
    assert resp.status_code == 422
    assert any("no replica" in p for p in resp.json()["error"]["problems"])
    assert served.client.get("/v1/placement").json()["phy2log"] == reversed_rows
    # Serving continues under the new placement.
    assert served.client.post("/v1/completions", json={"prompt": "after swap", "max_tokens": 3}).status_code == 200
    metrics = metric_samples(served.client.get("/metrics").text)
    assert value(metrics, "moe_placement_swaps_total") >= 1


@pytest.mark.parametrize("ep", [1, 2])
def test_a_fresh_server_warmed_up_and_shows_nothing_of_it(tiny_checkpoint: Path, ep: int) -> None:
    server, engine = serve(tiny_checkpoint, ep=ep)
    try:
        assert engine.warmup_steps > 0
        with httpx.Client(base_url=server.url, timeout=30) as client:
            samples = metric_samples(client.get("/metrics").text)
            for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
                         "moe_placement_swaps_total"):
                assert value(samples, name) == 0, name
            assert client.get("/v1/placement").json()["phy2log"] == Placement.contiguous(2, 8, ep).phy2log.tolist()
            load = client.get("/v1/expert-load").json()
            assert load["steps_in_window"] == 0 and sum(map(sum, load["expert_tokens"])) == 0
    finally:
        server.stop()


def test_expert_load_reports_window_counts_and_imbalance(served: Served) -> None:
    served.client.post("/v1/completions", json={"prompt": "load " * 10, "max_tokens": 4})
    load = served.client.get("/v1/expert-load").json()
    assert load["num_layers"] == 2 and load["num_experts"] == 8 and load["num_ranks"] == 1
    assert len(load["expert_tokens"]) == 2 and len(load["expert_tokens"][0]) == 8
    assert load["steps_in_window"] >= 1
    assert sum(load["expert_tokens"][0]) == sum(load["rank_tokens"][0]) > 0
    assert load["imbalance_cv"] == [0.0, 0.0]  # one rank: nothing to be imbalanced across
    assert load["balancedness"] == [1.0, 1.0]


def test_full_queue_answers_429_with_retry_after(tiny_checkpoint: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    server, engine = serve(tiny_checkpoint, max_num_seqs=1, max_waiting=1)
    try:
        def post(i: int) -> httpx.Response:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                return client.post("/v1/completions", json={"prompt": f"busy {i}", "max_tokens": 300})

        # One runs, one waits, the rest find the queue full (all arrive within the first one's run).
        with ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(post, range(6)))
        codes = sorted(r.status_code for r in responses)
        assert codes.count(200) >= 2 and 429 in codes, codes
        assert set(codes) <= {200, 429}
        for resp in responses:
            if resp.status_code == 429:
                assert int(resp.headers["Retry-After"]) >= 1
                assert "queue is full" in resp.json()["error"]["message"]
    finally:
        server.stop()
    assert engine.kv_state()[0] == 0


def test_load_generator_replays_a_trace_slice_and_records_client_timings(served: Served) -> None:
    import asyncio

    import numpy as np

    from contracts.traces import RequestTrace
    from harness.loadgen import RequestRecord, plan_from_trace, run_load, send_request, summarize

    trace = RequestTrace("synthetic", np.array([0.0, 1.0, 2.0, 30.0]), np.array([320, 16, 4000, 8]),
                         np.array([64, 32, 80, 8]))
    plan = plan_from_trace(trace, duration_s=1.0, speedup=2.0, length_scale=1 / 16, max_prompt_tokens=100,
                           max_output_tokens=4)
    assert [(r.arrival_s, r.prompt_tokens, r.max_tokens) for r in plan] == [(0.0, 20, 4), (0.5, 1, 2)]
    records = asyncio.run(run_load(served.url, plan, vocab_size=512, model=MODEL, max_in_flight=2))
    assert [r.status for r in records] == [200, 200]
    assert [r.output_tokens for r in records] == [4, 2]
    assert all(r.ttft_s is not None and r.ttft_s > 0 for r in records)
    assert [len(r.itls_s) for r in records] == [3, 1]
    assert records[1].e2e_s is not None and records[1].finish_reason == "length"
    summary = summarize(records, wall_s=1.0)
    assert summary["ok"] == 2 and summary["output_tokens"] == 6 and summary["ttft_p99_s"] > 0

    async def shared_client() -> RequestRecord:
        async with httpx.AsyncClient(timeout=30) as client:  # no base_url: one client for several servers
            return await send_request(client, plan[0], [1, 2, 3], time.monotonic(), None, 0.0,
                                      base_url=served.url)

    one = asyncio.run(shared_client())
    assert one.ok and one.output_tokens == 4 and len(one.itls_s) == 3


@pytest.mark.slow
@pytest.mark.parametrize("colocate_ranks", [False, True], ids=["rank-processes", "colocated-ranks"])
def test_expert_parallel_server_reports_ranks_and_moves_experts(tiny_checkpoint: Path, colocate_ranks: bool) -> None:
    server, engine = serve(tiny_checkpoint, ep=2, colocate_ranks=colocate_ranks)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            payload = {"prompt": "two ranks", "max_tokens": 6, "temperature": 0}
            before = client.post("/v1/completions", json=payload).json()["choices"][0]["text"]
            load = client.get("/v1/expert-load").json()
            assert load["num_ranks"] == 2
            assert all(sum(row) > 0 for row in load["rank_tokens"])
            assert all(cv >= 0.0 for cv in load["imbalance_cv"])
            total_before = np.asarray(load["expert_tokens_total"])
            assert (total_before == np.asarray(load["expert_tokens"])).all()  # one request: all in the window
            current = client.get("/v1/placement").json()
            swapped = {**current, "phy2log": [list(reversed(row)) for row in current["phy2log"]]}
            resp = client.post("/v1/placement", json=swapped)
            assert resp.status_code == 200, resp.text
            assert resp.json()["experts_moved"] > 0  # reversing the slots moves every expert to the other rank
            after = client.post("/v1/completions", json=payload).json()["choices"][0]["text"]
            assert after == before  # greedy output does not depend on where experts live
            load = client.get("/v1/expert-load").json()
            assert load["steps_in_window"] >= 1  # the window restarted at the swap and filled again
            # The totals did not restart: what they grew by holds the new window (and any step
            # counted between the first reading and the swap).
            grown = np.asarray(load["expert_tokens_total"]) - total_before
            window = np.asarray(load["expert_tokens"])
            assert window.sum() > 0 and (grown >= window).all()
    finally:
        server.stop()
    assert engine.kv_state()[0] == 0


def test_spare_slots_per_rank_start_with_replicas(tiny_checkpoint: Path) -> None:
    server, engine = serve(tiny_checkpoint, slots_per_rank=10)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            placement = client.get("/v1/placement").json()
            assert placement["slots_per_rank"] == 10
            # 8 experts in 10 slots: the contiguous placement replicates experts 0 and 1.
            assert placement["phy2log"] == [[0, 1, 2, 3, 4, 5, 6, 7, 0, 1]] * 2
            resp = client.post("/v1/completions", json={"prompt": "replicas", "max_tokens": 3})
            assert resp.status_code == 200, resp.text
    finally:
        server.stop()
    assert engine.kv_state()[0] == 0


# Requests ended by a stop string, as /metrics counts them: as their client saw them (vLLM's output processor
# sets ``stop`` before it records a finished request, and ignores the tokens that come after).

STOP_BASE = {"model": MODEL, "prompt": "hello world", "temperature": 0, "ignore_eos": True}


def _stop_counts(client: httpx.Client) -> dict[str, float]:
    samples = metric_samples(client.get("/metrics").text)
    counts = {reason: value(samples, "vllm:request_success_total", finished_reason=reason)
              for reason in ("stop", "length", "abort")}
    counts["request_generation_tokens"] = value(samples, "vllm:request_generation_tokens_sum")
    counts["generation_tokens"] = value(samples, "vllm:generation_tokens_total")
    return counts


def _delta(client: httpx.Client, payload: dict[str, object]) -> tuple[dict[str, object], dict[str, float]]:
    """The response's choice and usage, and how the counts moved."""
    before = _stop_counts(client)
    body = client.post("/v1/completions", json={**STOP_BASE, **payload}).json()
    after = _stop_counts(client)
    return {**body["choices"][0], **body["usage"]}, {k: after[k] - before[k] for k in after}


def _pieces(client: httpx.Client, max_tokens: int) -> list[str]:
    """Each generated token's text (greedy: the same in every request)."""
    body = client.post("/v1/completions", json={**STOP_BASE, "max_tokens": max_tokens, "logprobs": 0}).json()
    tokens: list[str] = body["choices"][0]["logprobs"]["tokens"]
    return tokens


def _fresh_piece(pieces: list[str], first: int) -> int:
    """The first token from ``first`` on whose text is whole and is not already in the text before it."""
    return next(k for k in range(first, len(pieces)) if pieces[k].strip() and "\ufffd" not in pieces[k]
                and pieces[k] not in "".join(pieces[:k]))


def test_a_stop_string_in_the_last_allowed_token_counts_as_stop(served: Served) -> None:
    """The core ended the request on ``length`` before the API found the stop string: the client got ``stop``,
    /metrics counted ``length``."""
    pieces = _pieces(served.client, 8)
    k = _fresh_piece(pieces, 1)
    choice, counts = _delta(served.client, {"max_tokens": k + 1, "stop": [pieces[k]]})
    assert choice["finish_reason"] == "stop" and choice["completion_tokens"] == k + 1
    assert (counts["stop"], counts["length"]) == (1, 0)
    assert counts["request_generation_tokens"] == counts["generation_tokens"] == k + 1


def test_tokens_generated_after_a_stop_string_are_not_counted(served: Served) -> None:
    """The core generated tokens until the API's stop reached it: the request's generation tokens counted them,
    beyond the usage its client got."""
    pieces = _pieces(served.client, 4)
    k = _fresh_piece(pieces, 0)
    served.engine.set_step_delay(0.05)  # the stop reaches the core a step or more after the token it is in
    try:
        choice, counts = _delta(served.client, {"max_tokens": 32, "stop": [pieces[k]]})
    finally:
        served.engine.set_step_delay(0.0)
    assert choice["finish_reason"] == "stop" and choice["completion_tokens"] == k + 1
    assert (counts["stop"], counts["length"], counts["abort"]) == (1, 0, 0)
    assert counts["request_generation_tokens"] == counts["generation_tokens"] == k + 1
