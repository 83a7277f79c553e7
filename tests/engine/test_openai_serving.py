"""Stop strings around ``min_tokens`` as vLLM's detokenizer finds them, in streamed and whole responses.

A scripted engine generates a fixed text a byte a token; the response is
read as the client would read it (the SSE chunks, or the JSON body).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as RustTokenizer

from engine.engine_types import RequestOutput
from engine.openai_documents import ChatFormat, CompletionFormat, Piece
from engine.openai_logprobs import LogprobEntry
from engine.openai_serving import Generation, _collect, serve_generation
from engine.request_stream import RequestStream
from engine.sampling import SamplingParams
from engine.tokenizer import ByteTokenizer, HFTokenizer
from tests.engine.helpers import write_byte_fallback_tokenizer

EOS = 256
TEXT = "abXYcdef"


class ScriptedEngine:
    """Generates ``text`` a byte a token (then eos, if asked); an abort ends the request with its reason at once."""

    max_model_len = 4096
    context_note: str | None = None

    def __init__(self, text: str = TEXT, *, eos: bool = False, eos_token_ids: tuple[int, ...] = (EOS,)) -> None:
        self.ids = [*text.encode(), *([EOS] if eos else [])]
        self.eos_token_ids = eos_token_ids
        self.aborts: list[str] = []
        self.streams: list[RequestStream] = []

    def check_prompt(self, prompt: list[int], params: SamplingParams) -> None:
        pass

    def add_request(self, prompt: list[int], params: SamplingParams, **_: object) -> RequestStream:
        stream = RequestStream(f"cmpl-{len(self.streams)}", asyncio.get_running_loop())
        ids = self.ids[: params.max_tokens]
        for n, token in enumerate(ids, 1):
            last, eos = n == len(ids), token == EOS
            stream.queue.put_nowait(RequestOutput(
                stream.request_id, token, finished=last, finish_reason=("stop" if eos else "length") if last else None,
                is_stop_token=eos, prompt_tokens=len(prompt), generation_tokens=n if last else 0,
                logprobs=(-0.5, ()) if params.logprobs is not None else None))
        self.streams.append(stream)
        return stream

    def abort(self, request_id: str, reason: str = "abort") -> None:
        self.aborts.append(reason)
        queue = next(s for s in self.streams if s.request_id == request_id).queue
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(RequestOutput(request_id, None, finished=True, finish_reason=reason))

    def health(self) -> None:
        return None


class Connected:
    """A client that stays connected."""

    async def receive(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}


def generation(min_tokens: int, stops: tuple[str, ...] = ("XY",), *, stream: bool, max_tokens: int = 16,
               logprobs: int | None = None) -> Generation:
    params = SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens, logprobs=logprobs)
    return Generation(prompts=[[1, 2]], params=params, stops=stops, stream=stream, include_usage=False,
                      format=CompletionFormat("m"))


async def respond(engine: ScriptedEngine, gen: Generation) -> tuple[str, str, list[str], dict[str, Any]]:
    """(text, finish reason, the streamed chunks' texts, logprobs) of the one choice."""
    response: Any = await serve_generation(engine, ByteTokenizer(512), gen, Connected(), 0.0)  # type: ignore[arg-type]
    if not gen.stream:
        choice = json.loads(bytes(response.body))["choices"][0]
        return choice["text"], choice["finish_reason"], [], choice["logprobs"]
    events = [event async for event in response.body_iterator]
    response._on_close()
    choices = [json.loads(e.removeprefix("data: "))["choices"][0] for e in events if e != "data: [DONE]\n\n"]
    return "".join(c["text"] for c in choices), choices[-1]["finish_reason"], [c["text"] for c in choices], {}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("min_tokens", "text", "reason"),
    [
        (2, "ab", "stop"),  # XY begins after the first 2 tokens
        (3, "ab", "stop"),  # X is the 3rd token, Y the 4th: XY ends after them, and its X is never shown
        (4, TEXT, "length"),  # XY ends within the first 4 tokens: no stop
    ],
)
def test_a_stop_string_that_ends_after_min_tokens_counts_from_where_it_begins(
    stream: bool, min_tokens: int, text: str, reason: str,
) -> None:
    engine = ScriptedEngine()
    shown, finish_reason, _, _ = asyncio.run(respond(engine, generation(min_tokens, stream=stream)))
    assert (shown, finish_reason) == (text, reason)
    assert engine.aborts == (["stop"] if reason == "stop" else [])


@pytest.mark.parametrize(
    ("min_tokens", "chunks"),
    [
        (3, ["", "a", "b", "", ""]),  # a chunk a token, each holding back one character: X never goes out
        (4, ["", "a", "b", "X", "Y", "c", "d", "ef"]),  # no stop: what was held back comes with the last token
    ],
)
def test_streamed_chunks_hold_back_what_may_begin_a_stop_string_within_min_tokens(
    min_tokens: int, chunks: list[str],
) -> None:
    _, _, streamed, _ = asyncio.run(respond(ScriptedEngine(), generation(min_tokens, stream=True)))
    assert streamed == chunks


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_wholly_within_min_tokens_is_not_found_later(stream: bool) -> None:
    # "long" holds back three characters: XY is still held when the 4th token comes, and is no stop.
    engine = ScriptedEngine("aXYbcdef")
    shown, finish_reason, _, _ = asyncio.run(respond(engine, generation(3, ("XY", "long"), stream=stream)))
    assert (shown, finish_reason, engine.aborts) == ("aXYbcdef", "length", [])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("generated", "eos", "max_tokens", "text", "reason"),
    [
        (TEXT, False, 3, "abX", "length"),  # ends within min_tokens, X held back until then
        ("abXc", True, 16, "abXc", "stop"),  # eos after min_tokens: c held back until then
    ],
)
def test_text_held_back_comes_out_when_the_request_ends(
    stream: bool, generated: str, eos: bool, max_tokens: int, text: str, reason: str,
) -> None:
    gen = generation(3, stream=stream, max_tokens=max_tokens)
    shown, finish_reason, _, _ = asyncio.run(respond(ScriptedEngine(generated, eos=eos), gen))
    assert (shown, finish_reason) == (text, reason)


def test_logprobs_list_the_tokens_up_to_the_one_that_ended_the_stop_string() -> None:
    gen = generation(3, stream=False, logprobs=0)
    shown, _, _, logprobs = asyncio.run(respond(ScriptedEngine(), gen))
    assert shown == "ab"
    assert (logprobs["tokens"], logprobs["text_offset"]) == (["a", "b", "X", "Y"], [0, 1, 2, 3])


def test_a_character_split_over_tokens_is_listed_on_the_token_that_completes_it() -> None:
    """vLLM's offsets are a running sum of the listed tokens' texts, and a token that ends in part of a character
    is completed with the tokens before it (``''`` while still incomplete): ``é`` as two byte tokens lists ``''``
    then ``é``, so ``b`` is at 2 and ``你``'s bytes at 3."""
    gen = generation(0, (), stream=False, logprobs=0)
    shown, _, _, logprobs = asyncio.run(respond(ScriptedEngine("aéb你"), gen))
    assert shown == "aéb你"
    assert logprobs["tokens"] == ["a", "", "é", "b", "", "", "你"]
    assert logprobs["text_offset"] == [0, 1, 1, 2, 3, 3, 3]


@pytest.mark.parametrize("stream", [False, True])
def test_generated_text_continues_the_prompt_with_a_decoder_that_strips_the_first_space(
    stream: bool, tmp_path: Path
) -> None:
    """A Llama-style tokenizer: ``▁b ▁a`` after the prompt ``▁a`` is `` b a`` (vLLM primes its decode stream with
    the prompt); a byte the library finds an invalid prefix after starts the stream afresh, not a 500."""
    path = write_byte_fallback_tokenizer(tmp_path / "tokenizer.json")
    word = RustTokenizer.from_file(str(path)).token_to_id

    async def text(ids: list[int]) -> str:
        engine = ScriptedEngine()
        engine.ids = ids
        gen = Generation(prompts=[[word("▁a")]], params=SamplingParams(max_tokens=16), stops=(), stream=stream,
                         include_usage=False, format=CompletionFormat("m"))
        response: Any = await serve_generation(engine, HFTokenizer(path), gen, Connected(), 0.0)  # type: ignore[arg-type]
        if not stream:
            return str(json.loads(bytes(response.body))["choices"][0]["text"])
        events = [event async for event in response.body_iterator]
        response._on_close()
        return "".join(json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-1])

    assert asyncio.run(text([word("▁b"), word("▁a")])) == " b a"
    assert asyncio.run(text([word(t) for t in ("<0x41>", "<0xC2>", "你", "▁b")])) == "A你 b"


async def last_choice(engine: ScriptedEngine, gen: Generation) -> dict[str, Any]:
    """The one choice of a whole response, or of a stream's last chunk."""
    response: Any = await serve_generation(engine, ByteTokenizer(512), gen, Connected(), 0.0)  # type: ignore[arg-type]
    if not gen.stream:
        return dict(json.loads(bytes(response.body))["choices"][0])
    events = [event async for event in response.body_iterator]
    response._on_close()
    return dict(json.loads(events[-2].removeprefix("data: "))["choices"][0])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize(
    ("eos", "stops", "stop_token_ids", "reason", "stop_reason"),
    [
        (False, ("cd", "XY"), (), "stop", "XY"),  # the stop string the text was cut at
        (True, (), (EOS,), "stop", None),  # the eos token, though the request lists it too: vLLM checks eos first
        (True, (), (), "stop", None),  # eos
        (False, (), (), "length", None),
    ],
)
def test_a_choice_says_what_stopped_it_in_stop_reason_as_vllm_does(
    stream: bool, chat: bool, eos: bool, stops: tuple[str, ...], stop_token_ids: tuple[int, ...], reason: str,
    stop_reason: str | int | None,
) -> None:
    params = SamplingParams(max_tokens=16, stop_token_ids=stop_token_ids)
    gen = Generation(prompts=[[1, 2]], params=params, stops=stops, stream=stream, include_usage=False,
                     format=ChatFormat("m") if chat else CompletionFormat("m"))
    choice = asyncio.run(last_choice(ScriptedEngine(eos=eos), gen))
    assert (choice["finish_reason"], choice["stop_reason"]) == (reason, stop_reason)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("eos_token_ids", "stop_token_ids", "ignore_eos"),
    [
        ((), (EOS,), False),  # one of the request's stop_token_ids
        ((EOS,), (EOS,), True),  # the eos token, ignored as eos, ends the request as a stop token
        ((63, EOS), (), False),  # a second eos (generation_config's): vLLM makes it a stop token id
    ],
)
def test_stop_reason_names_a_stop_token_id_and_an_eos_beside_the_tokenizers(
    stream: bool, eos_token_ids: tuple[int, ...], stop_token_ids: tuple[int, ...], ignore_eos: bool
) -> None:
    """vLLM's ``update_from_generation_config`` moves eos ids other than the tokenizer's into ``stop_token_ids``
    (unless ``ignore_eos``), and its ``check_stop`` names only those and the request's in ``stop_reason``."""
    params = SamplingParams(max_tokens=16, stop_token_ids=stop_token_ids, ignore_eos=ignore_eos)
    gen = Generation(prompts=[[1, 2]], params=params, stops=(), stream=stream, include_usage=False,
                     format=CompletionFormat("m"))
    choice = asyncio.run(last_choice(ScriptedEngine(eos=True, eos_token_ids=eos_token_ids), gen))
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", EOS)


def _collect_s(tokens: int, *, logprobs: bool) -> float:
    """CPU seconds a whole response of ``tokens`` one-token pieces takes to collect."""
    gen = Generation([[1]], SamplingParams(max_tokens=tokens, logprobs=1 if logprobs else None), (), False, False,
                     CompletionFormat("m"))
    entry = LogprobEntry("a", -1.0, (("a", -1.0),), 0)

    async def merged() -> AsyncIterator[tuple[int, Piece]]:
        for i in range(tokens):
            last = i == tokens - 1
            out = RequestOutput("r", 97, finished=last, finish_reason="length" if last else None, prompt_tokens=1,
                                generation_tokens=i + 1)
            yield 0, Piece("a", out, [entry] if logprobs else None)

    async def collect() -> float:
        start = time.process_time()
        await _collect(merged(), ScriptedEngine(), "r", gen,  # type: ignore[arg-type]
                       disconnected=asyncio.get_running_loop().create_future())
        return time.process_time() - start

    return asyncio.run(collect())


def test_collecting_a_long_choices_logprobs_costs_about_what_its_text_does() -> None:
    """The entries are gathered once: rebuilding the list at every token took 1.5 s of the event loop for 32k."""
    tokens = 40_000
    plain = min(_collect_s(tokens, logprobs=False) for _ in range(2))
    with_logprobs = min(_collect_s(tokens, logprobs=True) for _ in range(2))
    assert with_logprobs < 3 * plain + 0.1, (with_logprobs, plain)


class PrefillingEngine(ScriptedEngine):
    """The scripted engine with its first token ``delay_s`` after the request (a prefill)."""

    delay_s = 0.2

    def add_request(self, prompt: list[int], params: SamplingParams, **_: object) -> RequestStream:
        stream = super().add_request(prompt, params)
        held = []
        while not stream.queue.empty():
            held.append(stream.queue.get_nowait())
        asyncio.get_running_loop().call_later(self.delay_s, lambda: [stream.queue.put_nowait(o) for o in held])
        return stream


def test_a_chat_streams_its_role_chunk_with_the_first_token_not_before_it() -> None:
    """As vLLM sends it: a role chunk ahead of the prefill would read as the first token to a client, and to the
    entry router's TTFT and prefill-rate calibration (a TTFT of ~0, a prefill learnt 10-100x too fast)."""
    gen = Generation(prompts=[[1, 2]], params=SamplingParams(max_tokens=3), stops=(), stream=True,
                     include_usage=False, format=ChatFormat("m"), n=2)  # fmt: skip

    async def first_events() -> tuple[float, list[dict[str, Any]]]:
        began = time.monotonic()
        response: Any = await serve_generation(PrefillingEngine(), ByteTokenizer(512), gen, Connected(),  # type: ignore[arg-type]
                                               0.0)  # fmt: skip
        events, first_s = [], None
        async for event in response.body_iterator:
            first_s = first_s if first_s is not None else time.monotonic() - began
            if event != "data: [DONE]\n\n":
                events.append(json.loads(event.removeprefix("data: ")))
        response._on_close()
        assert first_s is not None
        return first_s, events

    first_s, events = asyncio.run(first_events())
    assert first_s >= 0.15
    deltas = [(e["choices"][0]["index"], e["choices"][0]["delta"]) for e in events]
    assert deltas[:2] == [(0, {"role": "assistant", "content": ""}), (1, {"role": "assistant", "content": ""})]
    assert all("role" not in delta for _, delta in deltas[2:]) and len(deltas) > 2
