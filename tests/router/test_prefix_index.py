"""The router's record of each replica's prefix cache: leading matches, LRU bounds, forgetting."""

from __future__ import annotations

import pytest

from router.prefix_index import PrefixIndex, with_cached_tokens
from router.types import ReplicaState, RequestFeatures


def test_only_the_leading_run_of_sent_blocks_counts() -> None:
    index = PrefixIndex(100)
    index.record("a", (1, 2, 3))
    assert index.cached_blocks("a", (1, 2, 3, 4)) == 3
    assert index.cached_blocks("a", (1, 9, 3)) == 1  # block 3 after a miss is another prefix's
    assert index.cached_blocks("a", (9, 2)) == 0
    assert index.cached_blocks("b", (1, 2)) == 0


def test_the_least_recently_sent_blocks_go_first_and_the_bound_holds() -> None:
    index = PrefixIndex(4)
    index.record("a", (1, 2))
    index.record("a", (5, 6))
    index.record("a", (1, 2))  # touched again: now the most recent
    index.record("a", (7, 8))  # evicts 5 and 6
    assert index.blocks_held("a") == 4
    assert index.cached_blocks("a", (1, 2)) == 2
    assert index.cached_blocks("a", (5, 6)) == 0
    assert index.cached_blocks("a", (7, 8)) == 2


def test_forget_and_retain_drop_replicas() -> None:
    index = PrefixIndex(10)
    for name in ("a", "b", "c"):
        index.record(name, (1,))
    index.forget("a")
    index.retain(["b"])
    assert [index.cached_blocks(n, (1,)) for n in ("a", "b", "c")] == [0, 1, 0]
    with pytest.raises(ValueError, match="capacity_blocks"):
        PrefixIndex(0)


def test_states_get_the_cached_tokens_of_this_request() -> None:
    index = PrefixIndex(10)
    index.record("a", (1, 2))
    states = (ReplicaState(name="a"), ReplicaState(name="b"))
    features = RequestFeatures(prompt_tokens=100, prefix_blocks=(1, 2, 3), block_tokens=16)
    filled = with_cached_tokens(states, features, index)
    assert [s.cached_prompt_tokens for s in filled] == [32, 0]
    assert with_cached_tokens(states, RequestFeatures(prompt_tokens=100), index) == states
