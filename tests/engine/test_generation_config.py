"""A checkpoint's generation config (end-of-sequence tokens, sampling defaults), read and honoured as vLLM does."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from tokenizers import Tokenizer as RustTokenizer

from contracts.errors import ValidationError
from engine.chat_template import ChatTemplate
from engine.checkpoint import init_random_checkpoint
from engine.client import EngineCoreClient
from engine.config import ModelConfig
from engine.engine_types import EngineConfig
from engine.executors.options import ExecutorOptions
from engine.generation_config import eos_token_ids, sampling_defaults
from engine.sampling import SamplingParams
from engine.server import ServerThread, create_app
from engine.tokenizer import ByteTokenizer
from exporters.app import ServeOptions, build_stack
from harness.processes import free_port
from tests.engine.recording_engine import RecordingEngine

SMALL = ModelConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, vocab_size=512)


def _write(path: Path, raw: object) -> None:
    path.write_text(json.dumps(raw))


def test_model_init_names_the_tokenizers_eos_in_config_and_generation_config(tmp_path: Path) -> None:
    init_random_checkpoint(tmp_path, SMALL, seed=1, name_eos=True)
    eos = RustTokenizer.from_file(str(tmp_path / "tokenizer.json")).token_to_id("<|endoftext|>")
    assert eos is not None
    assert json.loads((tmp_path / "config.json").read_text())["eos_token_id"] == eos
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == eos
    assert eos_token_ids(tmp_path) == (eos,)
    init_random_checkpoint(tmp_path / "bytes", SMALL, seed=1, tokenizer=False, name_eos=True)  # none to name
    assert json.loads((tmp_path / "bytes" / "config.json").read_text())["eos_token_id"] is None
    assert eos_token_ids(tmp_path / "bytes") == ()
    init_random_checkpoint(tmp_path / "counted", SMALL, seed=1)  # tests' and benchmarks' checkpoints: none
    assert json.loads((tmp_path / "counted" / "config.json").read_text())["eos_token_id"] is None
    assert eos_token_ids(tmp_path / "counted") == ()


def test_eos_ids_are_the_tokenizers_then_generation_configs_int_or_list(tmp_path: Path) -> None:
    init_random_checkpoint(tmp_path, SMALL, seed=1, name_eos=True)
    eos = SMALL.vocab_size - 3
    _write(tmp_path / "generation_config.json", {"eos_token_id": 7})
    assert eos_token_ids(tmp_path) == (eos, 7)
    _write(tmp_path / "generation_config.json", {"eos_token_id": [9, eos, 9, 4]})
    assert eos_token_ids(tmp_path) == (eos, 9, 4)
    _write(tmp_path / "generation_config.json", {"do_sample": False})
    assert eos_token_ids(tmp_path) == (eos,)
    # Without generation_config.json, config.json's (as transformers' GenerationConfig.from_model_config).
    (tmp_path / "generation_config.json").unlink()
    raw = json.loads((tmp_path / "config.json").read_text())
    _write(tmp_path / "config.json", {**raw, "eos_token_id": [11, 12]})
    assert eos_token_ids(tmp_path) == (eos, 11, 12)
    # A generation config that names no eos keeps config.json's: the model stopped nowhere.
    _write(tmp_path / "generation_config.json", {"temperature": 0.7})
    assert eos_token_ids(tmp_path) == (eos, 11, 12)
    _write(tmp_path / "generation_config.json", {"eos_token_id": "</s>"})
    with pytest.raises(ValidationError, match="eos_token_id must be an integer or a list"):
        eos_token_ids(tmp_path)


def test_the_tokenizers_eos_may_be_named_in_special_tokens_map_only(tmp_path: Path) -> None:
    init_random_checkpoint(tmp_path, SMALL, seed=1)  # names no eos anywhere
    tokenizer = RustTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    eos = tokenizer.token_to_id("<|endoftext|>")
    assert eos_token_ids(tmp_path) == ()
    _write(tmp_path / "special_tokens_map.json", {"eos_token": {"content": "<|endoftext|>", "special": True}})
    assert eos_token_ids(tmp_path) == (eos,)
    raw = json.loads((tmp_path / "tokenizer_config.json").read_text())
    _write(tmp_path / "tokenizer_config.json", {**raw, "eos_token": "<|im_end|>"})  # tokenizer_config.json's first
    assert eos_token_ids(tmp_path) == (tokenizer.token_to_id("<|im_end|>"),)


def _generate(client: EngineCoreClient, prompt: list[int], params: SamplingParams) -> tuple[list[int], str | None]:
    async def run() -> tuple[list[int], str | None]:
        stream = client.add_request(prompt, params)
        tokens: list[int] = []
        while True:
            out = await stream.next()
            if out.token_id is not None:
                tokens.append(out.token_id)
            if out.finished:
                return tokens, out.finish_reason

    return asyncio.run(run())


def _engine(checkpoint: Path) -> EngineCoreClient:
    return EngineCoreClient(ExecutorOptions(checkpoint=checkpoint, kv_cache_mb=1.0),
                            EngineConfig(warmup_requests=0)).start()


@pytest.mark.integration
def test_the_engine_stops_at_every_eos_id_of_generation_config_unless_told_to_ignore_eos(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    checkpoint = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    prompt = [5, 17, 33, 2]
    free = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    engine = _engine(checkpoint)
    try:
        unstopped, reason = _generate(engine, prompt, free)
    finally:
        engine.shutdown()
    assert reason == "length" and len(unstopped) == 12
    # The third new token becomes an eos id (with one the model never writes here), beside the tokenizer's.
    chosen = next(t for t in unstopped[2:] if t not in unstopped[:2])
    ends = {chosen, SMALL.vocab_size - 3}
    _write(checkpoint / "generation_config.json", {"eos_token_id": [next(t for t in range(500) if t not in
                                                                         unstopped), chosen]})
    stop_at = next(i for i, t in enumerate(unstopped) if t in ends)
    engine = _engine(checkpoint)
    try:
        tokens, reason = _generate(engine, prompt, SamplingParams(max_tokens=12, temperature=0.0))
        assert (tokens, reason) == (unstopped[: stop_at + 1], "stop")
        assert _generate(engine, prompt, free) == (unstopped, "length")
        # min_tokens holds every eos id back until that many tokens are out.
        held, _ = _generate(engine, prompt, SamplingParams(max_tokens=12, temperature=0.0, min_tokens=stop_at + 2))
        assert len(held) >= stop_at + 2 and not ends & set(held[: stop_at + 2])
    finally:
        engine.shutdown()


def test_sampling_defaults_are_the_generation_configs_settings_this_engine_serves(tmp_path: Path) -> None:
    _write(tmp_path / "generation_config.json", {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                                 "min_p": 0.05, "repetition_penalty": 1.05, "max_new_tokens": 7,
                                                 "eos_token_id": 3})
    assert sampling_defaults(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
                                           "repetition_penalty": 1.05, "max_tokens": 7}
    _write(tmp_path / "generation_config.json", {"top_k": 2.5})
    with pytest.raises(ValidationError, match="top_k must be an integer"):
        sampling_defaults(tmp_path)
    _write(tmp_path / "generation_config.json", {"min_p": 2})
    with pytest.raises(ValidationError, match=r"generation_config.json: min_p must be in \[0, 1\]"):
        sampling_defaults(tmp_path)
    _write(tmp_path / "generation_config.json", {"temperature": "hot", "top_p": 0.0})
    with pytest.raises(ValidationError) as info:
        sampling_defaults(tmp_path)
    assert "temperature must be a number" in str(info.value)
    _write(tmp_path / "generation_config.json", {"top_p": 0.0})
    with pytest.raises(ValidationError, match=r"generation_config.json: top_p must be in \(0, 1\]"):
        sampling_defaults(tmp_path)
    (tmp_path / "generation_config.json").write_text('{"max_new_tokens": Infinity, "temperature": NaN}')
    with pytest.raises(ValidationError) as info:  # Python's json reads them: an OverflowError traceback at start-up
        sampling_defaults(tmp_path)
    assert "max_tokens must be a finite number, got inf" in str(info.value)
    assert "temperature must be a finite number, got nan" in str(info.value)


def test_requests_that_leave_sampling_fields_out_get_the_models_defaults() -> None:
    engine = RecordingEngine()
    defaults = {"temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.1, "max_tokens": 7, "top_k": 20,
                "min_p": 0.05}
    app = create_app(engine, ByteTokenizer(512), model_name="m",  # type: ignore[arg-type]
                     chat_template=ChatTemplate("{{ messages[0]['content'] }}"), sampling_defaults=defaults)
    client = TestClient(app)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    for body in ({"prompt": "hi"}, {"prompt": "hi", "temperature": None}, {"prompt": "hi", "temperature": 0,
                 "top_p": 1, "repetition_penalty": 1.0, "top_k": -1, "min_p": 0}, chat,
                 {**chat, "max_completion_tokens": 3, "top_k": None}):
        assert client.post("/v1/chat/completions" if "messages" in body else "/v1/completions",
                           json=body).status_code == 400
    got = [(p.temperature, p.top_p, p.repetition_penalty, p.max_tokens, p.top_k, p.min_p) for p in engine.params]
    assert got == [
        (0.6, 0.9, 1.1, 16, 20, 0.05),  # a completion's max_tokens keeps OpenAI's default, as in vLLM
        (0.6, 0.9, 1.1, 16, 20, 0.05),  # null asks for the default: the model's
        (0.0, 1.0, 1.0, 16, -1, 0.0),  # what the request sets wins
        (0.6, 0.9, 1.1, 7, 20, 0.05),  # a chat's limit left out: max_new_tokens
        (0.6, 0.9, 1.1, 3, 20, 0.05),
    ]


def test_a_chat_limit_from_the_generation_config_is_cut_to_the_context_never_refused() -> None:
    """A checkpoint whose max_new_tokens is past the served context (a shorter --max-model-len) refused every chat
    request that left its limit out with a 400 naming max_tokens, a field the client never sent."""
    engine = RecordingEngine()
    app = create_app(engine, ByteTokenizer(512), model_name="m",  # type: ignore[arg-type]
                     chat_template=ChatTemplate("{{ messages[0]['content'] }}"),
                     sampling_defaults={"max_tokens": 10 * engine.max_model_len})  # fmt: skip
    client = TestClient(app)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    client.post("/v1/chat/completions", json=chat)  # the recording engine answers 400 once it has the request
    assert len(engine.params) == 1 and 0 < engine.params[0].max_tokens <= engine.max_model_len
    sent = client.post("/v1/chat/completions", json={**chat, "max_tokens": 10 * engine.max_model_len})
    assert "cannot be greater than max_model_len" in sent.text  # what the client asked for is still checked
    assert len(engine.params) == 1  # and refused before the engine


@pytest.mark.integration
def test_a_served_checkpoint_samples_with_its_generation_config_defaults(tiny_checkpoint: Path,
                                                                          tmp_path: Path) -> None:
    checkpoint = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    _write(checkpoint / "generation_config.json", {"temperature": 0.0, "top_k": -1, "eos_token_id": [3, 4]})
    port = free_port()
    stack = build_stack(ServeOptions(checkpoint=checkpoint, model_name="m", kv_cache_mb=1.0, port=port))
    server = ServerThread(stack.app, port=port).start()
    try:
        # The API process knows the core's eos ids (stop_reason names generation_config's extra ones).
        assert stack.engine.eos_token_ids == eos_token_ids(checkpoint) == (3, 4)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            body = {"prompt": [5, 17, 33, 2], "max_tokens": 12, "ignore_eos": True}
            greedy = client.post("/v1/completions", json={**body, "temperature": 0}).json()["choices"][0]["text"]
            # Left out, the temperature is the generation config's 0 (greedy), not OpenAI's 1.
            assert [client.post("/v1/completions", json=body).json()["choices"][0]["text"]
                    for _ in range(3)] == [greedy] * 3
    finally:
        server.stop()
