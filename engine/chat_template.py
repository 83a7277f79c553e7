"""A checkpoint's chat template, rendered as transformers and vLLM render it.

The template is ``tokenizer_config.json``'s ``chat_template`` (a string, or a
list of named templates of which ``default`` is used) or a
``chat_template.jinja`` file beside it.  It is rendered with jinja2 in a
sandbox with transformers' settings (``trim_blocks``, ``lstrip_blocks``,
``loopcontrols``, a ``tojson`` filter, ``raise_exception`` and
``strftime_now``), given ``messages``, ``add_generation_prompt`` and the
special tokens (``bos_token``, ``eos_token``, ...) as strings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from contracts.errors import ValidationError

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})

    @cached_property
    def _compiled(self) -> Any:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
                   separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        def strftime_now(fmt: str) -> str:
            return time.strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            return env.from_string(self.source)
        except jinja2.exceptions.TemplateError as exc:
            raise ValidationError(f"the model's chat template does not compile: {exc}") from exc

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               extra: Mapping[str, Any] | None = None) -> str:
        """The prompt text of ``messages``; a template's own refusal (``raise_exception``) is a 400.

        ``extra`` (a request's ``chat_template_kwargs``) are more template variables; they may replace
        the special tokens, and ``messages`` and ``add_generation_prompt`` win over them, as in vLLM.
        """
        import jinja2

        variables = {**self.special_tokens, **(extra or {}), "messages": messages,
                     "add_generation_prompt": add_generation_prompt}
        try:
            return str(self._compiled.render(variables))  # a dict: a client's key ("self") is no keyword
        except jinja2.exceptions.TemplateError as exc:
            raise ValidationError(f"messages: the model's chat template refused them: {exc}") from exc
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            # A variable replaced by chat_template_kwargs the template cannot use: the request's fault, as vLLM says.
            raise ValidationError(f"chat_template_kwargs: the model's chat template failed with them: "
                                  f"{type(exc).__name__}: {exc}") from exc


def token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _template_source(raw: object) -> str | None:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        source = named.get("default")
        return source if isinstance(source, str) else None
    return None


def load_chat_template(checkpoint: Path) -> ChatTemplate | None:
    """The checkpoint's chat template, or None when it has none."""
    directory = Path(checkpoint)
    config_path = directory / "tokenizer_config.json"
    config: dict[str, Any] = {}
    if config_path.is_file():
        loaded = json.loads(config_path.read_text())
        config = loaded if isinstance(loaded, dict) else {}
    jinja_file = directory / "chat_template.jinja"
    source = jinja_file.read_text() if jinja_file.is_file() else _template_source(config.get("chat_template"))
    if source is None:
        return None
    special = {key: text for key in SPECIAL_TOKEN_KEYS if (text := token_text(config.get(key))) is not None}
    return ChatTemplate(source, special)


__all__ = ["SPECIAL_TOKEN_KEYS", "ChatTemplate", "load_chat_template", "token_text"]
