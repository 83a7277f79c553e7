"""Tokenizers (byte-level and tokenizer.json) and the sampler."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as RustTokenizer
from tokenizers.processors import TemplateProcessing

from contracts.errors import ValidationError
from engine.sampling import RequestSampler, SamplingParams, sample
from engine.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from tests.engine.helpers import write_byte_fallback_tokenizer


def test_byte_tokenizer_round_trips_and_streams_multibyte_characters() -> None:
    tok = ByteTokenizer(512)
    ids = tok.encode("héllo ✓")
    assert ids == list("héllo ✓".encode())
    stream = tok.stream()
    pieces = [stream.step(i) for i in ids]
    assert "".join(pieces) == "héllo ✓"
    assert pieces[1] == "" and pieces[2] == "é"  # the first byte of é is held back
    assert tok.decode([104, 300, 105]) == "h<|300|>i"


def test_byte_tokenizer_needs_256_ids() -> None:
    with pytest.raises(ValidationError):
        ByteTokenizer(100)


def test_tokenizer_json_is_used_when_the_checkpoint_has_one(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "moe": 2, "world": 3}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path, vocab_size=4096)
    assert isinstance(tok, HFTokenizer)
    assert tok.vocab_size == 4
    assert tok.encode("hello moe world") == [1, 2, 3]
    stream = tok.stream()
    assert "".join(stream.step(i) for i in [1, 2, 3]).split() == ["hello", "moe", "world"]
    assert isinstance(load_tokenizer(tmp_path / "missing", vocab_size=300), ByteTokenizer)


@pytest.fixture
def byte_fallback(tmp_path: Path) -> tuple[HFTokenizer, RustTokenizer]:
    """A Llama/Mixtral-style tokenizer (byte fallback; its decoder strips the text's first space)."""
    path = write_byte_fallback_tokenizer(tmp_path / "tokenizer.json")
    return HFTokenizer(path), RustTokenizer.from_file(str(path))


def test_a_decode_stream_the_tokenizers_library_finds_an_invalid_prefix_in_starts_afresh(
    byte_fallback: tuple[HFTokenizer, RustTokenizer],
) -> None:
    """An orphan lead byte then a word: ``tokenizers`` raises "Invalid prefix encountered"; vLLM's
    ``_protected_step`` starts a new stream at that token, and so does this one."""
    tok, rust = byte_fallback
    stream = tok.stream()
    ids = [rust.token_to_id(t) for t in ("<0x41>", "<0xC2>", "你", "▁b")]
    assert "".join(stream.step(t) for t in ids) == "A你 b"
    assert stream.step(-1) == ""  # an id the library cannot take (TypeError): no text, as vLLM's


def test_a_decode_stream_continues_the_prompt(byte_fallback: tuple[HFTokenizer, RustTokenizer]) -> None:
    """Primed with the prompt (vLLM's ``DecodeStream(ids=prompt)``), the first token keeps its space: a decoder
    that strips the text's first space strips the prompt's, not the generated text's."""
    tok, rust = byte_fallback
    ids = [rust.token_to_id(t) for t in ("▁b", "▁a")]
    primed, alone = tok.stream([rust.token_to_id("▁a")]), tok.stream()
    assert "".join(primed.step(t) for t in ids) == " b a"
    assert "".join(alone.step(t) for t in ids) == "b a"  # no prompt: the text's first space goes


def test_a_prompt_ending_in_a_cut_or_replaced_character_is_not_copied_into_the_completion(tmp_path: Path) -> None:
    """A primed window whose text ends in U+FFFD the stream never counts as shown: its first step gave back the
    whole window's text, prompt and all ("hello wörld 日本" for the generated "örld 日本")."""
    from engine.tokenizer_init import write_tokenizer

    write_tokenizer(tmp_path, 4096, max_model_len=2048)
    tok = load_tokenizer(tmp_path, vocab_size=4096)
    ids = tok.encode("hello wörld 日本")
    for cut in range(1, len(ids)):
        prompt, generated = ids[:cut], ids[cut:]
        stream = tok.stream(prompt)
        text = "".join(stream.step(t) for t in generated)
        assert tok.decode(prompt).rstrip("\ufffd") + text == "hello wörld 日本", cut  # the cut character once
    garbled = tok.stream(tok.encode("Decode this: caf\ufffd"))
    assert "".join(garbled.step(t) for t in tok.encode(" It means")) == " It means"


def test_greedy_picks_the_argmax_and_seeded_sampling_repeats() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    greedy = RequestSampler(SamplingParams(temperature=0.0))
    assert sample(logits[:1], [greedy]) == [int(torch.argmax(logits[0]))]

    def draw(seed: int) -> list[int]:
        sampler = RequestSampler(SamplingParams(temperature=1.0, seed=seed))
        return [sample(logits[1:2], [sampler])[0] for _ in range(20)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.05, 0.05]]))
    sampler = RequestSampler(SamplingParams(temperature=1.0, top_p=0.8, seed=0))
    picks = {sample(logits, [sampler])[0] for _ in range(200)}
    assert picks == {0, 1}


def test_sampling_params_gather_every_problem() -> None:
    with pytest.raises(ValidationError) as info:
        SamplingParams(max_tokens=0, temperature=-1.0, top_p=0.0)
    assert len(info.value.problems) == 3


def test_top_k_samples_only_the_k_most_likely_tokens() -> None:
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(2))
    top3 = set(torch.topk(logits[0], 3).indices.tolist())
    sampler = RequestSampler(SamplingParams(temperature=2.0, top_k=3, seed=0))
    picks = {sample(logits, [sampler])[0] for _ in range(400)}
    assert picks == top3
    # -1 and 0 are off (vLLM's values), as is a k at least the vocabulary; greedy stays the argmax.
    for off in (-1, 0, 50, 99):
        wide = RequestSampler(SamplingParams(temperature=2.0, top_k=off, seed=0))
        assert len({sample(logits, [wide])[0] for _ in range(400)}) > 3
    assert sample(logits, [RequestSampler(SamplingParams(temperature=0.0, top_k=3))]) == [int(logits.argmax())]


def test_min_p_drops_tokens_less_likely_than_its_share_of_the_most_likely() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]]))
    sampler = RequestSampler(SamplingParams(temperature=1.0, min_p=0.2, seed=0))  # keeps p >= 0.1
    assert {sample(logits, [sampler])[0] for _ in range(300)} == {0, 1, 2}


def test_top_k_and_min_p_are_checked() -> None:
    with pytest.raises(ValidationError) as info:
        SamplingParams(top_k=-2, min_p=1.5)
    assert [p.split(" ")[0] for p in info.value.problems] == ["top_k", "min_p"]


def test_add_special_tokens_adds_what_the_tokenizers_post_processor_adds(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Left out by default (a chat's template carries its own); a tokenizer that puts a BOS first puts it there when
    asked, as a completion's text prompt asks by default."""
    rust = RustTokenizer.from_file(str(tiny_checkpoint / "tokenizer.json"))
    bos = rust.token_to_id("<|endoftext|>")
    rust.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    rust.save(str(tmp_path / "tokenizer.json"))
    tokenizer = HFTokenizer(tmp_path / "tokenizer.json")
    plain = tokenizer.encode("hi")
    assert tokenizer.encode("hi", add_special_tokens=True) == [bos, *plain] and bos not in plain
