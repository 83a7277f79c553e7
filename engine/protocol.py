"""The OpenAI completion request as this engine serves it, and stop strings.

:class:`CompletionRequest` is strict: prompt token ids and ``stop_token_ids``
are integers (``true`` is not a token), ``n`` and ``best_of`` are 1, and a
field this engine does not implement is refused with a 400 naming it rather
than ignored.  Fields OpenAI defines whose no-op value changes nothing
(``logprobs: null``, ``echo: false``, ``presence_penalty: 0``, ...) are
accepted at that value only.

:class:`StopMatcher` finds stop strings in the streamed text across token
boundaries (it holds back the tail that may begin one), and the text it
returns never includes the stop string, as OpenAI and vLLM do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from contracts.errors import ValidationError
from engine.sampling import MAX_SEED, MIN_SEED, SamplingParams

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256

NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
}
"""OpenAI fields this engine does not implement, and the values that ask for nothing."""

StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_LENGTH)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False


class GenerationRequest(BaseModel):
    """What completion and chat requests share: sampling, stopping, streaming."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    no_op_values: ClassVar[dict[str, tuple[Any, ...]]] = NO_OP_VALUES

    model: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    n: Annotated[int, Field(strict=True, ge=1, le=1, description="only one choice per request is served")] = 1
    seed: Annotated[int, Field(strict=True, ge=MIN_SEED, le=MAX_SEED)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StopString | list[StopString] | None = Field(None, max_length=MAX_STOP_STRINGS)
    stop_token_ids: list[StrictInt] = Field(default_factory=list)
    ignore_eos: StrictBool = False
    user: str | None = None
    # Accepted only at their no-op values (see no_op_values).
    logit_bias: dict[str, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def texts(self) -> list[tuple[str, str]]:
        """(field, text) of every text the request carries, checked for lone surrogates."""
        return [("stop", s) for s in self.stop_strings]

    def check(self) -> None:
        """Refuse what the model's types allow but this engine cannot serve (every problem at once)."""
        problems = [
            f"{name}: not implemented by this engine (send {values[0]!r} or leave it out)"
            for name, values in self.no_op_values.items()
            if getattr(self, name) not in values
        ]
        problems += [f"{name}: must be valid Unicode text (it holds a lone surrogate)"
                     for name, text in self.texts() if not _encodable(text)]
        if problems:
            raise ValidationError(problems)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p, seed=self.seed,
            stop_token_ids=tuple(self.stop_token_ids), ignore_eos=self.ignore_eos,
        )


class CompletionRequest(GenerationRequest):
    """The subset of OpenAI's completion request the engine serves (one choice, no logprobs)."""

    no_op_values: ClassVar[dict[str, tuple[Any, ...]]] = {
        "logprobs": (None, 0), "echo": (False,), "suffix": (None, ""), **NO_OP_VALUES,
    }

    prompt: str | list[StrictInt]
    max_tokens: Annotated[int, Field(strict=True, ge=1)] = 16
    best_of: Annotated[int, Field(strict=True, ge=1, le=1)] | None = None
    # Accepted only at their no-op values (see no_op_values).
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    def texts(self) -> list[tuple[str, str]]:
        prompt = [("prompt", self.prompt)] if isinstance(self.prompt, str) else []
        return prompt + super().texts()


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class StopMatcher:
    """Cuts streamed text at the first stop string; holds back the tail that may begin one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._buffer = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text that can be shown now (nothing once a stop string was found)."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buffer = self._buffer + text
        found = [i for i in (buffer.find(s) for s in self._stops) if i >= 0]
        if found:
            self.stopped = True
            self._buffer = ""
            return buffer[: min(found)]
        keep = max(0, len(buffer) - self._hold)
        self._buffer = buffer[keep:]
        return buffer[:keep]

    def flush(self) -> str:
        """The text held back, at the end of the request."""
        out, self._buffer = self._buffer, ""
        return "" if self.stopped else out


__all__ = ["CompletionRequest", "GenerationRequest", "StopMatcher", "StreamOptions"]
