"""Request features, the /metrics parse and the pool's corrected counts (no network)."""

from __future__ import annotations

import pytest

from contracts.errors import DataError, ValidationError
from router.config import RouterConfig
from router.features import request_features
from router.pool import ReplicaPool
from router.scrape import ScrapedLoad, parse_load

METRICS = """\
# HELP vllm:num_requests_waiting Requests waiting to be scheduled.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_running Requests in the running batch.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
# HELP vllm:kv_cache_usage_perc Fraction of KV cache blocks in use (0..1).
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
# HELP moe_expert_tokens_total Tokens routed.
# TYPE moe_expert_tokens_total counter
moe_expert_tokens_total{layer="0",expert="1"} 12.0
"""


def test_parse_load_sums_queues_and_takes_the_fullest_kv_cache() -> None:
    assert parse_load(METRICS) == ScrapedLoad(waiting=5.0, running=7.0, kv_usage=0.5)
    assert parse_load("# nothing of ours\nother_metric 1\n") == ScrapedLoad()


def test_parse_load_reads_only_the_three_series_wherever_they_stand() -> None:
    text = ('vllm:num_requests_running 2\nvllm:num_requests_waiting_by_reason{r="x"} 9\n'
            'vllm:num_requests_waiting{model_name="a}b",engine="0"} 3.0 1700000000000\n'
            'vllm:num_requests_waiting{engine="1"} 4')  # first line, a longer name, braces in a value, timestamp
    assert parse_load(text) == ScrapedLoad(waiting=7.0, running=2.0)


def test_parse_load_rejects_a_body_that_is_not_prometheus_text() -> None:
    with pytest.raises(DataError, match="unparseable metrics"):
        parse_load('vllm:num_requests_waiting{engine="0" 3\n')


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_parse_load_rejects_a_sample_that_is_not_a_finite_number(value: str) -> None:
    # Valid Prometheus text, but no queue length: the monitor keeps the replica's last load instead.
    with pytest.raises(DataError, match="not a finite number"):
        parse_load(f"vllm:num_requests_waiting {value}\nvllm:num_requests_running 0\n")


def test_features_of_token_text_and_chat_prompts() -> None:
    tokens = request_features({"prompt": list(range(40)), "max_tokens": 7, "stream": True})
    assert (tokens.prompt_tokens, tokens.max_tokens, tokens.stream, len(tokens.prefix_blocks)) == (40, 7, True, 2)
    text = request_features({"prompt": "x" * 130})
    assert (text.prompt_tokens, len(text.prefix_blocks)) == (33, 2)  # ceil(130 / 4); 64-character blocks
    chat = request_features({"messages": [{"role": "user", "content": "hi " * 50}]}, chat=True)
    assert chat.prompt_tokens > 30 and chat.prefix_blocks
    odd = request_features({"prompt": {"not": "a prompt"}, "max_tokens": "many"})
    assert (odd.prompt_tokens, odd.max_tokens, odd.prefix_blocks) == (0, 16, ())


def test_prompts_sharing_leading_blocks_share_their_hashes() -> None:
    a = request_features({"prompt": [1] * 32 + [2] * 16})
    b = request_features({"prompt": [1] * 32 + [3] * 16})
    assert a.prefix_blocks[:2] == b.prefix_blocks[:2] and a.prefix_blocks[2] != b.prefix_blocks[2]


def test_pool_corrects_a_stale_scrape_with_its_own_counts() -> None:
    pool = ReplicaPool(("a",), prefill_tokens_per_s=1000.0, mean_prompt_tokens=100.0)
    first, second = pool.begin("a", 300), pool.begin("a", 200)
    pool.update_load("a", ScrapedLoad(waiting=5, running=1, kv_usage=0.3))
    (s,) = pool.snapshot()
    assert (s.waiting, s.outstanding, s.kv_usage) == (5, 2, 0.3)
    assert s.pending_prefill_tokens == 500 + 3 * 100  # its own two prompts + three it did not send
    pool.first_token(first)
    pool.finish(first)
    pool.finish(first)  # counted once
    (s,) = pool.snapshot()
    assert (s.outstanding, s.pending_prefill_tokens) == (1, 200 + 4 * 100)
    pool.update_load("a", ScrapedLoad())
    assert pool.snapshot()[0].waiting == 1  # no scrape: its own unstarted request
    pool.finish(second)
    assert pool.snapshot()[0].pending_prefill_tokens == 0


def test_whole_answer_requests_count_as_started_once_a_later_scrape_shows_the_queue_without_them() -> None:
    """No byte comes back before a whole answer, so the scraped queue is what says its prefill is done."""
    pool = ReplicaPool(("a",), prefill_tokens_per_s=1000.0, mean_prompt_tokens=100.0)
    first, second = pool.begin("a", 300, streamed=False), pool.begin("a", 200, streamed=False)
    streamed = pool.begin("a", 50)
    pool.update_load("a", ScrapedLoad(waiting=0, running=3), begun_before=pool.begun)
    (s,) = pool.snapshot()  # a scrape sent just after they were: they may not have reached the engine yet
    assert (s.waiting, s.pending_prefill_tokens) == (3, 550)
    late = pool.begin("a", 100, streamed=False)
    pool.update_load("a", ScrapedLoad(waiting=2, running=1), begun_before=pool.begun)
    (s,) = pool.snapshot()  # two of the three older ones wait: the oldest is running
    assert (first.started, second.started, s.waiting, s.pending_prefill_tokens) == (True, False, 3, 350)
    pool.update_load("a", ScrapedLoad(waiting=0, running=4), begun_before=pool.begun)
    (s,) = pool.snapshot()  # none waits: every whole-answer one is running; a stream's first token says so itself
    assert (second.started, late.started, streamed.started) == (True, True, False)
    assert (s.waiting, s.running, s.outstanding, s.pending_prefill_tokens) == (1, 4, 4, 50)
    assert pool.finish(first) and pool.finish(second) and pool.finish(late) and pool.finish(streamed)
    assert pool.snapshot()[0].outstanding == 0


def test_an_ejected_replica_returns_after_consecutive_passes() -> None:
    pool = ReplicaPool(("a",), prefill_tokens_per_s=1000.0, mean_prompt_tokens=100.0, readmit_after=2)
    assert pool.eject("a") and not pool.eject("a")
    assert not pool.health_result("a", True)
    assert not pool.health_result("a", False)  # a failure starts the count again
    assert not pool.health_result("a", True)
    assert pool.health_result("a", True) and pool.is_healthy("a")


def test_only_server_errors_in_a_row_eject_a_replica() -> None:
    pool = ReplicaPool(("a",), prefill_tokens_per_s=1000.0, mean_prompt_tokens=100.0, eject_after_5xx=3)
    assert [pool.answered("a", failed=f) for f in (True, True, False, True, True)] == [False] * 5  # reset by a success
    assert pool.answered("a", failed=True) and pool.eject("a")
    assert not pool.answered("a", failed=True)  # out already: counted again only once readmitted
    pool.health_result("a", True)
    pool.health_result("a", True)
    assert pool.is_healthy("a") and pool.answered("a", failed=True)  # readmitted, still failing: out again at once
    assert pool.eject("a") and pool.health_result("a", True) is False and pool.health_result("a", True)
    assert not pool.answered("a", failed=False) and not pool.answered("a", failed=True)  # a success ended the run


def test_config_gathers_every_problem() -> None:
    with pytest.raises(ValidationError) as caught:
        RouterConfig(replicas=("ftp://x", "ftp://x"), policy="random", scrape_interval_s=0, eject_after_5xx=0)
    problems = "\n".join(caught.value.problems)
    for expected in ("not an http(s) URL", "listed twice", "'random' is not one of", "scrape_interval_s",
                     "eject_after_5xx"):
        assert expected in problems
    unusable = ("http://127.0.0.1:8000/v1", "http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://:8000")
    with pytest.raises(ValidationError) as caught:
        RouterConfig(replicas=unusable)  # requests would go to /v1/v1/completions, or nowhere
    assert [p.split(" ")[1] for p in caught.value.problems] == [repr(url) for url in unusable]


def test_calibration_moves_the_prefill_rate_toward_the_observed_ttft() -> None:
    pool = ReplicaPool(("a",), prefill_tokens_per_s=4000.0, mean_prompt_tokens=100.0)

    def rate() -> float:
        return pool.snapshot()[0].prefill_tokens_per_s

    true_rate = 1000.0
    for _ in range(60):  # 2000 tokens of work, predicted at the current rate, observed at the true one
        pool.calibrate("a", 2000 / rate(), 2000 / true_rate)
    assert rate() == pytest.approx(true_rate, rel=0.01)
    pool.calibrate("a", 0.01, 1.0)  # too small a prediction to say anything about prefill
    assert rate() == pytest.approx(true_rate, rel=0.01)
    pool.calibrate("a", 1.0, 100.0)  # one outlier moves it at most 2 ** 0.2
    assert rate() >= true_rate * 0.5**0.2 * 0.99
    for _ in range(500):
        pool.calibrate("a", 1.0, 0.0001)  # always far faster than predicted: the rate stops at 100x
    assert rate() == pytest.approx(4000.0 * 100)


def test_one_calibrated_rate_for_every_replica_so_none_is_starved() -> None:
    pool = ReplicaPool(("a", "b"), prefill_tokens_per_s=1000.0, mean_prompt_tokens=100.0)
    for _ in range(20):  # only "a" is ever sent requests, and they run faster than predicted
        pool.calibrate("a", 0.2, 0.1)
    rates = {s.name: s.prefill_tokens_per_s for s in pool.snapshot()}
    assert rates["a"] == rates["b"] > 1500.0  # "b" is predicted as fast: the policy still tries it
    pool.set_members(("a", "b", "c"))
    assert {s.name: s.prefill_tokens_per_s for s in pool.snapshot()}["c"] == rates["a"]


def test_requests_begun_before_a_replica_was_removed_and_listed_again_leave_its_new_counts_alone() -> None:
    """Their counts went with the old record; taken off the new one, its load went below 0 for good."""
    pool = ReplicaPool(("a", "b"), prefill_tokens_per_s=1000.0, mean_prompt_tokens=100.0)
    early, started = pool.begin("a", 300), pool.begin("a", 200)
    pool.first_token(started)
    pool.set_members(("b",))
    pool.set_members(("a", "b"))
    later = pool.begin("a", 100)
    pool.first_token(early)
    assert (pool.finish(early), pool.finish(started)) == (False, False)
    (state,) = [s for s in pool.snapshot() if s.name == "a"]
    assert (state.outstanding, state.pending_prefill_tokens) == (1, 100)
    assert pool.finish(later) and next(s for s in pool.snapshot() if s.name == "a").outstanding == 0
