"""What a chat request may carry, as vLLM accepts it, and the prompt the route renders from it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine.chat_template import ChatTemplate
from engine.server import create_app
from engine.tokenizer import ByteTokenizer
from tests.engine.recording_engine import RecordingEngine

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if enable_thinking %}<think>{% endif %}{% if add_generation_prompt %}<assistant>{% endif %}")


def rendered(body: dict[str, Any], template: str = TEMPLATE) -> tuple[int, str | None, dict[str, Any]]:
    """(status, the prompt the engine got or None, the error document) of a chat request."""
    engine = RecordingEngine()
    app = create_app(engine, ByteTokenizer(512), model_name="m",  # type: ignore[arg-type]
                     chat_template=ChatTemplate(template))
    response = TestClient(app).post("/v1/chat/completions", json=body)
    return response.status_code, ([ByteTokenizer(512).decode(p) for p in engine.prompts] or [None])[0], response.json()


USER = [{"role": "user", "content": "hi"}]


def test_chat_template_kwargs_reach_the_template_and_the_requests_own_fields_win() -> None:
    assert rendered({"messages": USER, "chat_template_kwargs": {"enable_thinking": True, "unused": 1}})[1] \
        == "<user>hi<think><assistant>"
    assert rendered({"messages": USER, "chat_template_kwargs": None})[1] == "<user>hi<assistant>"
    # add_generation_prompt is the request's (vLLM merges the request's fields over the kwargs).
    assert rendered({"messages": USER, "add_generation_prompt": False,
                     "chat_template_kwargs": {"add_generation_prompt": True}})[1] == "<user>hi"
    assert rendered({"messages": USER, "chat_template_kwargs": {"bos_token": "<s>"}},
                    "{{ bos_token }}{{ messages[0]['content'] }}")[1] == "<s>hi"


def test_chat_template_kwargs_the_template_cannot_use_are_a_400_not_a_500() -> None:
    """``self`` collided with jinja's render(self, ...); a number where the template adds strings raised a
    TypeError: both were 500s with a traceback, where vLLM answers 400."""
    assert rendered({"messages": USER, "chat_template_kwargs": {"self": 1}})[1] == "<user>hi<assistant>"
    status, prompt, body = rendered({"messages": USER, "chat_template_kwargs": {"bos_token": 5}},
                                    "{{ bos_token + messages[0]['content'] }}")
    assert (status, prompt, body["error"]["param"]) == (400, None, "chat_template_kwargs")
    assert "TypeError" in body["error"]["message"]


@pytest.mark.parametrize("key", ["chat_template", "tokenize", "messages"])
def test_chat_template_kwargs_that_would_replace_the_render_are_refused(key: str) -> None:
    status, prompt, body = rendered({"messages": USER, "chat_template_kwargs": {key: "x"}})
    assert (status, prompt, body["error"]["param"]) == (400, None, "chat_template_kwargs")
    assert key in body["error"]["message"]


def test_openais_store_metadata_and_parallel_tool_calls_are_accepted_and_ignored() -> None:
    body = {"messages": USER, "store": True, "metadata": {"team": "a"}, "parallel_tool_calls": False}
    assert rendered(body)[1] == "<user>hi<assistant>"
    assert rendered({**body, "store": None, "metadata": None, "parallel_tool_calls": None})[1] == "<user>hi<assistant>"
    # vLLM reads neither store nor metadata, so any value passes; parallel_tool_calls is a boolean.
    assert rendered({"messages": USER, "store": "yes", "metadata": {"n": 1}})[1] == "<user>hi<assistant>"
    status, prompt, error = rendered({"messages": USER, "parallel_tool_calls": "maybe"})
    assert (status, prompt, error["error"]["param"]) == (400, None, "parallel_tool_calls")


TOOL_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}"
                 "{% for c in m.get('tool_calls') or [] %}[{{ c['id'] }} {{ c['function']['name'] }}"
                 "{{ c['function']['arguments'] | tojson }}]{% endfor %}"
                 "{% if m.get('tool_call_id') %}({{ m['tool_call_id'] }}){% endif %};{% endfor %}")


def _call(arguments: str, call_id: str = "c1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "f", "arguments": arguments}, "index": 0}


def test_tool_calls_and_tool_results_render_through_the_template_as_vllm_passes_them() -> None:
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [_call('{"x": 1}'), _call("", "c2")]},
                {"role": "tool", "content": [{"type": "text", "text": "4"}], "tool_call_id": "c1"}]
    # Arguments reach the template parsed (a JSON object); an empty string is {}, as in vLLM.
    assert rendered({"messages": messages}, TOOL_TEMPLATE)[1] \
        == 'user:hi;assistant:[c1 f{"x": 1}][c2 f{}];tool:4(c1);'
    # Arguments that are not a JSON object reach it as {}; an empty list of calls is dropped.
    for bad in ("not json", "[1, 2]"):
        odd = [{"role": "assistant", "content": "a", "tool_calls": [_call(bad)]}]
        assert rendered({"messages": odd}, TOOL_TEMPLATE)[1] == "assistant:a[c1 f{}];"
    assert rendered({"messages": [{"role": "assistant", "content": "a", "tool_calls": []}]},
                    "{{ messages[0].get('tool_calls') is none }}")[1] == "True"


@pytest.mark.parametrize(
    ("call", "param"),
    [({"id": "c1", "type": "custom", "custom": {"name": "f", "input": ""}}, "messages.0.tool_calls.0.type"),
     ({"id": "c1", "function": {"name": "f", "arguments": "{}"}}, "messages.0.tool_calls.0.type"),
     ({"type": "function", "function": {"name": "f", "arguments": "{}"}}, "messages.0.tool_calls.0.id")],
)
def test_tool_calls_vllm_refuses_are_refused(call: dict[str, Any], param: str) -> None:
    status, prompt, body = rendered({"messages": [{"role": "assistant", "tool_calls": [call]}]}, TOOL_TEMPLATE)
    assert (status, prompt, body["error"]["param"]) == (400, None, param)


REASONING_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}:{{ m['content'] }}"
                      "{% if m.get('reasoning') %}[{{ m['reasoning'] }}|{{ m['reasoning_content'] }}]{% endif %};"
                      "{% endfor %}")


def test_a_reply_sent_back_as_the_sdk_dumps_it_is_accepted_as_vllm_accepts_it() -> None:
    """The SDK's ``message.model_dump()`` carries refusal, annotations, audio and function_call (vLLM ignores
    them); a reasoning model's reply carries ``reasoning_content``, which vLLM hands the template as
    ``reasoning`` (and ``reasoning_content``)."""
    dumped = {"role": "assistant", "content": "yo", "refusal": None, "annotations": [], "audio": None,
              "function_call": None, "tool_calls": None, "reasoning_content": "think"}
    messages = [*USER, dumped, {"role": "user", "content": "more"}]
    assert rendered({"messages": messages}, REASONING_TEMPLATE)[1] == "user:hi;assistant:yo[think|think];user:more;"
    refused = {**dumped, "content": None, "refusal": "no", "reasoning_content": None, "reasoning": "r",
               "audio": {"id": "a1"}, "function_call": {"name": "f", "arguments": "{}"}}
    assert rendered({"messages": [*USER, refused]}, REASONING_TEMPLATE)[1] == "user:hi;assistant:[r|r];"
    # Reasoning reaches the template on an assistant's message only, as in vLLM.
    assert rendered({"messages": [{"role": "user", "content": "hi", "reasoning": "r"}]},
                    REASONING_TEMPLATE)[1] == "user:hi;"


def test_a_message_key_the_template_would_read_is_still_refused_by_name() -> None:
    status, prompt, body = rendered({"messages": [{"role": "developer", "content": "x", "tools": [{"x": 1}]}]})
    assert (status, prompt, body["error"]["param"]) == (400, None, "messages.0.tools")


def test_max_completion_tokens_wins_over_max_tokens_as_in_vllm() -> None:
    engine = RecordingEngine()
    app = create_app(engine, ByteTokenizer(512), model_name="m",  # type: ignore[arg-type]
                     chat_template=ChatTemplate(TEMPLATE))
    TestClient(app).post("/v1/chat/completions", json={"messages": USER, "max_tokens": 4, "max_completion_tokens": 8})
    assert [params.max_tokens for params in engine.params] == [8]


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def test_tools_with_tool_choice_none_reach_the_template_as_vllm_passes_them() -> None:
    """vLLM hands a request's tools to the chat template when it calls none (``tool_choice: "none"``); they were
    refused.  Left out, ``tool_choice`` means "auto" there, and an empty list is refused, as here."""
    template = "{{ tools | length if tools is defined else 'no' }} tools;{{ messages[0]['content'] }}"
    assert rendered({"messages": USER, "tools": TOOLS, "tool_choice": "none"}, template)[1] == "1 tools;hi"
    assert rendered({"messages": USER}, template)[1] == "no tools;hi"
    for body in ({"messages": USER, "tools": TOOLS}, {"messages": USER, "tools": [], "tool_choice": "none"}):
        status, prompt, error = rendered(body, template)
        assert (status, prompt, error["error"]["param"]) == (400, None, "tools")


@pytest.mark.parametrize(("effort", "kwargs", "prompt"), [
    ("none", None, "<user>hi<assistant>"),
    ("high", None, "<user>hi<think><assistant>"),
    ("none", {"enable_thinking": True}, "<user>hi<think><assistant>"),  # the request's kwargs say it
])
def test_reasoning_effort_reaches_the_template_with_enable_thinking_as_in_vllm(
    effort: str, kwargs: dict[str, Any] | None, prompt: str
) -> None:
    """A Qwen3 client's ``reasoning_effort`` was a 400; vLLM passes it, and ``enable_thinking`` unless set."""
    assert rendered({"messages": USER, "reasoning_effort": effort, "chat_template_kwargs": kwargs})[1] == prompt
    assert rendered({"messages": USER, "reasoning_effort": effort}, "{{ reasoning_effort }}")[1] == effort


def test_vllms_extensions_at_their_defaults_are_served_and_other_values_refused_by_name() -> None:
    defaults = {"include_stop_str_in_output": False, "skip_special_tokens": True,
                "spaces_between_special_tokens": True, "continue_final_message": False, "echo": False,
                "service_tier": "auto"}
    assert rendered({"messages": USER, **defaults})[1] == "<user>hi<assistant>"
    for name, value in (("include_stop_str_in_output", True), ("skip_special_tokens", False), ("echo", True),
                        ("continue_final_message", True)):
        status, prompt, error = rendered({"messages": USER, name: value})
        assert (status, prompt, error["error"]["param"]) == (400, None, name)
