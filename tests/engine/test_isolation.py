"""One bad request never hurts another: sampling limits, per-row sampling failures, deadlines, stop strings."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from contracts.errors import ValidationError
from engine.llm_engine import EngineConfig, LLMEngine
from engine.openai_chat import ChatCompletionRequest
from engine.protocol import CompletionRequest, GenerationRequest, StopMatcher
from engine.sampling import RequestSampler, SamplingParams, sample, sample_each
from engine.server import create_app
from engine.tokenizer import ByteTokenizer
from tests.engine.fake_executor import FakeExecutor, reference_tokens
from tests.engine.recording_engine import RecordingEngine
from tests.engine.test_scheduler import PROMPTS, Collect


@pytest.mark.parametrize(
    ("fields", "needle"),
    [({"seed": 2**64}, "seed"), ({"seed": -(2**63) - 1}, "seed"), ({"temperature": -1e-300}, "temperature"),
     ({"temperature": float("nan")}, "temperature"), ({"top_k": 2**31}, "top_k"), ({"top_k": -2}, "top_k"),
     ({"logit_bias": ((-1, 1.0),)}, "logit_bias")],
)
def test_sampling_params_refuse_what_the_sampler_cannot_compute(fields: dict[str, float], needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        SamplingParams(**fields)  # type: ignore[arg-type]
    assert needle in str(info.value)


def test_the_extremes_the_sampler_takes_sample_a_token() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(3))
    for params in (SamplingParams(seed=2**64 - 1), SamplingParams(seed=-(2**63)), SamplingParams(top_k=2**31 - 1),
                   SamplingParams(temperature=0.01, seed=1), SamplingParams(top_p=1e-300, seed=1)):
        assert 0 <= sample(logits, [RequestSampler(params)])[0] < 50
    # A top_p below float32's resolution keeps the most likely token: greedy, not NaN.
    assert sample(logits, [RequestSampler(SamplingParams(top_p=1e-300, seed=1))]) == [int(logits.argmax())]


def test_small_temperatures_sample_at_vllms_floor_and_only_zero_is_greedy() -> None:
    """vLLM raises a temperature in (0, 0.01) to 0.01 before its greedy check, so only 0 is greedy."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(5)) / 1000  # near-flat: 0.01 still samples
    floor = [sample(logits[i:i + 1], [RequestSampler(SamplingParams(temperature=0.01, seed=1))])[0] for i in range(4)]
    assert floor != logits.argmax(dim=-1).tolist()  # at 0.01 these rows do not all draw their argmax
    for tiny in (1e-300, 9e-6, 0.005):
        params = SamplingParams(temperature=tiny, seed=1)
        assert not params.greedy
        assert [sample(logits[i:i + 1], [RequestSampler(params)])[0] for i in range(4)] == floor
    assert SamplingParams(temperature=0.0).greedy
    # Logits / 0.01 past float32's range still give a token.
    huge = torch.tensor([[3e36, 2.9e36, -3e36]])
    assert sample(huge, [RequestSampler(SamplingParams(temperature=0.001, seed=1))]) == [0]


def test_the_api_passes_a_small_temperature_on_as_vllm_does() -> None:
    engine = RecordingEngine()
    client = TestClient(create_app(engine, ByteTokenizer(512), model_name="m"))  # type: ignore[arg-type]
    refused = client.post("/v1/completions", json={"prompt": "x", "temperature": 0.001}).json()["error"]
    assert refused["message"] == "recorded" and engine.params[0].temperature == 0.001


def _poisoned(params: SamplingParams) -> SamplingParams:
    """Params that passed validation and still make the sampler throw (a seed torch cannot take)."""
    object.__setattr__(params, "seed", 2**70)
    return params


def test_a_failing_row_fails_only_its_own_request() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(4))
    samplers = [RequestSampler(SamplingParams(temperature=0.0)), RequestSampler(_poisoned(SamplingParams())),
                RequestSampler(SamplingParams(seed=5))]
    tokens, failures = sample_each(logits, samplers)
    assert list(failures) == [1]
    assert tokens[0] == int(logits[0].argmax()) and 0 <= tokens[2] < 50


def test_a_request_whose_sampler_fails_ends_alone_and_the_batch_goes_on() -> None:
    engine = LLMEngine(FakeExecutor(step_delay_s=0.002))
    engine.start()
    collect = Collect()
    try:
        victims = [engine.add_request(p, SamplingParams(max_tokens=8, temperature=0.0), collect) for p in PROMPTS[:3]]
        bad = engine.add_request(PROMPTS[3], _poisoned(SamplingParams(max_tokens=8)), collect)
        collect.wait([*victims, bad])
        assert collect.outputs[bad][-1].finish_reason == "error"
        assert collect.outputs[bad][-1].error == "sampling failed"
        for rid, prompt in zip(victims, PROMPTS[:3], strict=True):
            assert collect.outputs[rid][-1].finish_reason == "length"
            assert [o.token_id for o in collect.outputs[rid]] == reference_tokens(prompt, 8)
        assert engine.kv_state()[0] == 0
    finally:
        engine.shutdown()


def test_a_logit_bias_token_outside_the_vocabulary_is_refused_before_its_prefill() -> None:
    engine = LLMEngine(FakeExecutor())
    engine.start()
    try:
        vocab = engine.core.executor.config.vocab_size
        with pytest.raises(ValidationError, match=rf"logit_bias token ids must be in \[0, {vocab}\)"):
            engine.add_request(PROMPTS[0], SamplingParams(logit_bias=((vocab, 5.0),)), Collect())
        assert engine.kv_state()[0] == 0
    finally:
        engine.shutdown()


def test_a_request_past_its_deadline_ends_with_finish_reason_deadline() -> None:
    engine = LLMEngine(FakeExecutor(step_delay_s=0.01), EngineConfig(request_deadline_s=0.2))
    engine.start()
    collect = Collect()
    try:
        slow = engine.add_request(PROMPTS[0], SamplingParams(max_tokens=200, temperature=0.0), collect)
        collect.wait([slow], timeout_s=5)
        last = collect.outputs[slow][-1]
        assert last.finish_reason == "deadline"
        assert 0 < last.generation_tokens < 200
        assert engine.kv_state()[0] == 0
    finally:
        engine.shutdown()
    with pytest.raises(ValidationError, match="request_deadline_s"):
        EngineConfig(request_deadline_s=0)


def test_stop_strings_are_found_across_token_boundaries_and_left_out() -> None:
    matcher = StopMatcher(["STOP", "xy"])
    shown = [matcher.feed(piece) for piece in ["ab", "cS", "T", "O", "Pzz"]]
    assert "".join(shown) == "abc" and matcher.stopped and matcher.found == "STOP"
    assert matcher.feed("more") == "" and matcher.flush() == ""
    plain = StopMatcher(["STOP"])
    assert "".join(plain.feed(p) for p in ["ST", "OW", "!"]) + plain.flush() == "STOW!"
    assert not plain.stopped



@pytest.mark.parametrize(
    ("stops", "text", "shown", "found"),
    [
        (["abcd", "bc"], "xabcd", "xa", "bc"),  # the stop string that ends first wins, as vLLM's
        (["long stop", "ng"], "a long stop", "a lo", "ng"),
        (["long stop", "p"], "a long stop", "a ", "long stop"),  # "p" ends with it: the first listed
        (["bcd", "cd"], "abcd", "a", "bcd"),  # both end together: the first listed
        (["cd", "bcd"], "abcd", "ab", "cd"),
    ],
)
def test_of_stop_strings_one_chunk_completes_the_one_ending_first_wins(
    stops: list[str], text: str, shown: str, found: str
) -> None:
    matcher = StopMatcher(stops)
    assert (matcher.feed(text), matcher.flush(), matcher.found) == (shown, "", found)


def test_unchecked_text_is_held_back_and_a_stop_string_found_must_end_after_it() -> None:
    # The first min_tokens tokens' text is fed unchecked, as vLLM's detokenizer skips it.
    straddling = StopMatcher(["XY"])
    assert [straddling.feed(piece, check=False) for piece in "abX"] == ["", "a", "b"]
    assert straddling.feed("Y") == "" and straddling.stopped and straddling.flush() == ""
    within = StopMatcher(["XY", "long"])
    assert "".join(within.feed(piece, check=False) for piece in "aXY") == ""
    assert within.feed("b") + within.flush() == "aXYb" and not within.stopped


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"prompt": [True, False]}, "prompt"),
        ({"prompt": [1.0, 2.0]}, "prompt"),
        ({"prompt": "x", "stop_token_ids": [True]}, "stop_token_ids"),
        ({"prompt": "x", "best_of": 0}, "best_of"),
        ({"prompt": "x", "n": 33}, "n"),
        ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
        ({"prompt": "x", "logit_bias": {"1": "lots"}}, "logit_bias"),
        ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": "x", "min_tokens": -1}, "min_tokens"),
        ({"prompt": "x", "stop": [""]}, "stop"),
        ({"prompt": "x", "stop": ["a"] * 17}, "stop"),
        ({"prompt": "x", "seed": 2**64}, "seed"),
        ({"prompt": "x", "frobnicate": 1}, "frobnicate"),
    ],
)
def test_completion_request_types_are_strict(payload: dict[str, object], needle: str) -> None:
    from pydantic import ValidationError as PydanticError

    with pytest.raises(PydanticError) as info:
        CompletionRequest.model_validate(payload)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("request_type", "payload", "problem"),
    [
        (CompletionRequest, {"prompt": "x", "suffix": "s"},
         'suffix: not implemented by this engine (send null or "", or leave it out)'),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"},
         'tool_choice: not implemented by this engine (send null or "none", or leave it out)'),
        (CompletionRequest, {"prompt": "x", "response_format": {"type": "json_object"}},
         'response_format: not implemented by this engine (send null or {"type": "text"}, or leave it out)'),
    ],
)
def test_an_unimplemented_field_is_refused_naming_its_accepted_values_as_json(
    request_type: type[GenerationRequest], payload: dict[str, object], problem: str,
) -> None:
    assert request_type.model_validate(payload).problems() == [problem]


def test_logit_bias_values_are_clamped_to_plus_or_minus_100_as_vllm_does() -> None:
    request = CompletionRequest.model_validate({"prompt": "x", "logit_bias": {"7": 101, "2": -1e9, "3": 5}})
    request.check()
    assert request.sampling_params(4).logit_bias == ((2, -100.0), (3, 5.0), (7, 100.0))


def test_unimplemented_openai_fields_are_refused_by_name_and_their_no_op_values_accepted() -> None:
    CompletionRequest.model_validate({"prompt": "x", "logprobs": 3, "echo": False, "suffix": None}).check()
    CompletionRequest.model_validate({"prompt": "x", "echo": True, "suffix": ""}).check()
    CompletionRequest.model_validate({"prompt": "x", "echo": True, "logprobs": 1, "max_tokens": 0}).check()
    asked = {"max_tokens": 0, "suffix": "s", "logprobs": 1}
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"prompt": "x", **asked}).check()
    assert sorted(p.split(":")[0] for p in info.value.problems) == ["max_tokens", "suffix"]
    with pytest.raises(ValidationError, match="best_of: must equal n"):
        CompletionRequest.model_validate({"prompt": "x", "n": 2, "best_of": 3}).check()
    CompletionRequest.model_validate({"prompt": "x", "n": 2, "best_of": 2}).check()
    with pytest.raises(ValidationError, match="128 choices"):
        CompletionRequest.model_validate({"prompt": ["a"] * 5, "n": 32}).check()
    with pytest.raises(ValidationError, match="logit_bias: keys must be token ids"):
        CompletionRequest.model_validate({"prompt": "x", "logit_bias": {"the": 1}}).check()
    with pytest.raises(ValidationError, match="prompt: must be valid Unicode"):
        CompletionRequest.model_validate({"prompt": "a\ud800"}).check()
