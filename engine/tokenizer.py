"""Tokenizers: byte-level for the random checkpoint, ``tokenizer.json`` when the checkpoint has one.

Both stream: :meth:`Tokenizer.stream` returns a decoder that turns token ids
into text one at a time and holds back incomplete UTF-8 sequences, so
streamed text is never garbled mid-character.  A ``tokenizer.json``'s stream
continues the prompt's text (vLLM's ``DecodeStream(ids=prompt)``): a decoder
that strips the text's first space strips the prompt's, not the first
generated token's.  Generated text streams without
special tokens (vLLM's ``skip_special_tokens``); :meth:`Tokenizer.decode`, which
echoes a token-id prompt, keeps them, as vLLM's echo does.
"""

from __future__ import annotations

import codecs
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from contracts.errors import ValidationError

if TYPE_CHECKING:
    from tokenizers import Tokenizer as RustTokenizer


BYTE_VOCAB_SIZE = 256
"""The smallest vocabulary the byte-level tokenizer reads text with: one id per byte."""


class DecodeStream(Protocol):
    def step(self, token_id: int) -> str:
        """Text that ``token_id`` completes (may be empty)."""
        ...


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """The text's ids; with ``add_special_tokens``, those the tokenizer puts around a text too (a BOS).

        A chat's rendered prompt is encoded without them (its template carries its own); a completion's text
        prompt and ``/tokenize`` add them when asked, by default for a text, as vLLM's do.
        """
        ...

    def decode(self, token_ids: list[int]) -> str:
        """The ids' text, special tokens as themselves (vLLM's ``tokenizer.decode``, as it echoes a prompt)."""
        ...

    def decode_token(self, token_id: int) -> str:
        """One token's text alone, a special token's included (as vLLM shows tokens in log-probabilities)."""
        ...

    def stream(self, prompt: Sequence[int] = ()) -> DecodeStream:
        """A decoder of the tokens generated after ``prompt``."""
        ...


class ByteTokenizer:
    """Token ``b`` (0..255) is byte ``b``; ids above 255 are rendered as ``<|id|>``.

    Meant for random checkpoints, whose vocabulary carries no text.
    """

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < BYTE_VOCAB_SIZE:
            raise ValidationError(f"a byte-level tokenizer needs vocab_size >= {BYTE_VOCAB_SIZE}, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))  # bytes have no special tokens to add

    def decode(self, token_ids: list[int]) -> str:
        stream = self.stream()
        return "".join(stream.step(t) for t in token_ids) + stream.flush()

    def decode_token(self, token_id: int) -> str:
        return self.decode([token_id])

    def stream(self, prompt: Sequence[int] = ()) -> _ByteDecodeStream:
        return _ByteDecodeStream()  # a byte's text does not depend on the prompt's


class _ByteDecodeStream:
    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, token_id: int) -> str:
        if 0 <= token_id < 256:
            return self._utf8.decode(bytes((token_id,)))
        return self.flush() + f"<|{token_id}|>"

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` through the ``tokenizers`` library."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self._tok = RustTokenizer.from_file(str(path))
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        # The batch call lets go of the GIL while it works (``encode`` holds it: seconds for a long text).
        return list(self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tok.decode_batch([token_ids], skip_special_tokens=False)[0])

    def decode_token(self, token_id: int) -> str:
        return self.decode([token_id])

    def stream(self, prompt: Sequence[int] = ()) -> _HFDecodeStream:
        return _HFDecodeStream(self._tok, prompt)


INVALID_PREFIX = "Invalid prefix encountered"
"""How ``tokenizers`` says a token made the text before it change (it may, with byte fallback)."""


PRIMING_TOKENS = 64
"""The prompt's last tokens a decode stream starts from: its first step decodes them all (the whole prompt took
0.3 s of the event loop for 220k tokens), and the text they lead to is the whole prompt's but for a decoder that
looks further back than they reach."""


class _HFDecodeStream:
    def __init__(self, tok: RustTokenizer, prompt: Sequence[int] = ()) -> None:
        from tokenizers.decoders import DecodeStream as RustDecodeStream

        self._tok = tok
        window = list(prompt[-PRIMING_TOKENS:])
        self._stream = RustDecodeStream(ids=window, skip_special_tokens=True)
        # A window whose text ends in U+FFFD (a character cut, or one the prompt holds) the stream never counts as
        # shown: its first text repeats the window's, which must not be copied into the completion.
        shown = tok.decode(window, skip_special_tokens=True) if window else ""
        self._echo: str | None = shown if shown.endswith("\ufffd") else None

    def step(self, token_id: int) -> str:
        """As vLLM's ``_protected_step``: a stream whose text before changed starts afresh at this token."""
        from tokenizers.decoders import DecodeStream as RustDecodeStream

        try:
            text = self._stream.step(self._tok, token_id)
        except (OverflowError, TypeError):  # an id the library cannot take: no text, as vLLM shows it
            text = None
        except Exception as exc:
            if not str(exc).startswith(INVALID_PREFIX):
                raise
            self._stream, self._echo = RustDecodeStream(skip_special_tokens=True), None
            text = self._stream.step(self._tok, token_id)
        if text and self._echo is not None:
            pairs = zip(self._echo, text, strict=False)  # the echo may run past the window's shown text or fall short
            shared = sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], pairs))
            text, self._echo = text[shared:], None
        return "" if text is None else str(text)


def load_tokenizer(checkpoint: Path, vocab_size: int) -> Tokenizer:
    """``tokenizer.json`` from the checkpoint directory if present, else byte-level."""
    path = Path(checkpoint) / "tokenizer.json"
    if path.is_file():
        return HFTokenizer(path)
    return ByteTokenizer(vocab_size)


__all__ = ["BYTE_VOCAB_SIZE", "ByteTokenizer", "DecodeStream", "HFTokenizer", "Tokenizer", "load_tokenizer"]
