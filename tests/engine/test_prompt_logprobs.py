"""Prompt log-probabilities (vLLM's ``prompt_logprobs``): computed in the prefill, chunk by chunk, for the
requests that ask; no prefix-cache hits for them; sent with the first token; the rest of the batch pays nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from engine import wire
from engine.batch import SeqChunk, StepPlan
from engine.core import EngineCore
from engine.engine_types import EngineConfig, RequestOutput
from engine.executors import ExecutorOptions, create_executor
from engine.sampling import SamplingParams
from engine.scheduler import SchedulerConfig
from engine.stats import StepStats
from engine.tokenizer import load_tokenizer
from tests.engine.fake_executor import FakeExecutor
from tests.engine.test_server import serve

# fp32 on CPU, as tests/engine/test_model.py: measured differences ~1e-6 on logits of magnitude ~1.
ATOL = 1e-4


def _serve(core: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]]
           ) -> tuple[dict[str, list[RequestOutput]], list[StepStats]]:
    """Run ``requests`` (added together) to the end: every output per request, every step's stats."""
    outputs: dict[str, list[RequestOutput]] = {rid: [] for rid in requests}
    for rid, (prompt, params) in requests.items():
        core.add_request(rid, prompt, params)
    stats: list[StepStats] = []
    while core.has_work():
        result = core.step()
        for out in result.outputs:
            outputs[out.request_id].append(out)
        if result.stats is not None:
            stats.append(result.stats)
    return outputs, stats


def _fake_next(context: list[int], vocab: int = 64) -> int:
    """The token FakeExecutor's logits put first after ``context``."""
    return (sum(context) * 31 + len(context)) % vocab


def test_chunked_preempted_prefill_reports_every_prompt_token_once() -> None:
    """Small budget (chunks of 8) and few blocks (preemptions): each prompt token 1.. once, from its context."""
    core = EngineCore(FakeExecutor(num_blocks=14), EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=8)))
    prompts = {f"r{i}": [(7 * i + j) % 64 for j in range(19 + i)] for i in range(3)}
    requests = {rid: (p, SamplingParams(max_tokens=6, temperature=0.0, prompt_logprobs=2 if rid != "r1" else None))
                for rid, p in prompts.items()}
    outputs, stats = _serve(core, requests)
    assert sum(s.num_preemptions for s in stats) > 0, "the test must exercise a preemption"
    for rid, outs in outputs.items():
        prompt = prompts[rid]
        assert outs[-1].finish_reason == "length" and all(o.prompt_logprobs is None for o in outs[1:])
        if rid == "r1":
            assert outs[0].prompt_logprobs is None
            continue
        got = outs[0].prompt_logprobs
        assert got is not None and len(got) == len(prompt) - 1
        for position, (chosen, top) in enumerate(got):
            best = _fake_next(prompt[: position + 1])
            assert len(top) == 2 and top[0][0] == best
            assert chosen == pytest.approx(0.0 if prompt[position + 1] == best else -20.0, abs=1e-3)


def test_only_the_asking_chunks_get_every_positions_logits() -> None:
    """The plan asks for every position's logits of the asking request alone; the others keep one row."""
    executor = FakeExecutor()
    core = EngineCore(executor, EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=64)))
    core.add_request("plain", list(range(1, 12)), SamplingParams(max_tokens=3, temperature=0.0))
    core.step()
    core.add_request("asks", list(range(20, 30)), SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=0))
    core.step()
    plan = executor.plans[-1]
    assert [c.all_logits for c in plan.chunks] == [False, True]
    assert plan.num_logits == 1 + 10
    core.step()
    assert not any(c.all_logits for c in executor.plans[-1].chunks), "decode steps ask for one row each"


def test_a_request_asking_for_prompt_logprobs_takes_no_cached_blocks() -> None:
    core = EngineCore(FakeExecutor(), EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=64)))
    prompt = list(range(1, 18))
    _serve(core, {"warm": (prompt, SamplingParams(max_tokens=1, temperature=0.0))})
    outputs, stats = _serve(core, {"again": (prompt, SamplingParams(max_tokens=1, temperature=0.0,
                                                                    prompt_logprobs=1))})
    assert sum(s.prefix_cache_hits for s in stats) == 0 and sum(s.prefix_cache_queries for s in stats) == 0
    got = outputs["again"][0].prompt_logprobs
    assert got is not None and len(got) == len(prompt) - 1
    # Its own blocks are cached for the next request as usual.
    _, stats = _serve(core, {"third": (prompt, SamplingParams(max_tokens=1, temperature=0.0))})
    assert sum(s.prefix_cache_hits for s in stats) == 16


def test_a_one_token_prompt_has_no_prompt_logprobs() -> None:
    core = EngineCore(FakeExecutor())
    outputs, _ = _serve(core, {"r": ([5], SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3))})
    assert outputs["r"][0].prompt_logprobs == ()


def test_prompt_logprobs_cross_the_process_boundary() -> None:
    out = RequestOutput("r", 7, logprobs=(-0.5, ((7, -0.5),)), prompt_logprobs=((-1.5, ((2, -0.25),)), (-0.0, ())))
    assert wire.output_from_wire(wire.unpack(wire.pack(["x", wire.output_to_wire(out)]))[1]) == out
    params = SamplingParams(prompt_logprobs=4)
    assert wire.params_from_wire(wire.unpack(wire.pack([wire.params_to_wire(params)]))[0]) == params
    with pytest.raises(Exception, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)


def _reference_logprobs(checkpoint: Path, prompt: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits at every prompt position."""
    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen3MoeForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)


def test_prompt_logprobs_are_the_models_own(tiny_checkpoint: Path) -> None:
    """Chunked (8 tokens a step), beside another request, after a cached prefix: transformers' log_softmax."""
    prompt = [(37 * i + 11) % 512 for i in range(29)]
    reference = _reference_logprobs(tiny_checkpoint, prompt)
    executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=4))
    try:
        core = EngineCore(executor, EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=8)))
        _serve(core, {"warm": (prompt, SamplingParams(max_tokens=2, temperature=0.0))})  # caches the prefix
        asking = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=3)
        outputs, _ = _serve(core, {"other": ([3, 1, 4, 1, 5, 9, 2, 6], SamplingParams(max_tokens=4, temperature=0.0)),
                                   "asks": (prompt, asking)})
    finally:
        executor.shutdown()
    got = outputs["asks"][0].prompt_logprobs
    assert got is not None and len(got) == len(prompt) - 1
    chosen = torch.tensor([c for c, _ in got])
    expected = reference[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
    torch.testing.assert_close(chosen, expected, atol=ATOL, rtol=0)
    for position, (_, top) in enumerate(got):
        ids = [t for t, _ in top]
        assert ids[0] == int(reference[position].argmax())
        torch.testing.assert_close(torch.tensor([v for _, v in top]), reference[position].topk(3).values,
                                   atol=ATOL, rtol=0)


def test_every_position_logits_match_the_last_position_logits(tiny_checkpoint: Path) -> None:
    """The executor's all-positions rows: the last one equals the one-row answer, the batch's others unchanged."""
    executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=4))
    try:
        half = executor.num_blocks // 2
        a, b = tuple(range(1, 14)), tuple(range(100, 109))
        table_a, table_b = tuple(range(half)), tuple(range(half, 2 * half))
        one = executor.execute(StepPlan((SeqChunk(0, 0, a, table_a, True), SeqChunk(1, 0, b, table_b, True))))
        every = executor.execute(StepPlan((SeqChunk(0, 0, a, table_a, True),
                                           SeqChunk(1, 0, b, table_b, True, all_logits=True))))
    finally:
        executor.shutdown()
    assert every.shape[0] == 1 + len(b)
    torch.testing.assert_close(every[0], one[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(every[-1], one[1], atol=ATOL, rtol=0)


@pytest.mark.integration
def test_an_echoed_prompt_keeps_its_special_tokens_and_its_offsets_index_the_echo(tiny_checkpoint: Path) -> None:
    """As vLLM: a token-id prompt echoes as ``tokenizer.decode`` gives it (special tokens kept), and each
    prompt token's ``text_offset`` is the sum of the lengths of the tokens before it."""
    text = "<|im_start|>arme<|im_end|>"
    ids = load_tokenizer(tiny_checkpoint, 512).encode(text)
    server, _ = serve(tiny_checkpoint)
    try:
        choices = [httpx.post(server.url + "/v1/completions", timeout=30, json={
            "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 0}).json()["choices"][0]
            for prompt in (text, ids)]
    finally:
        server.stop()
    assert len(ids) > 2 and choices[0] == choices[1]
    choice, tokens = choices[0], choices[0]["logprobs"]["tokens"]
    assert choice["text"] == text and tokens[0] == "<|im_start|>" and tokens[-1] == "<|im_end|>"
    assert choice["logprobs"]["text_offset"] == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert [text[o:o + len(t)] for t, o in zip(tokens, choice["logprobs"]["text_offset"], strict=True)] == tokens


@pytest.mark.integration
def test_generated_offsets_run_on_from_an_echoed_multibyte_prompt(tiny_checkpoint: Path) -> None:
    """vLLM sums the token texts' lengths over the echo and the generated tokens alike, so the first generated
    token sits right after the last prompt token, even where multi-byte text decodes shorter token by token."""
    server, _ = serve(tiny_checkpoint)
    try:
        choice = httpx.post(server.url + "/v1/completions", timeout=30, json={
            "prompt": "价格 ok", "max_tokens": 3, "echo": True, "logprobs": 0, "ignore_eos": True,
        }).json()["choices"][0]
    finally:
        server.stop()
    tokens, offsets = choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"]
    assert len(tokens) >= 4
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
