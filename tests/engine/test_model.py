"""Our Qwen3-MoE against transformers' Qwen3MoeForCausalLM on the same checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from contracts.errors import ValidationError
from engine.batch import SeqChunk, StepPlan
from engine.checkpoint import init_random_checkpoint
from engine.config import ModelConfig
from engine.executors import ExecutorOptions, create_executor

transformers = pytest.importorskip("transformers")

# fp32 on CPU: measured differences are ~1e-6 on logits of magnitude ~1.
ATOL = 1e-4


def _hf_greedy_logits(checkpoint: Path, prompt: list[int], new_tokens: int) -> torch.Tensor:
    """Logits of the last prompt position and of each greedy decode step, with transformers' KV cache."""
    model = transformers.Qwen3MoeForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        result = model(torch.tensor([prompt]), use_cache=True)
        cache = result.cache
        logits = result.logits[0, -1]
        out.append(logits)
        for _ in range(new_tokens):
            token = int(logits.argmax())
            result = model(torch.tensor([[token]]), cache=cache, use_cache=True)
            cache = result.cache
            logits = result.logits[0, -1]
            out.append(logits)
    return torch.stack(out)


def _our_greedy_logits(checkpoint: Path, prompt: list[int], new_tokens: int, chunk: int = 0) -> torch.Tensor:
    executor = create_executor(ExecutorOptions(checkpoint=checkpoint, kv_cache_mb=4))
    table = tuple(range(executor.num_blocks))
    out = []
    done = 0
    step = chunk or len(prompt)
    while done < len(prompt):
        end = min(len(prompt), done + step)
        logits = executor.execute(StepPlan((SeqChunk(0, done, tuple(prompt[done:end]), table, end == len(prompt)),)))
        done = end
    out.append(logits[0])
    for _ in range(new_tokens):
        token = int(out[-1].argmax())
        logits = executor.execute(StepPlan((SeqChunk(0, done, (token,), table, True),)))
        done += 1
        out.append(logits[0])
    executor.shutdown()
    return torch.stack(out)


def _prompt(n: int, vocab: int, seed: int = 1) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prefill_and_decode_match_transformers(tiny_checkpoint: Path) -> None:
    prompt = _prompt(29, 512)
    ours = _our_greedy_logits(tiny_checkpoint, prompt, new_tokens=6)
    theirs = _hf_greedy_logits(tiny_checkpoint, prompt, new_tokens=6)
    assert ours.shape == theirs.shape == (7, 512)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_chunked_prefill_matches_transformers(tiny_checkpoint: Path) -> None:
    prompt = _prompt(40, 512, seed=2)
    ours = _our_greedy_logits(tiny_checkpoint, prompt, new_tokens=3, chunk=7)
    theirs = _hf_greedy_logits(tiny_checkpoint, prompt, new_tokens=3)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_dense_layers_tied_embeddings_and_unnormalized_topk_match(tmp_path: Path) -> None:
    config = ModelConfig(
        num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        num_experts=6, num_experts_per_tok=3, moe_intermediate_size=24, intermediate_size=96, vocab_size=300,
        mlp_only_layers=(1,), tie_word_embeddings=True, norm_topk_prob=False, max_position_embeddings=256,
    )
    init_random_checkpoint(tmp_path, config, seed=3, router_skew=0.5)
    prompt = _prompt(17, 300, seed=4)
    ours = _our_greedy_logits(tmp_path, prompt, new_tokens=4)
    theirs = _hf_greedy_logits(tmp_path, prompt, new_tokens=4)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_model_init_cli_writes_a_checkpoint_transformers_loads(tmp_path: Path) -> None:
    from cli.main import app

    out = tmp_path / "ckpt"
    result = CliRunner().invoke(
        app, ["model", "init", "--out", str(out), "--layers", "2", "--hidden", "64", "--experts", "8",
              "--top-k", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--vocab", "256", "--json"]
    )
    assert result.exit_code == 0, result.output
    config = ModelConfig.load(out)
    assert (config.num_hidden_layers, config.num_experts, config.num_experts_per_tok) == (2, 8, 2)
    model = transformers.Qwen3MoeForCausalLM.from_pretrained(out)
    assert model.config.num_experts == 8
    # Every parameter counted (the routers and norms were left out), and the weights readable as the
    # config beside them is (safetensors wrote them 0600).
    assert json.loads(result.output)["parameters"] == sum(p.numel() for p in model.parameters())
    assert (out / "model.safetensors").stat().st_mode & 0o777 == (out / "config.json").stat().st_mode & 0o777


def test_same_seed_gives_same_weights(tmp_path: Path) -> None:
    config = ModelConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, vocab_size=64)
    a = init_random_checkpoint(tmp_path / "a", config, seed=7)
    b = init_random_checkpoint(tmp_path / "b", config, seed=7)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_a_checkpoint_written_over_another_keeps_no_tokenizer_of_the_old_one(tmp_path: Path) -> None:
    """The old tokenizer.json beside a smaller vocabulary made the server refuse every text prompt."""
    config = ModelConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, vocab_size=512)
    init_random_checkpoint(tmp_path, config, seed=1)
    assert (tmp_path / "tokenizer.json").exists() and (tmp_path / "tokenizer_config.json").exists()
    init_random_checkpoint(tmp_path, config, seed=1, tokenizer=False)
    assert not (tmp_path / "tokenizer.json").exists() and not (tmp_path / "tokenizer_config.json").exists()
    init_random_checkpoint(tmp_path, config, seed=1)
    small = ModelConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                        head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, vocab_size=64)
    init_random_checkpoint(tmp_path, small, seed=1)  # too small a vocabulary for a tokenizer: none
    assert not (tmp_path / "tokenizer.json").exists()


def test_bad_configs_are_refused_with_every_problem_listed(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as info:
        ModelConfig(num_experts=4, num_experts_per_tok=8, num_attention_heads=6, num_key_value_heads=4)
    assert len(info.value.problems) == 2
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValidationError, match="only 'qwen3_moe'"):
        ModelConfig.load(tmp_path)


def test_bf16_matches_transformers(tmp_path: Path) -> None:
    config = ModelConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                         vocab_size=512, max_position_embeddings=512, torch_dtype="bfloat16")
    init_random_checkpoint(tmp_path, config, seed=9, router_skew=1.0)
    prompt = _prompt(21, 512, seed=5)
    executor = create_executor(ExecutorOptions(checkpoint=tmp_path, kv_cache_mb=2))
    table = tuple(range(executor.num_blocks))
    ours = executor.execute(StepPlan((SeqChunk(0, 0, tuple(prompt), table, True),)))[0]
    executor.shutdown()
    model = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        theirs = model(torch.tensor([prompt])).logits[0, -1].float()
    # bf16 keeps 8 bits of mantissa: a few ulps at logits of magnitude ~1.
    torch.testing.assert_close(ours, theirs, atol=3e-2, rtol=0)


def test_mixed_step_with_shuffled_block_tables_matches_each_sequence_alone(tiny_checkpoint: Path) -> None:
    """One step mixing a decode and a chunked-prefill continuation, on scattered KV blocks."""
    a, b = _prompt(19, 512, seed=6), _prompt(26, 512, seed=7)
    executor = create_executor(ExecutorOptions(checkpoint=tiny_checkpoint, kv_cache_mb=4))
    blocks = torch.randperm(executor.num_blocks, generator=torch.Generator().manual_seed(0)).tolist()
    table_a, table_b = tuple(blocks[:6]), tuple(blocks[6:12])
    first = executor.execute(StepPlan((SeqChunk(0, 0, tuple(a), table_a, True),
                                       SeqChunk(1, 0, tuple(b[:10]), table_b, False))))
    token_a = int(first[0].argmax())
    mixed = executor.execute(StepPlan((SeqChunk(0, len(a), (token_a,), table_a, True),
                                       SeqChunk(1, 10, tuple(b[10:]), table_b, True))))
    executor.shutdown()
    theirs_a = _hf_greedy_logits(tiny_checkpoint, a, new_tokens=1)
    theirs_b = _hf_greedy_logits(tiny_checkpoint, b, new_tokens=0)
    torch.testing.assert_close(first[0], theirs_a[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(mixed[0], theirs_a[1], atol=ATOL, rtol=0)
    torch.testing.assert_close(mixed[1], theirs_b[0], atol=ATOL, rtol=0)


def test_rope_settings_are_read_from_rope_parameters_and_unknown_types_refused(tmp_path: Path) -> None:
    import json

    raw = ModelConfig().to_hf_dict()
    del raw["rope_theta"]
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 12345.0}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert ModelConfig.load(tmp_path).rope_theta == 12345.0
    raw["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValidationError, match="'yarn' is not supported"):
        ModelConfig.load(tmp_path)


def _first_router_favourites(checkpoint: Path, halves: int = 2) -> list[int]:
    """The expert the first router favours most, on average, for the tokens of each vocabulary half."""
    from safetensors.torch import load_file

    weights = load_file(str(checkpoint / "model.safetensors"))
    embed, router = weights["model.embed_tokens.weight"], weights["model.layers.0.mlp.gate.weight"]
    x = embed / embed.pow(2).mean(dim=1, keepdim=True).sqrt()  # RMSNorm with unit weights
    probs = torch.softmax(x @ router.T, dim=-1)
    return [int(part.mean(dim=0).argmax()) for part in probs.chunk(halves)]


def test_prompt_kinds_make_vocabulary_halves_favour_different_experts(tmp_path: Path) -> None:
    config = ModelConfig(num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, num_experts=16, num_experts_per_tok=2, moe_intermediate_size=8,
                         vocab_size=512)
    one = init_random_checkpoint(tmp_path / "one", config, seed=5, router_skew=1.0)
    two = init_random_checkpoint(tmp_path / "two", config, seed=5, router_skew=1.0, prompt_kinds=2)
    first, second = _first_router_favourites(one)
    assert first == second  # one kind: every token favours the same hot expert
    first, second = _first_router_favourites(two)
    assert first != second
    explicit = init_random_checkpoint(tmp_path / "explicit", config, seed=5, router_skew=1.0, prompt_kinds=1)
    assert (explicit / "model.safetensors").read_bytes() == (one / "model.safetensors").read_bytes()
    with pytest.raises(ValidationError, match="prompt_kinds"):
        init_random_checkpoint(tmp_path / "bad", config, prompt_kinds=0)


class _LogitsTap:
    """Forwards to a real executor and keeps every step's logits."""

    def __init__(self, executor: object) -> None:
        self._executor = executor
        self.logits: list[torch.Tensor] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._executor, name)

    def execute(self, plan: StepPlan) -> torch.Tensor:
        out: torch.Tensor = self._executor.execute(plan)  # type: ignore[attr-defined]
        self.logits.append(out.clone())
        return out


def _serve_in_turn(
    checkpoint: Path, prompts: list[list[int]], caching: bool
) -> tuple[list[list[int]], torch.Tensor, int]:
    """Greedy tokens of each prompt served one after the other, the last one's logits, and the cache hits."""
    from engine.core import EngineCore
    from engine.engine_types import EngineConfig
    from engine.sampling import SamplingParams

    tap = _LogitsTap(create_executor(ExecutorOptions(checkpoint=checkpoint, kv_cache_mb=4)))
    core = EngineCore(tap, EngineConfig(enable_prefix_caching=caching))  # type: ignore[arg-type]
    tokens, hits = [], 0
    for index, prompt in enumerate(prompts):
        tap.logits.clear()
        core.add_request(f"r{index}", prompt, SamplingParams(max_tokens=4, temperature=0.0))
        out: list[int] = []
        while core.has_work():
            result = core.step()
            out.extend(o.token_id for o in result.outputs if o.token_id is not None)
            hits += result.stats.prefix_cache_hits if result.stats is not None else 0
        tokens.append(out)
    tap.shutdown()  # type: ignore[operator]
    return tokens, torch.cat(tap.logits), hits


def test_prefix_cache_hits_give_the_logits_of_a_cold_prefill(tiny_checkpoint: Path) -> None:
    shared = _prompt(40, 512, seed=8)  # 2 full blocks of 16 and 8 more tokens
    prompts = [[*shared, *_prompt(5, 512, seed=9)], [*shared, *_prompt(7, 512, seed=10)]]
    warm_tokens, warm_logits, hits = _serve_in_turn(tiny_checkpoint, prompts, caching=True)
    cold_tokens, cold_logits, cold_hits = _serve_in_turn(tiny_checkpoint, prompts, caching=False)
    assert hits == 32 and cold_hits == 0
    assert warm_tokens == cold_tokens
    torch.testing.assert_close(warm_logits, cold_logits, atol=ATOL, rtol=0)
    theirs = _hf_greedy_logits(tiny_checkpoint, prompts[1], new_tokens=3)
    torch.testing.assert_close(warm_logits, theirs, atol=ATOL, rtol=0)


class _PerSequenceLogits(_LogitsTap):
    """Keeps each sequence's sampled logits, in order (the steps' row layouts differ with the cache on or off)."""

    def __init__(self, executor: object) -> None:
        super().__init__(executor)
        self.by_seq: dict[int, list[torch.Tensor]] = {}

    def execute(self, plan: StepPlan) -> torch.Tensor:
        out = super().execute(plan)
        for row, chunk in enumerate(c for c in plan.chunks if c.needs_logits):
            self.by_seq.setdefault(chunk.seq_id, []).append(out[row].clone())
        return out


def _serve_together(checkpoint: Path, prompts: list[list[int]], caching: bool, budget: int
                    ) -> tuple[dict[int, torch.Tensor], int]:  # fmt: skip
    """Every prompt added before the first step, served to the end: each sequence's sampled logits, the hits."""
    from engine.core import EngineCore
    from engine.engine_types import EngineConfig
    from engine.sampling import SamplingParams
    from engine.scheduler import SchedulerConfig

    tap = _PerSequenceLogits(create_executor(ExecutorOptions(checkpoint=checkpoint, kv_cache_mb=4)))
    config = EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=budget), enable_prefix_caching=caching)
    core = EngineCore(tap, config)  # type: ignore[arg-type]
    for index, prompt in enumerate(prompts):
        core.add_request(f"r{index}", prompt, SamplingParams(max_tokens=4, temperature=0.0))
    hits = 0
    while core.has_work():
        result = core.step()
        hits += result.stats.prefix_cache_hits if result.stats is not None else 0
    tap.shutdown()  # type: ignore[operator]
    return {seq: torch.stack(rows) for seq, rows in tap.by_seq.items()}, hits


@pytest.mark.parametrize(("budget", "expected_hits"), [(512, 2 * 48), (40, 2 * 48)])
def test_hits_on_blocks_computed_in_the_same_step_give_the_logits_of_a_cold_prefill(
    tiny_checkpoint: Path, budget: int, expected_hits: int
) -> None:
    """Three equal prompts admitted together share the blocks the first one computes in that very step, also
    when its prefill is chunked (budget 40: the others join its second chunk and read the block it completes)."""
    prompt = _prompt(56, 512, seed=12)  # 3 full blocks of 16, then 8
    warm, hits = _serve_together(tiny_checkpoint, [prompt] * 3, caching=True, budget=budget)
    cold, cold_hits = _serve_together(tiny_checkpoint, [prompt] * 3, caching=False, budget=budget)
    assert (hits, cold_hits) == (expected_hits, 0)
    assert warm.keys() == cold.keys() == {0, 1, 2}
    for seq in warm:
        assert warm[seq].argmax(dim=-1).tolist() == cold[seq].argmax(dim=-1).tolist()
        torch.testing.assert_close(warm[seq], cold[seq], atol=ATOL, rtol=0)


def test_an_untied_checkpoint_without_lm_head_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    config = ModelConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, intermediate_size=32, vocab_size=64,
        tie_word_embeddings=False, max_position_embeddings=64,
    )
    init_random_checkpoint(tmp_path, config, seed=1)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["lm_head.weight"]  # e.g. a shard the index forgot
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(ValidationError, match=r"lm_head\.weight"):
        create_executor(ExecutorOptions(checkpoint=tmp_path, kv_cache_mb=1))
