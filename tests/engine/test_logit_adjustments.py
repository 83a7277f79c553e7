"""Logit adjustments before sampling: logit_bias, min_tokens, repetition/frequency/presence penalties (vLLM's)."""

from __future__ import annotations

import pytest
import torch

from contracts.errors import ValidationError
from engine.sampling import RequestSampler, SamplingParams, TokenHistory, adjust_logits, sample_each, token_logprobs

LOGITS = torch.tensor([2.0, -1.0, 0.5, 0.0, 3.0])
NONE = TokenHistory((), ())


def test_logit_bias_adds_to_the_named_tokens() -> None:
    out = adjust_logits(LOGITS, SamplingParams(logit_bias=((1, 10.0), (4, -100.0))), NONE)
    assert out.tolist() == [2.0, 9.0, 0.5, 0.0, -97.0]
    assert LOGITS[1] == -1.0  # the input is left alone


def test_min_tokens_holds_back_eos_and_stop_tokens_until_enough_are_out() -> None:
    params = SamplingParams(min_tokens=2, stop_token_ids=(2,))
    early = adjust_logits(LOGITS, params, TokenHistory((0,), (4,)), eos_token_ids=(4,))
    assert early[2] == early[4] == float("-inf") and early[0] == 2.0
    late = adjust_logits(LOGITS, params, TokenHistory((0,), (3, 3)), eos_token_ids=(4,))
    assert torch.equal(late, LOGITS)
    # ignore_eos too: vLLM's MinTokens masks every eos id (its all_stop_token_ids) whatever ignore_eos says.
    ignoring = adjust_logits(LOGITS, SamplingParams(min_tokens=2, ignore_eos=True), NONE, eos_token_ids=(1, 4))
    assert ignoring[1] == ignoring[4] == float("-inf") and ignoring[0] == 2.0


def test_min_tokens_with_ignore_eos_samples_no_eos_before_enough_are_out() -> None:
    logits = torch.zeros(1, 16)
    logits[0, 9] = 10.0  # eos is the model's top token
    params = SamplingParams(max_tokens=8, min_tokens=4, temperature=0.0, ignore_eos=True)
    tokens, _ = sample_each(logits, [RequestSampler(params)], [TokenHistory((1,), ())], eos_token_ids=(9,))
    assert tokens[0] != 9


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    out = adjust_logits(LOGITS, SamplingParams(repetition_penalty=2.0), TokenHistory((0, 1), (2,)))
    assert out.tolist() == [1.0, -2.0, 0.25, 0.0, 3.0]


def test_frequency_and_presence_penalties_count_output_tokens_only() -> None:
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=1.0)
    out = adjust_logits(LOGITS, params, TokenHistory((3, 3, 3), (4, 4, 4, 0)))
    assert out.tolist() == pytest.approx([2.0 - 0.5 - 1.0, -1.0, 0.5, 0.0, 3.0 - 1.5 - 1.0])


def test_sample_each_adjusts_only_the_rows_that_ask() -> None:
    logits = torch.stack([LOGITS, LOGITS, LOGITS])
    samplers = [RequestSampler(SamplingParams(temperature=0.0)),
                RequestSampler(SamplingParams(temperature=0.0, logit_bias=((1, 10.0),))),
                RequestSampler(SamplingParams(temperature=0.5, seed=1, logit_bias=((2, 100.0),)))]
    histories = [NONE, NONE, NONE]
    assert sample_each(logits, samplers, histories) == ([4, 1, 2], {})
    # Without histories nothing is adjusted (callers that know no history).
    assert sample_each(logits[:2], samplers[:2]) == ([4, 4], {})


def test_greedy_with_a_frequency_penalty_stops_repeating() -> None:
    sampler = RequestSampler(SamplingParams(temperature=0.0, frequency_penalty=2.0))
    out: list[int] = []
    for _ in range(4):
        token = sample_each(LOGITS[None, :], [sampler], [TokenHistory((), tuple(out))])[0][0]
        out.append(token)
    # 4 (3.0); 4 is down to 1.0, 0 (2.0) wins; 0 is down to 0.0, 4 (1.0) wins; 4 is down to -1.0, 2 (0.5) wins.
    assert out == [4, 0, 4, 2]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"min_tokens": 20, "max_tokens": 16}, "min_tokens"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logit_bias": ((1, 101.0),)}, "logit_bias"),
    ],
)
def test_out_of_range_adjustments_are_refused(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValidationError, match=name):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_token_logprobs_are_the_models_own_with_the_top_alternatives() -> None:
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS])
    got = token_logprobs(logits, [4, 2, 0], [2, None, 0])
    expected = torch.log_softmax(LOGITS, dim=-1)
    assert set(got) == {0, 2}  # row 1 did not ask
    chosen, top = got[0]
    assert chosen == pytest.approx(float(expected[4]))
    assert [t for t, _ in top] == [4, 0] and [v for _, v in top] == pytest.approx([float(expected[4]),
                                                                                   float(expected[0])])
    assert got[2] == (pytest.approx(float(expected[0])), ())


def test_logprobs_cross_the_process_boundary() -> None:
    from engine.engine_types import RequestOutput
    from engine.wire import output_from_wire, output_to_wire, pack, unpack

    out = RequestOutput("r", 7, logprobs=(-0.5, ((7, -0.5), (3, -1.25))))
    assert output_from_wire(unpack(pack(["x", output_to_wire(out)]))[1]) == out
    plain = RequestOutput("r", 7, finished=True, finish_reason="length", prompt_tokens=3, generation_tokens=1)
    assert output_from_wire(unpack(pack(["x", output_to_wire(plain)]))[1]) == plain
    with pytest.raises(ValidationError, match="logprobs"):
        SamplingParams(logprobs=21)
