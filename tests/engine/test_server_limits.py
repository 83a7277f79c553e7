"""vLLM's rules for a request's output limit and a text prompt's special tokens, against the served engine."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer as RustTokenizer
from tokenizers.processors import TemplateProcessing

from tests.engine.test_server import MODEL, Served, serve
from tests.engine.test_server_hardening import _is_error_document

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served_with_bos(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The tiny checkpoint with a tokenizer that puts a BOS before a text, as Mixtral's and DeepSeek's do."""
    checkpoint = tmp_path_factory.mktemp("bos") / "ckpt"
    shutil.copytree(tiny_checkpoint, checkpoint)
    rust = RustTokenizer.from_file(str(checkpoint / "tokenizer.json"))
    bos = rust.token_to_id("<|endoftext|>")
    rust.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    rust.save(str(checkpoint / "tokenizer.json"))
    server, engine = serve(checkpoint)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield Served(server.url, engine, client)
    server.stop()


@pytest.mark.parametrize(("route", "body", "field"), [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1000}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 1000},
     "max_completion_tokens"),
], ids=["completion", "chat-max_tokens", "chat-max_completion_tokens"])  # fmt: skip
def test_an_output_limit_past_the_whole_context_is_a_400_naming_it(
    served_with_bos: Served, route: str, body: dict[str, object], field: str
) -> None:
    """vLLM refuses a limit above max_model_len (512 here); it was cut silently to the room the prompt leaves."""
    answer = served_with_bos.client.post(route, json={"model": MODEL, **body})
    assert answer.status_code == 400, answer.text
    error = _is_error_document(answer)
    assert error["param"] == field and f"{field}=1000 cannot be greater than max_model_len=512" in error["message"]


def test_a_limit_within_the_context_is_cut_to_the_room_the_prompt_leaves(served_with_bos: Served) -> None:
    answer = served_with_bos.client.post("/v1/completions", json={"model": MODEL, "prompt": [5] * 500,
                                                                   "max_tokens": 100, "ignore_eos": True})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 12
    assert answer.json()["choices"][0]["finish_reason"] == "length"


def test_a_text_prompt_gets_the_tokenizers_bos_unless_asked_not_to(served_with_bos: Served) -> None:
    """As vLLM's completions: the BOS went missing, so the model read other input than under vLLM."""
    client = served_with_bos.client
    tokens = client.post("/tokenize", json={"prompt": "hi"}).json()["tokens"]
    default = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1}).json()
    assert default["usage"]["prompt_tokens"] == len(tokens)
    bare = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1,
                                                "add_special_tokens": False}).json()  # fmt: skip
    assert bare["usage"]["prompt_tokens"] == len(tokens) - 1
