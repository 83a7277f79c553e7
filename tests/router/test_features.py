"""A request body's prompt work as the engine does it: every prompt of a list, and each of its ``n`` choices
(the engine runs every choice as a request of its own; with its prefix cache on, a choice after the first
finds its prompt cached)."""

from __future__ import annotations

from router.features import request_features
from router.policies import prefill_work
from router.types import CostModel

CACHE_FREE = CostModel()  # a cached token costs nothing (the default)
NO_CACHE = CostModel(cached_token_cost=1.0)  # prefix caching off: a cached token costs a computed one


def test_a_list_of_prompts_counts_every_prompt_its_prefix_the_first_ones() -> None:
    one = request_features({"prompt": "x" * 400})
    assert (one.prompt_tokens, one.prompts, one.choices) == (100, 1, 1)
    texts = request_features({"prompt": ["x" * 400] * 3})
    assert (texts.prompt_tokens, texts.prompts) == (300, 3) and texts.prefix_blocks == one.prefix_blocks
    ids = request_features({"prompt": [list(range(50)), list(range(30))]})
    assert (ids.prompt_tokens, ids.prompts) == (80, 2)
    assert ids.prefix_blocks == request_features({"prompt": list(range(50))}).prefix_blocks


def test_n_counts_for_every_prompt_shape_alike() -> None:
    # a single text, the same text as a list of one, token ids, a chat: each choice is a request in the engine
    bodies = ({"prompt": "x" * 400}, {"prompt": ["x" * 400]}, {"prompt": list(range(100))})
    for body in bodies:
        assert request_features({**body, "n": 3}).choices == 3, body
    assert request_features({"messages": [{"role": "user", "content": "hi"}], "n": 2}, chat=True).choices == 2
    for n in (None, 0, 1, True, "2"):  # not a count of choices: one (the engine refuses the body)
        assert request_features({"prompt": "x", "n": n}).choices == 1, n


def test_a_further_choice_costs_its_prompt_as_cached_but_its_last_token() -> None:
    single = request_features({"prompt": "x" * 400, "n": 2})  # 100 tokens, 2 choices
    assert prefill_work(single, 0, CACHE_FREE) == 100 + 1
    assert prefill_work(single, 0, NO_CACHE) == 200  # without a prefix cache each choice is prefilled in full
    assert prefill_work(single, 0, CostModel(cached_token_cost=0.5)) == 100 + (1 + 99 * 0.5)
    batch = request_features({"prompt": ["x" * 400] * 3, "n": 2})  # 3 prompts of 100 tokens, 2 choices each
    assert prefill_work(batch, 0, CACHE_FREE) == 300 + 3
    assert prefill_work(batch, 0, NO_CACHE) == 600
    assert prefill_work(batch, 64, CACHE_FREE) == 300 - 64 + 3  # the replica's cache holds the first's lead


def test_one_choice_costs_what_it_did() -> None:
    features = request_features({"prompt": "x" * 400})
    assert prefill_work(features, 0, CACHE_FREE) == 100
    assert prefill_work(features, 40, CACHE_FREE) == 60
    assert prefill_work(request_features({"prompt": ""}), 0, CACHE_FREE) == 0
