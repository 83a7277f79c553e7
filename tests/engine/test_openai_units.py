"""The OpenAI API's pure parts: the error document, chat requests, chat templates, the random checkpoint's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError as PydanticValidationError

from contracts.errors import NotFoundError, OverloadedError, UnavailableError, ValidationError
from engine.chat_template import ChatTemplate, load_chat_template
from engine.errors import PromptTooLongError
from engine.openai_chat import ChatCompletionRequest
from engine.openai_errors import error_body, error_response, http_error_body, loc_path
from engine.protocol import CompletionRequest
from engine.tokenizer import HFTokenizer, load_tokenizer
from engine.tokenizer_init import MIN_VOCAB_SIZE, SPECIAL_TOKENS, train_tokenizer, write_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Say more"}]


# ------------------------------------------------------------------ error document


@pytest.mark.parametrize(
    ("exc", "status", "kind", "param"),
    [
        (ValidationError(["temperature: must be <= 2", "seed: too big"]), 400, "invalid_request_error", "temperature"),
        (ValidationError("messages.0.content.str: Input should be a valid string"), 400, "invalid_request_error",
         "messages.0.content"),
        (ValidationError("stop_token_ids must be in [0, 512); got [999]"), 400, "invalid_request_error",
         "stop_token_ids"),
        (ValidationError("body must be JSON"), 400, "invalid_request_error", "body"),
        (ValidationError("the prompt is empty"), 400, "invalid_request_error", None),
        (PromptTooLongError(prompt_tokens=600, max_tokens=16, max_model_len=512), 400, "invalid_request_error",
         "prompt"),
        (NotFoundError("model", "gpt-4"), 404, "invalid_request_error", "model"),
        (OverloadedError("queue full", retry_after_s=2.5), 429, "rate_limit_error", None),
        (UnavailableError("engine down"), 503, "service_unavailable_error", None),
    ],
)
def test_error_document_has_openais_shape(exc: Exception, status: int, kind: str, param: str | None) -> None:
    body = error_body(exc)  # type: ignore[arg-type]
    assert (body["code"], body["type"], body["param"]) == (status, kind, param)
    assert body["message"] == str(exc)
    resp = error_response(exc)  # type: ignore[arg-type]
    assert resp.status_code == status and json.loads(bytes(resp.body))["error"] == body


def test_overload_and_outage_say_when_to_retry() -> None:
    overloaded = error_response(OverloadedError("queue full", retry_after_s=2.5))
    assert overloaded.headers["Retry-After"] == "3" and json.loads(bytes(overloaded.body))["error"]["retry_after_s"]
    assert int(error_response(UnavailableError("down")).headers["Retry-After"]) >= 1


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("stop", "list[constrained-str]", 0), "stop.0"),
        (("stop", "constrained-str"), "stop"),
        (("prompt", "str"), "prompt"),
        (("messages", 0, "content", "list[TextPart]", 0, "type"), "messages.0.content.0.type"),
        (("tool_choice", "dict[str,any]"), "tool_choice"),
        (("stream_options", "include_usage"), "stream_options.include_usage"),
        (("logit_bias", "-5"), "logit_bias.-5"),
    ],
)
def test_a_pydantic_loc_reads_as_its_field_path_without_union_tags(loc: tuple[int | str, ...], path: str) -> None:
    assert loc_path(loc) == path


def test_http_errors_use_the_same_shape() -> None:
    assert http_error_body(404, "Not Found") == {"message": "Not Found", "type": "invalid_request_error",
                                                 "param": None, "code": 404}
    assert http_error_body(500, "boom")["type"] == "server_error"


# ------------------------------------------------------------------ chat requests


def test_chat_request_joins_text_parts_and_keeps_names() -> None:
    req = ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "u1"},
        {"role": "assistant", "content": None},
    ]})
    assert req.template_messages() == [{"role": "user", "content": "a\nb", "name": "u1"},
                                       {"role": "assistant", "content": ""}]
    assert req.token_limit is None and req.add_generation_prompt


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"messages": [{"role": "robot", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        {"messages": [{"role": "user", "content": "x"}], "n": 33},
        {"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 0.001},
    ],
)
def test_chat_request_refuses_what_it_cannot_serve(body: dict[str, object]) -> None:
    with pytest.raises(PydanticValidationError):
        ChatCompletionRequest.model_validate(body)


def test_chat_request_checks_what_types_cannot() -> None:
    asks = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                                                 "top_logprobs": 2})
    asks.check()
    assert asks.sampling_params(4).logprobs == 2
    assert ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}],
                                                 "logprobs": True}).sampling_params(4).logprobs == 0
    with pytest.raises(ValidationError, match="top_logprobs: needs logprobs"):
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}],
                                              "top_logprobs": 2}).check()
    both = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3,
                                                 "max_completion_tokens": 4})
    both.check()  # vLLM takes max_completion_tokens, OpenAI's newer name, over max_tokens
    assert both.token_limit == 4
    one = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}],
                                                "max_completion_tokens": 4})
    one.check()
    assert one.token_limit == 4


# ------------------------------------------------------------------ chat templates


def test_the_random_checkpoints_template_renders_as_transformers_does(tmp_path: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    assert write_tokenizer(tmp_path, 512, max_model_len=256)
    template = load_chat_template(tmp_path)
    assert template is not None
    hf = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    for add in (True, False):
        ours = template.render(MESSAGES, add_generation_prompt=add)
        theirs = hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=add)
        assert ours == theirs
    assert ours.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    # The special tokens are single tokens, as in the real model's tokenizer.
    ids = HFTokenizer(tmp_path / "tokenizer.json").encode(template.render(MESSAGES[:1]))
    assert ids[0] == 512 - 2 and ids.count(512 - 1) == 1


def test_templates_get_special_tokens_and_can_refuse(tmp_path: Path) -> None:
    source = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}"
              "{{ raise_exception('no tools') }}{% endif %}{{ m['content'] | tojson }}{% endfor %}{{ eos_token }}")
    config = {"chat_template": [{"name": "default", "template": source}, {"name": "rag", "template": "x"}],
              "bos_token": {"content": "<s>", "special": True}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    template = load_chat_template(tmp_path)
    assert template is not None
    assert template.render([{"role": "user", "content": "é"}]) == '<s>"é"</s>'
    with pytest.raises(ValidationError, match="no tools"):
        template.render([{"role": "tool", "content": "x"}])
    (tmp_path / "chat_template.jinja").write_text("{{ messages | length }}")
    file_template = load_chat_template(tmp_path)
    assert file_template is not None and file_template.render(MESSAGES) == "4"


def test_no_template_and_a_broken_template(tmp_path: Path) -> None:
    assert load_chat_template(tmp_path) is None
    with pytest.raises(ValidationError, match="does not compile"):
        ChatTemplate("{% for %}").render(MESSAGES)


# ------------------------------------------------------------------ the random checkpoint's tokenizer


@pytest.mark.parametrize("vocab_size", [MIN_VOCAB_SIZE, 512, 4096, 20000])
def test_trained_tokenizer_has_the_models_vocab_size_and_specials_last(vocab_size: int) -> None:
    tok = train_tokenizer(vocab_size)
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(vocab_size - 3, vocab_size))
    # Every id decodes (reserved padding and specials to nothing): a random model may sample any of them.
    assert isinstance(tok.decode(list(range(vocab_size))), str)


def test_training_is_deterministic_and_text_round_trips(tmp_path: Path) -> None:
    assert train_tokenizer(4096).to_str() == train_tokenizer(4096).to_str()
    assert write_tokenizer(tmp_path, 4096, max_model_len=1024)
    tok = load_tokenizer(tmp_path, vocab_size=4096)
    assert isinstance(tok, HFTokenizer) and tok.vocab_size == 4096
    text = "The engine schedules requests; the router routes them. Ünïcode ✓ and emoji 🙂 too."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()) / 2  # merges: prompts count in tokens, not bytes
    stream = tok.stream()
    assert "".join(stream.step(t) for t in ids) == text


def test_a_vocabulary_too_small_for_merges_keeps_the_byte_tokenizer(tmp_path: Path) -> None:
    assert not write_tokenizer(tmp_path, MIN_VOCAB_SIZE - 1, max_model_len=64)
    assert not (tmp_path / "tokenizer.json").exists()
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(MIN_VOCAB_SIZE - 1)


def test_an_explicit_null_asks_for_the_default() -> None:
    # OpenAI's schema marks these nullable; SDKs and proxies send null for a field left unset.
    nulls = dict.fromkeys(("temperature", "top_p", "n", "stream", "presence_penalty", "frequency_penalty"))
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], **nulls,
                                                 "max_tokens": None})  # fmt: skip
    assert (chat.temperature, chat.top_p, chat.n, chat.stream, chat.max_tokens) == (1.0, 1.0, 1, False, None)
    completion = CompletionRequest.model_validate({"prompt": "x", **nulls, "max_tokens": None, "echo": None})
    assert (completion.max_tokens, completion.echo, completion.presence_penalty) == (16, False, 0.0)
    with pytest.raises(PydanticValidationError):  # null is not a prompt
        CompletionRequest.model_validate({"prompt": None})


def test_an_explicit_null_in_a_field_the_engine_does_not_implement_asks_for_nothing() -> None:
    # The SDK sends ``tools: null`` for ``tools=None`` (``tools=tools or None``); null asks for nothing.
    nulls = dict.fromkeys(("tools", "functions", "service_tier", "reasoning_effort", "function_call", "x"))
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x", "weight": None}],
                                                 **nulls})  # fmt: skip
    chat.check()
    assert chat.template_messages() == [{"role": "user", "content": "x"}]
    CompletionRequest.model_validate({"prompt": "x", "service_tier": None, "x": None}).check()
    # A value is still refused by name.
    with pytest.raises(PydanticValidationError, match="tools"):
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], "tools": []})
    with pytest.raises(PydanticValidationError, match="weight"):
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x", "weight": 0}]})


def test_a_whole_number_float_is_taken_as_the_integer_as_vllm_takes_it() -> None:
    whole = {"n": 2.0, "seed": 7.0, "top_k": 3.0, "min_tokens": 1.0}
    chat = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}], **whole,
                                                 "max_tokens": 5.0, "logprobs": True, "top_logprobs": 2.0})
    assert (chat.n, chat.seed, chat.top_k, chat.min_tokens, chat.max_tokens, chat.top_logprobs) == (2, 7, 3, 1, 5, 2)
    assert isinstance(chat.max_tokens, int)
    assert ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}],
                                                 "max_completion_tokens": 4.0}).token_limit == 4
    completion = CompletionRequest.model_validate({"prompt": "x", **whole, "max_tokens": 0.0, "echo": True,
                                                   "best_of": 2.0, "logprobs": 1.0})
    assert (completion.n, completion.max_tokens, completion.best_of, completion.logprobs) == (2, 0, 2, 1)
    # A fraction, a string, a boolean and a float past the bounds are still refused, as are float token ids.
    for field, value in (("max_tokens", 5.5), ("max_tokens", "5"), ("max_tokens", True), ("n", 33.0),
                         ("seed", 2.0**64), ("prompt", [1.0]), ("stop_token_ids", [1.0])):
        with pytest.raises(PydanticValidationError, match=field):
            CompletionRequest.model_validate({"prompt": "x", field: value})
