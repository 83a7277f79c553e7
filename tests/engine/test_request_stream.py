"""An OpenAI request's choices gathered back into one request for the statistics observed once per request."""

from __future__ import annotations

import asyncio
import dataclasses

from engine.request_stream import ChoiceGroup, RequestStream, SeenFinish
from engine.stats import CHAT, ApiRequestStats, FinishedRequestStats


def finished(request_id: str, generated: int = 2) -> FinishedRequestStats:
    return FinishedRequestStats(request_id, "length", 5, generated, 1.0, 0.1, 0.2, 0.7, 0.3, 0.1)


def streams(group: ChoiceGroup, count: int) -> tuple[list[RequestStream], list[ApiRequestStats]]:
    """``count`` choices sent (joined) in order; what the group publishes."""
    published: list[ApiRequestStats] = []
    loop = asyncio.new_event_loop()
    sent = [RequestStream(f"cmpl-{i}", loop, group=group, choice=i) for i in range(count)]
    loop.close()
    for stream in sent:
        stream.join(published.append)
    return sent, published


def test_the_request_goes_out_once_sealed_and_every_choice_ended() -> None:
    group = ChoiceGroup("chatcmpl-a", CHAT, n=2)
    (first, second), published = streams(group, 2)
    annotated = second.finish(finished("cmpl-1", 4), 2.0)
    assert (annotated.operation, annotated.response_id) == (CHAT, "chatcmpl-a")
    group.seal()
    assert published == []  # a choice still runs
    first.finish(finished("cmpl-0"), 3.0)
    (request,) = published
    assert (request.response_id, request.operation, request.n) == ("chatcmpl-a", CHAT, 2)
    assert [(c.index, c.end_s, c.stats.generation_tokens) for c in request.choices] == [(0, 3.0, 2), (1, 2.0, 4)]
    group.seal()
    assert len(published) == 1


def test_choices_that_ended_before_the_seal_go_out_with_it() -> None:
    group = ChoiceGroup("cmpl-b")
    (only,), published = streams(group, 1)
    only.finish(finished("cmpl-0"), 1.0)
    assert published == []  # more choices may still be sent
    group.seal()
    assert len(published) == 1


def test_a_refused_choice_is_left_out_and_a_lost_one_marked() -> None:
    """The core refused the second choice (429): the request goes out with the others; a choice failed in the API
    process (the core died) is in it, marked as never reported by the core."""
    group = ChoiceGroup("cmpl-c", n=3)
    (first, second, third), published = streams(group, 3)
    group.seal()
    second.refused()
    first.finish(finished("cmpl-0"), 1.0)
    lost = third.lost("error", 2.0)
    assert lost.response_id == "cmpl-c"
    (request,) = published
    assert [(c.index, c.reported) for c in request.choices] == [(0, True), (2, False)]
    assert [[c.index for c in prompt] for prompt in request.per_prompt()] == [[0, 2]]


def test_nothing_goes_out_for_a_request_the_core_ran_no_choice_of() -> None:
    group = ChoiceGroup("cmpl-d", n=2)
    sent, published = streams(group, 2)
    for stream in sent:
        stream.refused()
    group.seal()
    assert published == []


def test_a_request_of_its_own_is_left_as_the_core_reported_it() -> None:
    loop = asyncio.new_event_loop()
    stream = RequestStream("cmpl-e", loop)
    loop.close()
    stats = finished("cmpl-e")
    assert stream.finish(stats, 1.0) is stats
    assert stream.lost("abort", 1.0).response_id is None


def _checking_stops() -> tuple[RequestStream, list[SeenFinish]]:
    """A stream whose API side looks for stop strings; what its held statistics became."""
    released: list[SeenFinish] = []
    loop = asyncio.new_event_loop()
    stream = RequestStream("cmpl-s", loop, on_seen=released.append)
    loop.close()
    return stream, released


def test_a_finish_waits_for_the_api_sides_verdict_on_a_stop_string() -> None:
    """The stop string was in the last allowed token: the core said ``length``, the client got ``stop``."""
    stream, released = _checking_stops()
    assert stream.seen(finished("cmpl-s", 3), 1.0) is None
    assert released == []
    stream.settle("stop", 3)
    stream.stop_reading()
    assert [(s.stats.finish_reason, s.stats.generation_tokens, s.end_s, s.uncounted) for s in released] == [
        ("stop", 3, 1.0, 0)]


def test_a_stop_string_found_before_the_finish_counts_the_tokens_up_to_it_at_once() -> None:
    """Of the 5 tokens the core generated, the client got 2; 2 came (and were left out) after the stop was
    found: 1 is still to be left out of the generation tokens."""
    stream, released = _checking_stops()
    stream.stop_found(2)
    stream.unseen = 2
    seen = stream.seen(dataclasses.replace(finished("cmpl-s", 5), finish_reason="stop"), 1.0)
    assert seen is not None and (seen.stats.finish_reason, seen.stats.generation_tokens, seen.uncounted) == (
        "stop", 2, 1)
    stream.settle("stop", 2)
    assert released == []


def test_a_finish_after_its_reader_stopped_reading_goes_out_at_once_as_far_as_it_was_read() -> None:
    stream, released = _checking_stops()
    stream.stop_reading()
    seen = stream.seen(finished("cmpl-s", 4), 1.0)
    assert seen is not None and (seen.stats.finish_reason, seen.stats.generation_tokens) == ("length", 4)
    assert released == []


def test_a_stream_that_checks_no_stop_strings_holds_nothing() -> None:
    loop = asyncio.new_event_loop()
    stream = RequestStream("cmpl-n", loop)
    loop.close()
    seen = stream.seen(finished("cmpl-n", 4), 1.0)
    assert seen is not None and seen.stats == finished("cmpl-n", 4)
