"""The OpenAI completion request as this engine serves it, what chat requests share with it, and stop strings.

:class:`CompletionRequest` is strict: prompt token ids and ``stop_token_ids``
are integers (``true`` is not a token), and counts and seeds are integers
or floats that are whole numbers (``5.0``, as vLLM takes it); ``prompt`` is
a text, a list of token ids, or a list of either (at most
:data:`MAX_CHOICES` choices in all, prompts times ``n``); ``best_of`` equals ``n`` if sent; ``logprobs`` (0..20
alternatives) reports the generated tokens' log-probabilities; ``echo``
puts the prompt before the text (with ``logprobs``, the prompt's tokens'
log-probabilities too: the core computes them, vLLM's ``prompt_logprobs``),
and ``max_tokens`` 0 is allowed with ``echo`` only (the prompt alone comes
back; one token is computed and dropped, as vLLM does); and a field this
engine does not implement is refused with a 400 naming it rather than
ignored (``suffix`` is accepted at ``null`` or ``""``, and a ``null`` in a
field this engine does not declare is dropped: it asks for nothing).

:class:`StopMatcher` finds stop strings in the streamed text across token
boundaries (it holds back the tail that may begin one), and the text it
returns never includes the stop string, as OpenAI and vLLM do.  The text of
the first ``min_tokens`` tokens goes through it unchecked: a stop string found
must end after it (it may begin in it), as vLLM's detokenizer decides.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Self, cast

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, model_validator

from contracts.errors import ValidationError
from engine.errors import PromptTooLongError
from engine.sampling import MAX_LOGPROBS, MAX_SEED, MAX_TOP_K, MIN_REPETITION_PENALTY, MIN_SEED, SamplingParams

MAX_N = 32
"""The most choices per prompt; with a list of prompts, at most ``MAX_CHOICES`` in all."""
MAX_CHOICES = 128
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
TOKEN_ID_KEY = re.compile(r"-?[0-9]{1,20}")
"""A ``logit_bias`` key: a token id as ASCII decimal digits (short: ``int()`` of thousands of digits raises)."""

NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "response_format": (None, {"type": "text"}), "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True), "spaces_between_special_tokens": (None, True),
}
"""Fields both kinds of request define but this engine does not implement, and their no-op values: OpenAI's
plain-text ``response_format``; vLLM's extensions at their defaults (what this engine does), so a client that
sends them as vLLM's defaults is served."""

Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


def _whole_number(value: Any) -> Any:
    """A float that is a whole number as that integer (``5.0`` is 5, as vLLM's lax ints take it); the rest as is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


WHOLE = BeforeValidator(_whole_number)
"""Last in a strict integer's ``Annotated`` (counts, seeds): a float that is a whole number passes too, but not a
string, a boolean or a fraction; its bounds stay in the JSON schema."""

StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_LENGTH)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool | None = False
    """vLLM's: with ``include_usage``, every chunk carries its choice's usage so far too."""


NULL_MEANS_DEFAULT = frozenset({
    "temperature", "top_p", "n", "stream", "presence_penalty", "frequency_penalty", "max_tokens", "echo",
    "stop_token_ids", "ignore_eos", "repetition_penalty", "min_tokens", "add_generation_prompt", "top_k", "min_p",
})  # fmt: skip
"""Fields whose explicit ``null`` means their default (as vLLM's ``Optional`` fields with defaults do)."""


MODEL_DEFAULTED = frozenset({"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                             "frequency_penalty"})
"""Fields whose default, when a request leaves them out, is the model's (:meth:`GenerationRequest.with_defaults`)."""


class GenerationRequest(BaseModel):
    """What completion and chat requests share: sampling, stopping, streaming."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    no_op_values: ClassVar[dict[str, tuple[Any, ...]]] = NO_OP_VALUES

    model: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    n: Annotated[int, Field(strict=True, ge=1, le=MAX_N), WHOLE] = 1
    seed: Annotated[int, Field(strict=True, ge=MIN_SEED, le=MAX_SEED), WHOLE] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StopString | list[StopString] | None = Field(None, max_length=MAX_STOP_STRINGS)
    stop_token_ids: list[StrictInt] = Field(default_factory=list)
    ignore_eos: StrictBool = False
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    """Token id to a bias, clamped to [-100, 100] as vLLM clamps it."""
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    # Accepted only at their no-op values (see no_op_values).
    response_format: dict[str, Any] | None = None
    include_stop_str_in_output: StrictBool | None = None
    skip_special_tokens: StrictBool | None = None
    spaces_between_special_tokens: StrictBool | None = None
    # vLLM's extensions (top_k 0 or -1, or the vocabulary or more: off).
    top_k: Annotated[int, Field(strict=True, ge=-1, le=MAX_TOP_K), WHOLE] = 0
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    repetition_penalty: Annotated[float, Field(ge=MIN_REPETITION_PENALTY, le=100.0)] = 1.0
    min_tokens: Annotated[int, Field(strict=True, ge=0), WHOLE] = 0

    @model_validator(mode="before")
    @classmethod
    def _null_asks_for_the_default(cls, data: Any) -> Any:
        """OpenAI's schema makes these fields nullable and clients send ``null`` for "unset": the default.

        A ``null`` in a field this engine does not declare (``tools: null``, as the SDK sends ``tools=None``)
        asks for nothing either, so it is dropped rather than refused.
        """
        return without_nulls(data, NULL_MEANS_DEFAULT, cls.model_fields)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.include_usage and self.stream_options and self.stream_options.continuous_usage_stats)

    def with_defaults(self, defaults: Mapping[str, Any]) -> Self:
        """The request with the model's defaults for the sampling fields it left out (or sent as ``null``).

        vLLM's order: the request's value, else the model's (its generation config), else OpenAI's.
        """
        unset = {k: v for k, v in defaults.items() if k in self.defaulted_fields() and k not in self.model_fields_set}
        return self.model_copy(update=unset) if unset else self

    def defaulted_fields(self) -> frozenset[str]:
        """The fields a model default may fill (a completion's ``max_tokens`` keeps OpenAI's 16, as in vLLM)."""
        return MODEL_DEFAULTED

    def texts(self) -> list[tuple[str, str]]:
        """(field, text) of every text the request carries, checked for lone surrogates."""
        return [("stop", s) for s in self.stop_strings]

    def check(self) -> None:
        """Refuse what the model's types allow but this engine cannot serve (every problem at once)."""
        problems = self.problems()
        if problems:
            raise ValidationError(problems)

    def problems(self) -> list[str]:
        """What :meth:`check` refuses, one line per problem, each starting with its field."""
        problems = [
            f"{name}: not implemented by this engine (send {' or '.join(map(json.dumps, values))}, or leave it out)"
            for name, values in self.no_op_values.items()
            if getattr(self, name) not in values
        ]
        problems += [f"{name}: must be valid Unicode text (it holds a lone surrogate)"
                     for name, text in self.texts() if not _encodable(text)]
        if self.stream_options is not None and not self.stream:
            problems.append("stream_options: only allowed with stream: true (as OpenAI and vLLM refuse it)")
        bad_keys = [key for key in self.logit_bias or {} if not TOKEN_ID_KEY.fullmatch(key)]
        if bad_keys:
            problems.append(f"logit_bias: keys must be token ids (integers as strings), got {bad_keys[0][:40]!r}")
        return problems

    @property
    def logprob_alternatives(self) -> int | None:
        """How many alternatives per token to report log-probabilities of (None: no logprobs)."""
        return None

    @property
    def prompt_logprob_alternatives(self) -> int | None:
        """The same for the prompt's tokens (None: the prompt's log-probabilities are not asked)."""
        return None

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The core's parameters (``max_tokens`` decided by the route); a 400 for what they refuse."""
        return SamplingParams(
            logprobs=self.logprob_alternatives, prompt_logprobs=self.prompt_logprob_alternatives,
            max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            min_p=self.min_p, seed=self.seed,
            stop_token_ids=tuple(self.stop_token_ids), ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
            logit_bias=tuple(sorted((int(k), min(100.0, max(-100.0, v))) for k, v in (self.logit_bias or {}).items())),
        )


class CompletionRequest(GenerationRequest):
    """OpenAI's completion request as the engine serves it (see the module doc)."""

    no_op_values: ClassVar[dict[str, tuple[Any, ...]]] = {"suffix": (None, ""), **NO_OP_VALUES}

    prompt: str | list[StrictInt] | Annotated[list[str], Field(min_length=1)] \
        | Annotated[list[list[StrictInt]], Field(min_length=1)]
    max_tokens: Annotated[int, Field(strict=True, ge=0), WHOLE] = 16
    best_of: Annotated[int, Field(strict=True, ge=1), WHOLE] | None = None
    logprobs: Annotated[int, Field(strict=True, ge=0, le=MAX_LOGPROBS), WHOLE] | None = None
    echo: StrictBool = False
    add_special_tokens: StrictBool = True
    """A text prompt gets what the tokenizer puts around a text (a BOS), as vLLM's completions do by default."""
    # Accepted only at its no-op values (see no_op_values).
    suffix: str | None = None

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: one text or token-id prompt, or each of a list of them."""
        prompt = self.prompt
        if isinstance(prompt, str) or not prompt or isinstance(prompt[0], int):
            return [cast("str | list[int]", prompt)]
        return list(prompt)

    @property
    def logprob_alternatives(self) -> int | None:
        return self.logprobs

    @property
    def prompt_logprob_alternatives(self) -> int | None:
        return self.logprobs if self.echo else None

    @property
    def tokens_to_generate(self) -> int:
        """What the core generates: ``max_tokens``, or one (dropped) for ``echo`` alone, as vLLM does."""
        return max(1, self.max_tokens)

    def texts(self) -> list[tuple[str, str]]:
        prompts = [("prompt", p) for p in self.prompts if isinstance(p, str)]
        return prompts + super().texts()

    def problems(self) -> list[str]:
        problems = super().problems()
        if self.best_of is not None and self.best_of != self.n:
            problems.append(f"best_of: must equal n ({self.n}): ranking choices is not implemented")
        if self.max_tokens == 0 and not self.echo:
            problems.append("max_tokens: must be >= 1 (0 only with echo, to get the prompt back alone)")
        if len(self.prompts) * self.n > MAX_CHOICES:
            problems.append(f"n: {len(self.prompts)} prompts x n={self.n} asks for more than {MAX_CHOICES} choices")
        return problems


def without_nulls(data: Any, defaulted: Collection[str], declared: Collection[str]) -> Any:
    """``data`` without its ``null`` values for the keys in ``defaulted`` or not in ``declared`` (a null asks
    for nothing); anything but a dict as it is."""
    if not isinstance(data, dict):
        return data
    return {k: v for k, v in data.items() if not (v is None and (k in defaulted or k not in declared))}


def check_output_limit(field: str, max_tokens: int, max_model_len: int) -> None:
    """A 400 for an output limit past the whole context, as vLLM's (a limit within it is cut to the room the
    prompt leaves, :func:`fit_to_context`)."""
    if max_tokens > max_model_len:
        raise ValidationError(f"{field}: {field}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                              "Please request fewer output tokens.")


def fit_to_context(params: SamplingParams, prompt_tokens: int, max_model_len: int, *,
                   field: str = "prompt", context_note: str | None = None) -> SamplingParams:
    """``max_tokens`` cut to the context the prompt leaves, as vLLM's ``get_max_tokens`` cuts it.

    The request then ends with finish reason ``length`` where the context
    does; a prompt that leaves no room for one token is a 400 (naming
    ``field``, and ``context_note``: why the context is shorter than the model's).
    """
    room = max_model_len - prompt_tokens
    if room < 1:
        raise PromptTooLongError(prompt_tokens=prompt_tokens, max_model_len=max_model_len, param=field,
                                 context_note=context_note)
    return params if params.max_tokens <= room else dataclasses.replace(params, max_tokens=room)


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
        self.found: str | None = None
        """The stop string the text was cut at (of those one piece of text completes, the one ending first)."""

    def feed(self, text: str, *, check: bool = True) -> str:
        """The text that can be shown now (nothing once a stop string was found).

        Only a stop string that ends in ``text`` is found, and only when ``check`` is set (it is not for
        the first ``min_tokens`` tokens): one lying wholly in unchecked text is never found, one that
        begins there and ends in checked text is, as vLLM's detokenizer finds them.  The tail that may
        begin a stop string is held back either way.
        """
        if self.stopped:
            return ""
        if not self._stops:
            return text
        before, buffer = len(self._buffer), self._buffer + text
        # Only stop strings that end in ``text``: what came before was searched already, or is not to be.
        found = [(i, s) for s in self._stops if check and (i := buffer.find(s, max(0, before - len(s) + 1))) >= 0]
        if found:
            # The one that ends first (as one token at a time would find it), the first listed of those: vLLM's.
            cut, self.found = min(found, key=lambda hit: hit[0] + len(hit[1]))
            self.stopped = True
            self._buffer = ""
            return buffer[:cut]
        keep = max(0, len(buffer) - self._hold)
        self._buffer = buffer[keep:]
        return buffer[:keep]

    def flush(self) -> str:
        """The text held back, at the end of the request."""
        out, self._buffer = self._buffer, ""
        return "" if self.stopped else out


__all__ = [
    "MAX_CHOICES",
    "MAX_N",
    "MODEL_DEFAULTED",
    "NO_OP_VALUES",
    "WHOLE",
    "CompletionRequest",
    "GenerationRequest",
    "StopMatcher",
    "StreamOptions",
    "check_output_limit",
    "fit_to_context",
    "without_nulls",
]
