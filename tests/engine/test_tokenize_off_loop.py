"""A huge prompt is tokenized (and its chat template rendered) off the event loop: other requests go on meanwhile."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from contracts.errors import ValidationError
from engine.chat_template import ChatTemplate
from engine.server import OFF_LOOP_SIZE, create_app
from engine.tokenizer import ByteTokenizer, HFTokenizer

WAIT_S = 5.0


class _SlowTokenizer(ByteTokenizer):
    """Byte-level, but a long text's ``encode`` holds until the test lets it go (as a huge prompt takes seconds)."""

    def __init__(self) -> None:
        super().__init__(512)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []
        self.waited_out = False
        """Nobody let the tokenizer go within ``WAIT_S``: the event loop was stuck in it."""

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        if len(text) >= OFF_LOOP_SIZE:
            self.threads.append(threading.current_thread())
            self.entered.set()
            self.waited_out = not self.release.wait(WAIT_S)
        return super().encode(text, add_special_tokens=add_special_tokens)


class _Engine:
    """What the routes ask of an engine client before a request reaches the core; the core refuses it."""

    max_model_len = 1 << 30
    context_note: str | None = None

    def check_prompt_ids(self, ids: Any) -> None:
        list(ids)

    def check_prompt(self, prompt: list[int], params: Any) -> None:
        pass

    def add_request(self, prompt: list[int], params: Any, **_: Any) -> Any:
        raise ValidationError(f"stub engine: {len(prompt)} prompt tokens")

    def abort(self, request_id: str, reason: str = "abort") -> None:
        pass


@dataclass
class _Run:
    """What happened while the huge prompt was in the tokenizer."""

    entered: bool
    """The tokenizer got the huge prompt."""
    held_meanwhile: bool
    """The tokenizer still held it when the other requests had been answered."""
    waited_out: bool
    models: httpx.Response
    small: httpx.Response
    huge: httpx.Response
    off_loop: bool
    """Every huge encode ran on a thread other than the event loop's."""


async def _serve_others_while_tokenizing(path: str, body: dict[str, Any]) -> _Run:
    tokenizer = _SlowTokenizer()
    template = ChatTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    app = create_app(_Engine(), tokenizer, model_name="m", chat_template=template)  # type: ignore[arg-type]
    loop_thread = threading.current_thread()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        huge = asyncio.create_task(client.post(path, json=body))
        entered = await asyncio.to_thread(tokenizer.entered.wait, WAIT_S)
        # The tokenizer is still busy with the huge prompt, and the loop answers others at once.
        models = await asyncio.wait_for(client.get("/v1/models"), WAIT_S / 2)
        small = await asyncio.wait_for(client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}),
                                       WAIT_S / 2)
        held_meanwhile = not tokenizer.release.is_set()
        tokenizer.release.set()
        resp = await huge
    off_loop = bool(tokenizer.threads) and all(t is not loop_thread for t in tokenizer.threads)
    return _Run(entered=entered, held_meanwhile=held_meanwhile, waited_out=tokenizer.waited_out, models=models,
                small=small, huge=resp, off_loop=off_loop)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "x" * (OFF_LOOP_SIZE * 50), "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * (OFF_LOOP_SIZE * 50)}],
                              "max_tokens": 1}),
])
def test_a_huge_prompt_is_tokenized_while_the_server_answers_others(path: str, body: dict[str, Any]) -> None:
    run = asyncio.run(_serve_others_while_tokenizing(path, body))
    assert run.entered and run.held_meanwhile and not run.waited_out
    assert run.models.status_code == 200 and run.models.json()["data"][0]["id"] == "m"
    assert run.small.status_code == 400 and "stub engine: 2 prompt tokens" in run.small.text
    # The huge prompt went on after its tokenizer: all of it reached the engine.
    assert run.huge.status_code == 400 and f"stub engine: {OFF_LOOP_SIZE * 50} prompt tokens" in run.huge.text
    assert run.off_loop


def test_the_hf_tokenizer_lets_go_of_the_gil_while_it_encodes(tiny_checkpoint: Path) -> None:
    """Else a worker thread would not help: ``tokenizers``' plain ``encode`` holds the GIL throughout."""
    tokenizer = HFTokenizer(tiny_checkpoint / "tokenizer.json")
    text = "the engine streams tokens to every client while it reads a long prompt. " * 15000
    expected = tokenizer.encode(text[:2000])
    done = threading.Event()
    worker = threading.Thread(target=lambda: (tokenizer.encode(text), done.set()))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.1)  # a thread that holds the GIL hands it over every 100 ms at most
    try:
        began = time.monotonic()
        worker.start()
        ticks = 0
        while not done.is_set():
            time.sleep(0.01)  # this thread runs only while the encoding thread lets go of the GIL
            ticks += 1
        worker.join()
        elapsed_s = time.monotonic() - began
    finally:
        sys.setswitchinterval(interval)
    # Let go: a tick every 10 ms (five times this); held, a C call keeps it throughout (a tick or two in all).
    assert ticks >= max(5.0, elapsed_s / 0.05), (ticks, elapsed_s)
    assert tokenizer.encode(text[:2000]) == expected and tokenizer.decode(expected) == text[:2000]
