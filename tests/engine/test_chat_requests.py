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
