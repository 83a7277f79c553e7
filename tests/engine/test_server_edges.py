"""The API at its edges against the served engine: odd inputs are 400s naming their field (never 500s), an
unexpected error leaves the connection usable, the details OpenAI clients rely on (one ``created`` per response),
and vLLM's ``/tokenize`` and ``/detokenize``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engine.test_server import MODEL, Served, serve
from tests.engine.test_server_hardening import _is_error_document

pytestmark = pytest.mark.integration

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
COMPLETION = {"prompt": "hi", "max_tokens": 1}


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path) -> Iterator[Served]:
    server, engine = serve(tiny_checkpoint)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield Served(server.url, engine, client)
    server.stop()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("key", ["--5", "-", "5-", "\u00b2", "\u2460", "\uff15", "\u0665", " 5", "5\n", "1" * 5000, ""])
def test_logit_bias_keys_that_are_not_ascii_integers_are_400_naming_the_field(
    served: Served, route: str, key: str
) -> None:
    base = COMPLETION if route == "/v1/completions" else CHAT
    resp = served.client.post(route, json={**base, "logit_bias": {key: 1}})
    assert resp.status_code == 400, resp.text
    error = _is_error_document(resp)
    assert error["param"] == "logit_bias" and "token ids" in str(error["message"])


HUGE = 2**64
"""Past what msgpack carries to the engine core (an unbounded integer there was a 500)."""


@pytest.mark.parametrize(
    ("route", "field", "value"),
    [
        ("/v1/completions", "top_k", HUGE),
        ("/v1/completions", "top_k", -HUGE),
        ("/v1/chat/completions", "top_k", HUGE),
        ("/v1/completions", "top_k", 2**31),
        ("/v1/completions", "seed", HUGE),
        ("/v1/completions", "seed", -HUGE),
        ("/v1/chat/completions", "seed", HUGE),
        ("/v1/completions", "n", HUGE),
        ("/v1/completions", "best_of", HUGE),
        ("/v1/completions", "logprobs", HUGE),
        ("/v1/completions", "min_tokens", HUGE),
        ("/v1/chat/completions", "min_tokens", HUGE),
        ("/v1/chat/completions", "top_logprobs", HUGE),
        ("/v1/completions", "stop_token_ids", [HUGE]),
        ("/v1/completions", "stop_token_ids", [-HUGE]),
        ("/v1/completions", "logit_bias", {str(HUGE): 1}),
        ("/v1/chat/completions", "logit_bias", {str(-HUGE): 1}),
        ("/v1/completions", "prompt", [HUGE]),
        ("/v1/completions", "prompt", [[1], [-HUGE]]),
    ],
)
def test_integers_past_64_bits_are_400_naming_the_field(served: Served, route: str, field: str, value: object) -> None:
    base = COMPLETION if route == "/v1/completions" else CHAT
    resp = served.client.post(route, json={**base, field: value})
    assert resp.status_code == 400, resp.text
    assert _is_error_document(resp)["param"] == field


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("stop", [[""], "", ["x" * 300], [1], {"a": 1}])
def test_a_refused_stop_names_stop_without_the_unions_type_tags(served: Served, route: str, stop: object) -> None:
    """pydantic's loc names each member of ``str | list[str]`` it tried (``stop.list[constrained-str].0``)."""
    base = COMPLETION if route == "/v1/completions" else CHAT
    resp = served.client.post(route, json={**base, "stop": stop})
    assert resp.status_code == 400, resp.text
    error = _is_error_document(resp)
    assert error["param"] == "stop", error
    assert all(problem.split(":")[0] in ("stop", "stop.0") for problem in error["problems"]), error


def test_an_unknown_field_is_named_as_sent(served: Served) -> None:
    resp = served.client.post("/v1/chat/completions", json={**CHAT, "top-k": 1, "messages": [
        {"role": "user", "content": "hi", "x-y": 1}]})
    assert resp.status_code == 400, resp.text
    assert sorted(_is_error_document(resp)["problems"]) == ["messages.0.x-y: not supported by this engine",
                                                           "top-k: not supported by this engine"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_max_tokens_past_64_bits_is_a_400_naming_it_not_a_500(served: Served, route: str) -> None:
    """Past the model's context it is refused, as vLLM refuses it (one within it is cut to the prompt's room)."""
    base = {"prompt": "hi"} if route == "/v1/completions" else {"messages": CHAT["messages"]}
    resp = served.client.post(route, json={**base, "max_tokens": HUGE, "ignore_eos": True})
    assert resp.status_code == 400, resp.text
    assert _is_error_document(resp)["param"] == "max_tokens"


def test_an_unexpected_error_is_a_500_document_and_the_keep_alive_connection_serves_the_next_request(
    served: Served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("a bug of ours")

    def local_port(resp: httpx.Response) -> int:
        return int(resp.extensions["network_stream"].get_extra_info("client_addr")[1])

    monkeypatch.setattr(served.engine, "check_prompt_ids", boom)
    with httpx.Client(base_url=served.url, timeout=60) as client:
        failed = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 1})
        ports = {local_port(failed)}
        monkeypatch.undo()
        served_next = client.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 1})
        ports.add(local_port(served_next))
    assert failed.status_code == 500, failed.text
    assert _is_error_document(failed)["type"] == "server_error" and "a bug of ours" not in failed.text
    assert failed.headers.get("connection") != "close"
    assert served_next.status_code == 200, served_next.text
    assert len(ports) == 1, "the second request needed a new connection"
    logged = [r for r in caplog.records if r.name == "contracts.asgi" and r.exc_info is not None]
    assert logged and "a bug of ours" in str(logged[0].exc_info[1])  # type: ignore[index]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_stream_options_without_stream_is_400_naming_it_as_in_openai_and_vllm(served: Served, route: str) -> None:
    base = COMPLETION if route == "/v1/completions" else CHAT
    for extra in ({}, {"stream": False}, {"stream": None}):
        resp = served.client.post(route, json={**base, **extra, "stream_options": {"include_usage": True}})
        assert resp.status_code == 400, (extra, resp.text)
        assert _is_error_document(resp)["param"] == "stream_options"
    # null is "unset", as vLLM takes it; with stream: true it is served.
    assert served.client.post(route, json={**base, "stream_options": None}).status_code == 200
    streamed = served.client.post(route, json={**base, "stream": True, "stream_options": {"include_usage": True}})
    assert streamed.status_code == 200 and '"usage"' in streamed.text


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b'{"prompt": "hi", "max_tokens":', "at character 30"),
        (b"{not json", "at character 1"),
        (b'{"prompt": "hi", "top_k": 1' + b"0" * 5000 + b"}", "digits"),
        (b'{"prompt": "\xff"}', "utf-8"),
    ],
)
def test_a_body_that_is_not_json_is_400_naming_the_body_and_where(served: Served, content: bytes, needle: str) -> None:
    resp = served.client.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    error = _is_error_document(resp)
    assert error["param"] == "body" and str(error["message"]).startswith("body: not valid JSON")
    assert needle in str(error["message"])


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_every_chunk_of_a_stream_carries_the_requests_one_created_time(served: Served, route: str) -> None:
    base = {"prompt": "hi"} if route == "/v1/completions" else {"messages": CHAT["messages"]}
    payload = {**base, "max_tokens": 40, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    served.engine.set_step_delay(0.03)  # 40 steps: the stream spans more than a second
    try:
        resp = served.client.post(route, json=payload)
    finally:
        served.engine.set_step_delay(0.0)
    assert resp.status_code == 200, resp.text
    events = [json.loads(line[6:]) for line in resp.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert len(events) >= 41 and "usage" in events[-1]
    assert len({event["created"] for event in events}) == 1


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_a_prompt_too_long_is_refused_with_the_rule_the_server_applies(served: Served, route: str) -> None:
    """``max_tokens`` is cut to fit, so only the prompt's length can be at fault: the message says so (as vLLM's
    does), and names no ``max_tokens`` (a chat that sent none had one made up in it)."""
    n = served.engine.max_model_len
    fits = {"prompt": [5] * (n - 1), "max_tokens": 100} if route == "/v1/completions" \
        else {"messages": [{"role": "user", "content": "hi"}], "max_tokens": n}
    assert served.client.post(route, json=fits).status_code == 200
    body = {"prompt": [5] * n, "max_tokens": 1} if route == "/v1/completions" \
        else {"messages": [{"role": "user", "content": "hello world " * n}]}
    resp = served.client.post(route, json=body)
    assert resp.status_code == 400, resp.text
    message = str(_is_error_document(resp)["message"])
    assert message.startswith(f"This model's maximum context length is {n} tokens. However, your prompt contains ")
    assert f"at most {n - 1} tokens" in message and "max_tokens" not in message


# ------------------------------------------------------------------ vLLM's /tokenize and /detokenize

TOKENIZE_MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]


def _post(served: Served, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = served.client.post(path, json=body)
    assert resp.status_code == 200, resp.text
    answer: dict[str, Any] = resp.json()
    return answer


def test_a_prompts_tokens_are_those_a_completion_counts_and_detokenize_gives_the_text_back(served: Served) -> None:
    prompt = "Once upon a time, in a land"
    answer = _post(served, "/tokenize", {"model": MODEL, "prompt": prompt, "add_special_tokens": True})
    tokens = answer["tokens"]
    assert answer == {"count": len(tokens), "max_model_len": 512, "tokens": tokens}
    completion = _post(served, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert completion["usage"]["prompt_tokens"] == len(tokens) < len(prompt)
    assert _post(served, "/tokenize", {"prompt": prompt})["tokens"] == tokens  # model may be left out
    assert _post(served, "/detokenize", {"model": MODEL, "tokens": tokens}) == {"prompt": prompt}


def test_a_chats_tokens_are_its_rendered_prompts(served: Served) -> None:
    answer = _post(served, "/tokenize", {"model": MODEL, "messages": TOKENIZE_MESSAGES})
    chat = _post(served, "/v1/chat/completions", {"model": MODEL, "messages": TOKENIZE_MESSAGES, "max_tokens": 1})
    assert answer["count"] == len(answer["tokens"]) == chat["usage"]["prompt_tokens"]
    text = _post(served, "/detokenize", {"tokens": answer["tokens"]})["prompt"]
    assert text.startswith("<|im_start|>system\nBe brief.") and text.endswith("<|im_start|>assistant\n")
    bare = _post(served, "/tokenize", {"messages": TOKENIZE_MESSAGES, "add_generation_prompt": False})
    assert bare["count"] < answer["count"]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "other", "prompt": "hi"}, 404, "model"),
        ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model"),
        ("/tokenize", {"prompt": "hi", "messages": TOKENIZE_MESSAGES}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": "hi", "add_generation_prompt": True}, 400, "add_generation_prompt"),
        ("/tokenize", {"prompt": "\ud800"}, 400, "prompt"),
        ("/tokenize", {"messages": TOKENIZE_MESSAGES, "chat_template_kwargs": {"messages": 1}}, 400,
         "chat_template_kwargs"),
        ("/tokenize", {"prompt": "hi", "return_token_strs": True}, 400, "return_token_strs"),
        ("/detokenize", {"tokens": [1, 512]}, 400, "tokens"),
        ("/detokenize", {"tokens": [1 << 70]}, 400, "tokens"),
        ("/detokenize", {"tokens": ["1"]}, 400, "tokens.0"),
    ],
)
def test_a_tokenize_or_detokenize_request_it_cannot_serve_is_refused_naming_its_field(
    served: Served, path: str, body: dict[str, Any], status: int, param: str,
) -> None:
    resp = served.client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert resp.status_code == status, resp.text
    assert _is_error_document(resp)["param"] == param
