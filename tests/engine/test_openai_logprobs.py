"""Log-probability entries: each token's text as vLLM shows it, a character split over byte tokens included."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer as RustTokenizer

from engine.openai_logprobs import LogprobEntry, chat_logprobs, logprob_entry, prompt_entries
from engine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from engine.tokenizer_init import train_tokenizer
from tests.engine.helpers import write_byte_fallback_tokenizer


@pytest.fixture(scope="module")
def byte_level_bpe(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    """The random checkpoints' byte-level BPE (``é你`` is five byte tokens in it)."""
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    train_tokenizer(512).save(str(path))
    return HFTokenizer(path)


def generated(tokenizer: Tokenizer, ids: list[int],
              top: dict[int, tuple[int, ...]] | None = None) -> list[LogprobEntry]:
    """The entries of ``ids`` generated one after another (``top``: alternatives by position)."""
    entries: list[LogprobEntry] = []
    offset = 0
    for i, token in enumerate(ids):
        alternatives = tuple((t, -1.0) for t in (top or {}).get(i, ()))
        entries.append(logprob_entry(tokenizer, token, (-0.1, alternatives), offset, ids[:i]))
        offset += len(entries[-1].token)
    return entries


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_a_character_split_over_byte_tokens_is_the_text_of_the_token_that_completes_it(
    kind: str, byte_level_bpe: HFTokenizer
) -> None:
    """vLLM's ``_correct_decoded_token``: ``''`` for the tokens of an incomplete character, the character for the
    one that completes it (each alone decodes to U+FFFD)."""
    tokenizer: Tokenizer = ByteTokenizer(512) if kind == "byte" else byte_level_bpe
    ids = tokenizer.encode("é你")
    assert len(ids) == 5
    entries = generated(tokenizer, ids)
    assert [e.token for e in entries] == ["", "é", "", "", "你"]
    assert [e.text_offset for e in entries] == [0, 0, 1, 1, 1]
    content = chat_logprobs(entries)["content"]  # type: ignore[index]
    assert [c["bytes"] for c in content] == [[], list("é".encode()), [], [], list("你".encode())]


def test_alternatives_are_completed_with_the_sampled_tokens_before_them() -> None:
    tok = ByteTokenizer(512)
    lead = "è".encode()[0]
    entries = generated(tok, [ord("a"), lead, "é".encode()[1]],
                        top={2: ("è".encode()[1], ord("b"), lead), 0: (lead,)})
    assert entries[0].top == (("", -1.0),)  # nothing sampled before it to complete it with
    assert entries[2].token == "é"
    assert entries[2].top == (("è", -1.0), ("b", -1.0), ("", -1.0))


def test_byte_fallback_tokens_of_a_character_show_it_on_the_last(tmp_path: Path) -> None:
    """With byte fallback, ``▁a`` then ``你``'s three bytes: the third byte's text is ``你`` (not ``a你``)."""
    path = write_byte_fallback_tokenizer(tmp_path / "tokenizer.json")
    tok = HFTokenizer(path)
    ids = [RustTokenizer.from_file(str(path)).token_to_id("▁a"), *(3 + b for b in "你".encode())]
    # (the decoder strips the first space)
    assert [tok.decode_token(t) for t in ids] == ["a", "\ufffd", "\ufffd", "\ufffd"]
    assert [e.token for e in generated(tok, ids)] == ["a", "", "", "你"]


def test_prompt_tokens_are_completed_with_the_scored_prompt_tokens_before_them() -> None:
    """As vLLM's prompt logprobs: the context is the scored tokens before (the first, unscored, is not one)."""
    tok = ByteTokenizer(512)
    prompt = list("aé你".encode())
    entries = prompt_entries(tok, prompt, tuple((-0.1, ()) for _ in prompt[1:]))
    assert [e.token for e in entries] == ["a", "", "é", "", "", "你"]
    split = prompt_entries(tok, list("é".encode()), ((-0.1, ()),))
    assert [e.token for e in split] == ["\ufffd", ""]  # the unscored lead byte is no context for the second
