"""A fuzz campaign against a running engine (EP 1 and EP 2) while victim requests stream.

Hypothesis sends hostile completion requests: extreme and wrongly typed
fields, lone surrogates, unknown and unimplemented OpenAI fields, raw bytes
that are not UTF-8 or JSON, deeply nested JSON, and clients that walk away
mid-request.  Meanwhile victims stream ordinary requests over and over.  The
campaign holds when no answer is a 5xx, every error is the JSON error
document, no victim is harmed (each ends 200 with all its tokens and finish
reason ``length``), and the KV cache is empty once everything ended.
About 500 cases per EP size, a few minutes in all on two cores.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.client import EngineCoreClient
from tests.engine.test_server import serve

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CASES_PER_EP = 500
VICTIM_TOKENS = 24

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "9" * 40]),
)  # fmt: skip
_values = st.one_of(_scalars, st.lists(_scalars, max_size=4),
                    st.dictionaries(st.text(max_size=4), _scalars, max_size=3))
_tiny = st.sampled_from([0, -0.0, 1e-300, 5e-324, 0.009, 0.01, 1e-8, 0.5, 1, 2, 2.1, 1e300])

PAYLOADS = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(max_size=24), st.lists(st.integers(-3, 600), max_size=10),
                         st.lists(st.booleans(), max_size=3), _values)},
    optional={
        "max_tokens": st.one_of(st.integers(-2, 6), _values),
        "temperature": st.one_of(_tiny, _values),
        "top_p": st.one_of(_tiny, _values),
        "seed": st.one_of(st.integers(-(2**65), 2**65), _values),
        "stop": st.one_of(st.text(max_size=4), st.lists(st.text(max_size=3), max_size=18), _values),
        "stop_token_ids": st.one_of(st.lists(st.integers(-3, 99999), max_size=4), _values),
        "stream": st.one_of(st.booleans(), _values),
        "ignore_eos": st.booleans(),
        "n": st.one_of(st.integers(0, 3), _values),
        "best_of": st.one_of(st.integers(0, 3), _values),
        "logprobs": st.one_of(st.none(), st.integers(0, 5), _values),
        "echo": st.one_of(st.booleans(), _values),
        "logit_bias": _values,
        "presence_penalty": st.one_of(_tiny, _values),
        "model": st.one_of(st.just("tiny-moe"), _values),
        "surprise": _values,
    },
)
EDGY = st.fixed_dictionaries(
    {"prompt": st.one_of(st.text(min_size=1, max_size=24), st.lists(st.integers(0, 511), min_size=1, max_size=10)),
     "max_tokens": st.integers(1, 6)},
    optional={
        "temperature": st.sampled_from([0, 0.01, 0.0100001, 1e-300, 0.7, 2]),
        "top_p": st.sampled_from([5e-324, 1e-300, 1e-45, 1e-8, 0.5, 1]),
        "seed": st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from([-(2**63) - 1, 2**64, 2**63, -1, 0])),
        "stop": st.one_of(st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), max_size=4)),
        "stop_token_ids": st.lists(st.integers(0, 511), max_size=3),
        "stream": st.booleans(),
        "ignore_eos": st.booleans(),
        "logprobs": st.none(),
        "presence_penalty": st.just(0),
    },
)
"""Requests at the edges of what is valid: most are served, so a fault in them would reach the batch."""
RAW_BODIES = st.one_of(
    st.binary(max_size=48),
    st.integers(1, 3000).map(lambda n: b'{"prompt": ' + b"[" * n + b"]" * n + b"}"),
    st.just(b"[" * 20000),
    st.just(b'{"prompt": "\xff\xfe\xfd"}'),
)
CASES = st.tuples(st.one_of(EDGY, EDGY, PAYLOADS, RAW_BODIES), st.sampled_from(["stay", "stay", "stay", "walk away"]))


@dataclass
class Victims:
    """Ordinary streamed requests, one after another on each thread, until stopped."""

    url: str
    threads: int = 3
    done: int = 0
    harmed: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Victims:
        self._workers = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.threads)]
        for worker in self._workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(60)

    def _run(self, index: int) -> None:
        payload = {"prompt": f"victim {index} keeps streaming", "max_tokens": VICTIM_TOKENS, "ignore_eos": True,
                   "temperature": 0.8, "seed": index, "stream": True}
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                problem = self._one(client, payload)
                if problem is not None:
                    self.harmed.append(problem)
                self.done += 1

    @staticmethod
    def _one(client: httpx.Client, payload: dict[str, Any]) -> str | None:
        with client.stream("POST", "/v1/completions", json=payload) as resp:
            if resp.status_code != 200:
                return f"status {resp.status_code}: {resp.read()[:200]!r}"
            events = [json.loads(line[6:]) for line in resp.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        if any("error" in e for e in events):
            return f"error event: {events[-1]}"
        if len(events) != VICTIM_TOKENS or events[-1]["choices"][0]["finish_reason"] != "length":
            return f"{len(events)} events, last {events[-1] if events else None}"
        return None


def _check_answer(client: httpx.Client, case: dict[str, Any] | bytes, walk_away: bool) -> str:
    """What happened (a status code, or ``walked away``); asserts the answer is clean."""
    content = case if isinstance(case, bytes) else json.dumps(case).encode()
    headers = {"content-type": "application/json"}
    if walk_away:  # read one line (or wait a moment) and leave: the request must be aborted, not leak
        try:
            with client.stream("POST", "/v1/completions", content=content, headers=headers, timeout=0.05) as resp:
                assert resp.status_code < 500, resp.read()
                next(resp.iter_lines(), None)
        except httpx.TimeoutException:
            pass
        return "walked away"
    resp = client.post("/v1/completions", content=content, headers=headers)
    assert resp.status_code < 500, (case, resp.status_code, resp.text)
    if resp.status_code >= 400:
        assert resp.headers["content-type"].startswith("application/json"), (case, resp.text)
        assert resp.json()["error"]["code"] == resp.status_code, (case, resp.text)
    elif resp.headers["content-type"].startswith("text/event-stream"):
        lines = [line for line in resp.text.splitlines() if line.startswith("data: ")]
        # (an error event has an "error" key; generated text may well be the word "error")
        events = [json.loads(line[6:]) for line in lines[:-1]]
        assert lines[-1] == "data: [DONE]" and all("error" not in e for e in events), (case, resp.text)
    else:
        assert resp.json()["choices"][0]["finish_reason"] in ("length", "stop"), (case, resp.text)
    return str(resp.status_code)


@pytest.fixture(scope="module", params=[1, 2], ids=["ep1", "ep2"])
def engine_url(request: pytest.FixtureRequest, tiny_checkpoint: Path) -> Iterator[tuple[str, EngineCoreClient]]:
    server, engine = serve(tiny_checkpoint, ep=request.param, max_waiting=64)
    yield server.url, engine
    server.stop()


def test_fuzzing_harms_no_victim_and_leaks_nothing(engine_url: tuple[str, EngineCoreClient]) -> None:
    url, engine = engine_url
    outcomes: Counter[str] = Counter()
    with Victims(url) as victims, httpx.Client(base_url=url, timeout=60) as client:

        @given(CASES)
        @settings(max_examples=CASES_PER_EP, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def campaign(case: tuple[dict[str, Any] | bytes, str]) -> None:
            outcomes[_check_answer(client, case[0], case[1] == "walk away")] += 1

        campaign()
        assert client.get("/health").status_code == 200
    assert victims.harmed == [], victims.harmed[:5]
    assert victims.done >= victims.threads
    deadline = time.monotonic() + 10
    while engine.kv_state()[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.kv_state()[0] == 0 and engine.num_requests() == (0, 0)
    engine.blocks.check_invariants()
    assert sum(outcomes.values()) >= CASES_PER_EP and outcomes["200"] > 0
    print(f"fuzz: {dict(outcomes)} over {victims.done} victim streams, 0 harmed, KV back to 0")
