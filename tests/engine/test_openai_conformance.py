"""The official ``openai`` client against a real engine server on 127.0.0.1: completions and chat, streamed
and not, usage in tokens, stop strings, and errors in OpenAI's shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.chat_template import load_chat_template
from engine.openai_logprobs import MAX_CONTEXT, token_text
from engine.server import ServerThread
from engine.tokenizer import HFTokenizer, load_tokenizer
from exporters.app import ServeOptions, build_stack
from harness.processes import free_port

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.integration

MODEL = "tiny-moe"
MESSAGES: list[Any] = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(tiny_checkpoint: Path) -> Iterator[Any]:
    port = free_port()
    stack = build_stack(ServeOptions(checkpoint=tiny_checkpoint, model_name=MODEL, kv_cache_mb=1.0, port=port))
    with ServerThread(stack.app, port=port) as server:
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint: Path) -> HFTokenizer:
    tok = load_tokenizer(tiny_checkpoint, vocab_size=512)
    assert isinstance(tok, HFTokenizer)
    return tok


def test_models_list_and_retrieve(client: Any) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body["type"] == "invalid_request_error" and info.value.body["param"] == "model"


def test_completion_streamed_joins_to_the_whole_and_usage_counts_tokens(client: Any, tokenizer: HFTokenizer) -> None:
    prompt = "The quick brown fox jumps over the lazy dog."
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, **GREEDY)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == len(tokenizer.encode(prompt)) < len(prompt.encode())
    assert whole.usage.completion_tokens == 12 and whole.usage.total_tokens == whole.usage.prompt_tokens + 12
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_whole_and_streamed(client: Any, tokenizer: HFTokenizer, tiny_checkpoint: Path) -> None:
    template = load_chat_template(tiny_checkpoint)
    assert template is not None
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, **GREEDY)
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")  # as OpenAI and vLLM write it
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    assert whole.usage.prompt_tokens == len(tokenizer.encode(template.render(MESSAGES)))
    assert whole.usage.completion_tokens == 10
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert all(c.object == "chat.completion.chunk" and c.id.startswith("chatcmpl-") for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_max_completion_tokens_and_default_length(client: Any) -> None:
    short = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=3, **GREEDY)
    assert short.usage.completion_tokens == 3
    # Left out, the completion may fill the context (it ignores eos here).
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    assert full.usage.prompt_tokens + full.usage.completion_tokens == 512


@pytest.mark.parametrize("stream", [False, True])
def test_chat_stop_string_cuts_the_text(client: Any, stream: bool) -> None:
    reference = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, **GREEDY)
    text = reference.choices[0].message.content
    assert len(text) >= 8, text
    stop = text[4:7]
    expected = text[: text.find(stop)]
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, stop=[stop],
                                                     stream=True, **GREEDY))
        got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        last = [c.choices[0] for c in chunks if c.choices][-1]
    else:
        stopped = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, stop=stop, **GREEDY)
        got, last = stopped.choices[0].message.content, stopped.choices[0]
    assert (got, last.finish_reason, last.stop_reason) == (expected, "stop", stop)  # vLLM's stop_reason


def test_completion_stop_string(client: Any) -> None:
    text = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, **GREEDY).choices[0].text
    stop = text[5:8]
    cut = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24, stop=stop, logprobs=0,
                                    **GREEDY)  # fmt: skip
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == (text[: text.find(stop)], "stop")
    assert cut.choices[0].stop_reason == stop  # vLLM's: the stop string matched
    # Usage counts the tokens up to the one that completed the stop string (those the logprobs list), not
    # the ones the core generated before the stop reached it.
    assert cut.usage.completion_tokens == len(cut.choices[0].logprobs.tokens)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES, n=33), "n"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=21),
         "top_logprobs"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES, frequency_penalty=2.5),
         "frequency_penalty"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]), "tools"),
        (lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=0), "max_tokens"),
        (lambda c: c.completions.create(model=MODEL, prompt="x", logprobs=21), "logprobs"),
        (lambda c: c.completions.create(model=MODEL, prompt="x", suffix="y"), "suffix"),
        (lambda c: c.completions.create(model=MODEL, prompt="x", extra_body={"top_k": -2}), "top_k"),
        (lambda c: c.completions.create(model=MODEL, prompt=[-1, 5], echo=True, max_tokens=1), "prompt"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES, response_format={"type": "json_object"}),
         "response_format"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES, tool_choice="auto"), "tool_choice"),
        (lambda c: c.completions.create(model=MODEL, prompt="x", n=2, best_of=3), "best_of"),
        (lambda c: c.completions.create(model=MODEL, prompt="x", logit_bias={"99999": 5}), "logit_bias"),
        (lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body={"min_tokens": 5}),
         "min_tokens"),
        # A max_tokens past the context is cut to it (as vLLM does); a prompt that fills the context is refused.
        (lambda c: c.completions.create(model=MODEL, prompt=[1] * 600, max_tokens=1), "prompt"),
        (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 600}]),
         "messages"),
    ],
)
def test_unserved_requests_are_bad_requests_naming_the_field(client: Any, call: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        call(client)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "invalid_request_error" and info.value.body["param"] == param


def test_the_no_op_values_clients_send_by_default_are_served(client: Any) -> None:
    """vLLM tooling sends top_k=-1 (off); OpenAI clients a plain-text response_format and tool_choice "none"."""
    for top_k in (-1, 0, 5):
        done = client.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body={"top_k": top_k})
        assert done.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                          response_format={"type": "text"}, tool_choice="none")  # fmt: skip
    assert chat.choices[0].finish_reason == "length"


def test_unknown_model_is_not_found(client: Any) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert info.value.body["param"] == "model" and info.value.body["code"] == 404


def test_n_choices_and_prompt_lists_come_in_openais_order(client: Any, tokenizer: HFTokenizer) -> None:
    prompts = ["one prompt", "and another, longer prompt"]
    seeded: dict[str, Any] = {"temperature": 1.0, "seed": 7, "max_tokens": 6, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(model=MODEL, prompt=prompts, n=2, **seeded)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert whole.usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in prompts)
    assert whole.usage.completion_tokens == 4 * 6
    # Choice i is sample i % n of prompt i // n: sample 0 of a prompt is that prompt alone with the same seed.
    alone = client.completions.create(model=MODEL, prompt=prompts[1], **seeded)
    assert whole.choices[2].text == alone.choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt=prompts, n=2, stream=True,
                                            stream_options={"include_usage": True}, **seeded))
    streamed = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(4)]
    assert streamed == [c.text for c in whole.choices]
    assert chunks[-1].usage.completion_tokens == 24


def test_chat_with_n_choices(client: Any) -> None:
    seeded: dict[str, Any] = {"temperature": 1.0, "seed": 3, "max_tokens": 8, "extra_body": {"ignore_eos": True}}
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=3, **seeded)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert len({c.message.content for c in whole.choices}) > 1  # seed + j per sample: the choices differ
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, n=3, stream=True, **seeded))
    roles = [c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"]
    assert sorted(roles) == [0, 1, 2]
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == i) for i in range(3)]
    assert texts == [c.message.content for c in whole.choices]


def _two_tokens(tokenizer: HFTokenizer) -> tuple[int, int]:
    (a,), (b,) = tokenizer.encode("a"), tokenizer.encode("b")
    return a, b


@pytest.mark.parametrize(
    ("penalty", "expected"),
    [
        ({}, "aaaa"),
        ({"frequency_penalty": 2.0}, "abab"),  # a: 50, 48, 46 ...; b: 49, 47 ...
        ({"presence_penalty": 2.0}, "abaa"),  # a: 50 then 48 for good; b: 49 then 47
        ({"extra_body": {"repetition_penalty": 2.0}}, "abaa"),  # seen logits halve: a 25, b 24.5
    ],
)
def test_penalties_and_logit_bias_steer_greedy_decoding(
    client: Any, tokenizer: HFTokenizer, penalty: dict[str, Any], expected: str
) -> None:
    a, b = _two_tokens(tokenizer)
    # The random model's own logits are within about +-1 of each other: the bias decides.
    extra = {"ignore_eos": True, **penalty.pop("extra_body", {})}
    out = client.completions.create(model=MODEL, prompt="xyz", max_tokens=4, temperature=0,
                                    logit_bias={str(a): 50, str(b): 49}, extra_body=extra, **penalty)
    assert out.choices[0].text == expected


def test_min_tokens_holds_back_stop_tokens(client: Any, tokenizer: HFTokenizer) -> None:
    a, b = _two_tokens(tokenizer)
    body: dict[str, Any] = {"model": MODEL, "prompt": "xyz", "max_tokens": 8, "temperature": 0,
                            "logit_bias": {str(a): 50, str(b): 40}}
    eager = client.completions.create(**body, extra_body={"stop_token_ids": [a]})
    assert (eager.choices[0].text, eager.choices[0].finish_reason, eager.usage.completion_tokens) == ("", "stop", 1)
    held = client.completions.create(**body, extra_body={"stop_token_ids": [a], "min_tokens": 3})
    # a cannot stop the request before 3 tokens are out: b (the next best) fills them, then a stops it.
    assert (held.choices[0].text, held.choices[0].finish_reason, held.usage.completion_tokens) == ("bbb", "stop", 4)


def _models_greedy_logprobs(checkpoint: Path, prompt_ids: list[int], steps: int, top: int) -> list[Any]:
    """(chosen logprob, top logprobs) of each greedy step, from transformers' model on the same checkpoint."""
    import torch

    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen3MoeForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ids = list(prompt_ids)
    found = []
    with torch.no_grad():
        for _ in range(steps):
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1)
            values, _ = torch.topk(logprobs, top)
            token = int(logprobs.argmax())
            found.append((float(logprobs[token]), values.tolist()))
            ids.append(token)
    return found


def test_completion_logprobs_are_the_models_own(client: Any, tokenizer: HFTokenizer, tiny_checkpoint: Path) -> None:
    prompt = "The router routes"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, logprobs=2, **GREEDY)
    logprobs = out.choices[0].logprobs
    assert "".join(logprobs.tokens) == out.choices[0].text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(5)]
    reference = _models_greedy_logprobs(tiny_checkpoint, tokenizer.encode(prompt), 5, 2)
    for i, (chosen, top) in enumerate(reference):
        assert logprobs.token_logprobs[i] == pytest.approx(chosen, abs=1e-4)
        # Greedy: the chosen token is the most likely one, listed with the next best.
        assert sorted(logprobs.top_logprobs[i].values(), reverse=True) == pytest.approx(top, abs=1e-4)
    streamed = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, logprobs=2, stream=True,
                                              **GREEDY))
    assert [t for c in streamed for t in c.choices[0].logprobs.token_logprobs] == logprobs.token_logprobs


def test_chat_logprobs(client: Any) -> None:
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, logprobs=True, top_logprobs=3,
                                         **GREEDY)
    content = out.choices[0].logprobs.content
    assert len(content) == 6 and "".join(c.token for c in content) == out.choices[0].message.content
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert entry.bytes == list(entry.token.encode()) and entry.logprob <= 0
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, **GREEDY)
    assert plain.choices[0].logprobs is None
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, logprobs=True,
                                                 stream=True, **GREEDY))
    streamed = [e.logprob for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == pytest.approx([e.logprob for e in content])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, top_logprobs=2)
    assert info.value.body["param"] == "top_logprobs"


def test_echo_puts_the_prompt_before_the_text(client: Any, tokenizer: HFTokenizer) -> None:
    prompt = "Echo me, please."
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, **GREEDY).choices[0].text
    echoed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, echo=True, **GREEDY)
    assert echoed.choices[0].text == prompt + plain and echoed.usage.completion_tokens == 5
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, echo=True, stream=True, **GREEDY))
    assert chunks[0].choices[0].text.startswith(prompt)
    assert "".join(c.choices[0].text for c in chunks) == prompt + plain
    ids = tokenizer.encode(prompt)
    by_ids = client.completions.create(model=MODEL, prompt=[ids, ids], max_tokens=5, echo=True, **GREEDY)
    assert [c.text for c in by_ids.choices] == [prompt + plain] * 2


def test_echo_with_logprobs_scores_the_prompt_with_the_models_own(client: Any, tokenizer: HFTokenizer,
                                                                  tiny_checkpoint: Path) -> None:
    import torch

    transformers = pytest.importorskip("transformers")
    prompt = "Score every token of this prompt."
    ids = tokenizer.encode(prompt)
    model = transformers.Qwen3MoeForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, **GREEDY)  # its prefix is now cached
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, echo=True, logprobs=1, **GREEDY)
    choice = out.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(prompt) and len(lp.tokens) == len(ids) + 1
    assert lp.tokens[: len(ids)] == [tokenizer.decode([t]) for t in ids]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and lp.text_offset[0] == 0
    assert lp.text_offset[len(ids)] == len(prompt) and choice.text[len(prompt):] == lp.tokens[-1]
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(float(reference[i - 1, ids[i]]), abs=1e-4)
        best = int(reference[i - 1].argmax())
        # The chosen token and the one most likely alternative (the argmax), OpenAI's legacy shape; a byte token
        # that is part of a character is completed with the scored prompt tokens before it, as vLLM's.
        assert token_text(tokenizer, best, ids[max(1, i - MAX_CONTEXT):i]) in lp.top_logprobs[i]
        assert max(lp.top_logprobs[i].values()) == pytest.approx(float(reference[i - 1, best]), abs=1e-4)
    assert lp.token_logprobs[-1] == pytest.approx(float(reference[-1].max()), abs=1e-4)  # greedy: the argmax
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, echo=True, logprobs=1,
                                            stream=True, **GREEDY))
    assert chunks[0].choices[0].logprobs.tokens == lp.tokens  # the prompt's come in the first chunk
    assert [t for c in chunks for t in c.choices[0].logprobs.token_logprobs] == lp.token_logprobs
    alone = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=1, **GREEDY)
    assert alone.choices[0].text == prompt and alone.choices[0].finish_reason == "length"
    assert alone.choices[0].logprobs.token_logprobs == lp.token_logprobs[:-1]
    assert alone.usage.completion_tokens == 0 and alone.usage.prompt_tokens == len(ids)


def test_continuous_usage_stats_put_each_choices_usage_so_far_on_every_chunk(client: Any) -> None:
    """vLLM's ``stream_options.continuous_usage_stats`` (with ``include_usage``): usage on every chunk too."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, max_tokens=4, stream=True,
                                                 stream_options=options, **GREEDY))
    prompt = chunks[-1].usage.prompt_tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    per_choice: dict[int, list[int]] = {0: [], 1: []}
    for chunk in chunks[:-1]:
        assert chunk.usage.prompt_tokens == prompt
        assert chunk.usage.total_tokens == prompt + chunk.usage.completion_tokens
        per_choice[chunk.choices[0].index].append(chunk.usage.completion_tokens)
    assert per_choice == {0: [0, 1, 2, 3, 4], 1: [0, 1, 2, 3, 4]}  # the role chunk first, then one per token
    text = list(client.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True,
                                          stream_options=options, **GREEDY))
    assert [c.usage.completion_tokens for c in text] == [1, 2, 3, 3]
    # Without include_usage, as in vLLM, there is no usage at all.
    bare = list(client.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True,
                                          stream_options={"continuous_usage_stats": True}, **GREEDY))
    assert [c.usage for c in bare] == [None] * 3


def test_a_stop_token_gets_its_logprob_entry_with_its_special_tokens_text(client: Any, tokenizer: HFTokenizer) -> None:
    """As vLLM: the token that ends the request is listed (not in the text), special tokens as themselves."""
    (end,) = tokenizer.encode("<|im_end|>")
    steer: dict[str, Any] = {"temperature": 0, "logit_bias": {str(end): 100},
                             "extra_body": {"stop_token_ids": [end], "min_tokens": 2}}
    out = client.completions.create(model=MODEL, prompt="The router routes", max_tokens=6, logprobs=1, **steer)
    choice, logprobs = out.choices[0], out.choices[0].logprobs
    assert choice.finish_reason == "stop" and len(logprobs.tokens) == 3 and logprobs.tokens[-1] == "<|im_end|>"
    assert "".join(logprobs.tokens[:2]) == choice.text and logprobs.text_offset[-1] == len(choice.text)
    assert logprobs.token_logprobs[-1] <= 0 and "<|im_end|>" in logprobs.top_logprobs[-1]
    chunks = list(client.completions.create(model=MODEL, prompt="The router routes", max_tokens=6, logprobs=1,
                                            stream=True, **steer))
    assert [t for c in chunks for t in c.choices[0].logprobs.tokens] == logprobs.tokens
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, logprobs=True, **steer)
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content][-1] == "<|im_end|>" and content[-1].bytes == list(b"<|im_end|>")
    assert "".join(c.token for c in content[:2]) == chat.choices[0].message.content and len(content) == 3
