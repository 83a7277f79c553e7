"""OpenAI's chat completion request as this engine serves it, and its messages as plain dicts.

A message's ``content`` is a string, ``null``, or a list of parts of which
only ``{"type": "text", "text": ...}`` is served (joined with newlines, as
vLLM does for text-only models).  An assistant's ``tool_calls`` (functions) and
a ``tool`` message's ``tool_call_id`` reach the chat template as vLLM passes
them (each call's ``arguments`` parsed from JSON).  ``max_tokens`` and OpenAI's newer
``max_completion_tokens`` mean the same (sent both, the latter counts, as in
vLLM); left out, the completion may fill the context.  ``add_generation_prompt``
(vLLM's extension, default true) ends the rendered prompt with the assistant's
turn opening.  ``logprobs: true`` (with
``top_logprobs`` alternatives) reports the generated tokens' log-probabilities.
``chat_template_kwargs`` (vLLM's extension) are more variables for the chat
template, as vLLM passes them (``enable_thinking``, ...).
``tools`` (with ``tool_choice`` "none": none is called; left out, it means
"auto", as in vLLM, which is refused) and ``reasoning_effort`` reach the template as vLLM passes them (the
latter with ``enable_thinking`` false for "none", unless the kwargs set it).
``store``, ``metadata``, ``parallel_tool_calls`` and ``service_tier`` are
accepted and ignored, as vLLM does; vLLM's ``continue_final_message`` and
``echo`` only at false.  Tool calling and the other fields this engine does not
implement are refused by name (400).

A reply sent back in the history as the SDK dumps it is served as vLLM serves
it: its ``refusal``, ``annotations``, ``audio`` and ``function_call`` are
ignored (vLLM hands none of them to the template), and an assistant's
``reasoning`` (or the older ``reasoning_content``) reaches the template as
both, for templates of reasoning models.  Other message keys are refused by
name (``null`` asks for nothing and is dropped): vLLM would hand some to the
template (a developer's ``tools``), which this engine does not.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationInfo, field_validator, model_validator

from engine.protocol import MODEL_DEFAULTED, NO_OP_VALUES, WHOLE, GenerationRequest, without_nulls
from engine.sampling import MAX_LOGPROBS

RESERVED_TEMPLATE_KWARGS = frozenset({"chat_template", "tokenize", "messages"})
"""``chat_template_kwargs`` keys that would replace the render itself (vLLM refuses them too)."""

Role = Literal["system", "developer", "user", "assistant", "tool"]


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str


class ToolCall(BaseModel):
    """A call an assistant made (only functions, as vLLM serves them); other keys (a streamed ``index``) ignored."""

    model_config = ConfigDict(extra="ignore")

    id: str
    type: Literal["function"]
    function: FunctionCall

    def as_template_input(self) -> dict[str, Any]:
        """As vLLM hands it to a template: a non-empty ``arguments`` parsed, and anything but an object is {}."""
        arguments: Any = self.function.arguments
        if not arguments:
            arguments = {}  # vLLM hands an empty string on as {}
        else:
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = {}
            arguments = arguments if isinstance(arguments, dict) else {}
        return {"id": self.id, "type": self.type, "function": {"name": self.function.name, "arguments": arguments}}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    """An assistant's calls (ignored on other roles, as in vLLM)."""
    tool_call_id: str | None = None
    """The call a ``tool`` message answers (ignored on other roles, as in vLLM)."""
    reasoning: str | None = None
    """An assistant's reasoning, for the template (ignored on other roles, as in vLLM)."""
    reasoning_content: str | None = None
    """The older name of ``reasoning`` (vLLM renames it; ``reasoning`` wins)."""
    # The keys of OpenAI's response message, sent back in the history: vLLM reads none of them.
    refusal: Any = None
    annotations: Any = None
    audio: Any = None
    function_call: Any = None

    @model_validator(mode="before")
    @classmethod
    def _null_asks_for_nothing(cls, data: Any) -> Any:
        """A key this engine does not declare, sent as ``null``, is dropped rather than refused."""
        return without_nulls(data, (), cls.model_fields)

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)

    def as_template_input(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.role == "assistant" and self.tool_calls:
            message["tool_calls"] = [call.as_template_input() for call in self.tool_calls]
        reasoning = self.reasoning if self.reasoning is not None else self.reasoning_content
        if self.role == "assistant" and reasoning is not None:
            message["reasoning"] = message["reasoning_content"] = reasoning  # both names, as vLLM passes them
        if self.role == "tool" and "tool_call_id" in self.model_fields_set:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(GenerationRequest):
    """The subset of OpenAI's chat completion request the engine serves (one choice, text only)."""

    no_op_values: ClassVar[dict[str, tuple[Any, ...]]] = {
        "tool_choice": (None, "none"), "continue_final_message": (None, False), "echo": (None, False), **NO_OP_VALUES,
    }

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(strict=True, ge=1), WHOLE] | None = None
    max_completion_tokens: Annotated[int, Field(strict=True, ge=1), WHOLE] | None = None
    add_generation_prompt: StrictBool = True
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS), WHOLE] | None = None
    tool_choice: str | dict[str, Any] | None = None
    """Accepted only as "none" (no tools are called; see no_op_values)."""
    tools: list[dict[str, Any]] | None = None
    """Handed to the chat template, as vLLM does with ``tool_choice`` "none": none is called."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    """Handed to the chat template, with ``enable_thinking`` (false for "none") unless chat_template_kwargs set it."""
    # Accepted only at their no-op values (see no_op_values; vLLM's extensions).
    continue_final_message: StrictBool | None = None
    echo: StrictBool | None = None
    # OpenAI's fields that vLLM accepts and ignores (no stored completions; no tools to call; one tier).
    store: Any = None
    metadata: Any = None
    parallel_tool_calls: bool | None = None
    service_tier: Any = None
    chat_template_kwargs: dict[str, Any] | None = None
    """More variables for the chat template (vLLM's extension); the request's own fields win over them."""

    @field_validator("tools")
    @classmethod
    def _tools_only_for_the_template(cls, tools: list[dict[str, Any]] | None, info: ValidationInfo) -> Any:
        """As vLLM without auto tool choice: tools with ``tool_choice`` "none" only (left out, it means "auto"),
        and never an empty list."""
        if tools is not None and (not tools or info.data.get("tool_choice") != "none"):
            raise ValueError('served only with tool_choice "none" (the template reads them, no tool is called) and '
                             "not empty; tool calling is not implemented by this engine")
        return tools

    def template_variables(self) -> dict[str, Any]:
        """``chat_template_kwargs`` with the request's ``tools`` and ``reasoning_effort``, merged as vLLM does."""
        variables = dict(self.chat_template_kwargs or {})
        if self.tools is not None:
            variables["tools"] = self.tools
        if self.reasoning_effort is not None:
            variables.setdefault("enable_thinking", self.reasoning_effort != "none")
            variables["reasoning_effort"] = self.reasoning_effort
        return variables

    def texts(self) -> list[tuple[str, str]]:
        own = [(f"messages.{i}.content", m.text) for i, m in enumerate(self.messages)]
        return own + super().texts()

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.top_logprobs and not self.logprobs:
            problems.append("top_logprobs: needs logprobs: true")
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(self.chat_template_kwargs or {}))
        if reserved:
            problems.append(f"chat_template_kwargs: may not set {', '.join(reserved)}")
        return problems

    def defaulted_fields(self) -> frozenset[str]:
        """A chat's ``max_tokens`` too (generation_config's ``max_new_tokens``), unless it sent either limit."""
        if self.token_limit is not None:
            return MODEL_DEFAULTED
        return MODEL_DEFAULTED | {"max_tokens"}

    @property
    def logprob_alternatives(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def token_limit(self) -> int | None:
        """The most tokens to generate (None: as many as the context leaves)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.as_template_input() for m in self.messages]


__all__ = ["ChatCompletionRequest", "ChatMessage", "FunctionCall", "TextPart", "ToolCall"]
