"""The entry router's policies on a replayed trace: the router's own code steers the simulated fleet."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.router_replay import BASELINE, compare_routers, idle_hook, router_hook
from contracts.traces import RequestTrace
from controller.capacity import ReplicaProfile
from controller.replay.protocol import ReplayRequest

PROFILE = ReplicaProfile(name="t", prefill_tokens_per_s=20_000.0, itl_base_s=0.01, itl_per_seq_s=0.001,
                         ttft_overhead_s=0.02, kv_capacity_tokens=100_000, max_num_seqs=64,
                         prefill_chunk_tokens=512)  # fmt: skip


def _trace(n: int = 3, blocks: bool = False) -> RequestTrace:
    return RequestTrace(source="t", arrival_s=np.arange(n, dtype=np.float64), prompt_tokens=np.full(n, 1000),
                        output_tokens=np.full(n, 10),
                        prefix_blocks=tuple(np.array([7, 8 + i]) for i in range(n)) if blocks else None)  # fmt: skip


def _request(tmp_path: Path, rows: list[str]) -> ReplayRequest:
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(rows) + "\n")
    profile = tmp_path / "profile.json"
    profile.write_text(PROFILE.model_dump_json())
    return ReplayRequest(trace=trace, profile=profile, warmup_s=0.0, tick_s=5.0, startup_s=10.0)


def test_the_hook_is_the_routers_policy() -> None:
    idle = (np.zeros(3), np.zeros(3), np.zeros(3))
    rr = router_hook("round-robin", _trace(), PROFILE, 0.5)
    assert [rr(0, 0.0, *idle) for _ in range(4)] == [0, 1, 2, 0]
    cost = router_hook("cost", _trace(), PROFILE, 0.5)
    # Replica 0 has 0.4 s of prefill queued and replica 1 a busy batch: replica 2 serves soonest.
    assert cost(0, 0.0, np.array([0.4, 0.0, 0.0]), np.array([0.0, 6.0, 0.0]), np.zeros(3)) == 2
    prefix = router_hook("prefix", _trace(blocks=True), PROFILE, 0.5)
    # Requests sharing their leading block meet on one replica while its load allows.
    assert prefix(0, 0.0, *idle) == prefix(1, 0.0, *idle)


def test_the_floors_hook_finds_an_idle_replica_and_counts_when_there_is_none() -> None:
    route, missed = idle_hook()
    # Replica 0 has prefill queued until 0.5 s, replica 1 is decoding, replica 2 has nothing to do.
    assert route(0, 0.0, np.array([0.5, 0.0, 0.0]), np.array([0.0, 2.0, 0.0]), np.zeros(3)) == 2
    assert missed == [0]
    assert route(1, 0.0, np.array([0.5, 0.0]), np.array([0.0, 2.0]), np.zeros(2)) == 0  # least busy of two busy
    assert missed == [1]


def test_policies_at_fixed_fleets_on_a_trace(tmp_path: Path) -> None:
    # Two bursts of 60 requests a minute apart, 900-token prompts: one replica cannot hold them.
    rows = []
    for burst in (0, 60):
        rows += [json.dumps({"timestamp": int((burst + i * 0.05) * 1000), "input_length": 900,
                             "output_length": 20}) for i in range(60)]  # fmt: skip
    request = _request(tmp_path, rows)
    summary = compare_routers(request, ["cost", "round-robin", "least-loaded"], sizes=[1, 2, 4])
    assert set(summary["results"]) == {BASELINE, "cost", "round-robin", "least-loaded"}
    cost = {r["replicas"]: r for r in summary["results"]["cost"]}
    assert cost[4]["attainment_both"] > cost[1]["attainment_both"]
    # Both SLOs' shares are reported apart (a fleet short of decode capacity misses ITL, whatever the router).
    assert all(r["attainment_both"] <= min(r["attainment_ttft"], r["attainment_itl"]) for r in cost.values())
    assert cost[4]["ttft_p99_s"] < cost[1]["ttft_p99_s"]
    assert all(r["unserved"] == 0 for rows in summary["results"].values() for r in rows)
    assert set(summary["ratios"]) >= {"ttft_p99_cost_over_round-robin", "ttft_p99_cost_over_least-loaded",
                                      "ttft_p99_floor_over_round-robin"}
    # The floor: each request alone on a replica, its TTFT its own prefill, in 512-token chunks each taking
    # a decode step of one sequence besides the chunk's own prefill time.
    floor = summary["floor"]
    assert floor["requests_without_an_idle_replica"] == 0
    chunk_s = PROFILE.itl_base_s + PROFILE.itl_per_seq_s + 512 / PROFILE.prefill_tokens_per_s
    assert floor["ttft_p99_s"] == pytest.approx(PROFILE.ttft_overhead_s + 900 / 512 * chunk_s, abs=1e-3)
    assert all(floor["ttft_p99_s"] <= r["ttft_p99_s"] for rows in summary["results"].values() for r in rows)



def test_a_fleet_sizes_result_does_not_depend_on_the_sizes_run_before_it(tmp_path: Path) -> None:
    # Requests in eight families of shared leading blocks: what the router sent where steers it.
    rng = np.random.default_rng(0)
    families = rng.integers(0, 8, size=200)
    request = _request(tmp_path, [json.dumps({"timestamp": i * 30, "input_length": 2048, "output_length": 20,
                                              "hash_ids": [int(f) * 100 + k for k in range(4)]})
                                  for i, f in enumerate(families)])  # fmt: skip
    alone = compare_routers(request, ["cost", "prefix"], sizes=[3])["results"]
    after = compare_routers(request, ["cost", "prefix"], sizes=[2, 3])["results"]
    assert {name: rows[-1] for name, rows in after.items()} == {name: rows[0] for name, rows in alone.items()}


def test_the_fleet_for_the_goal_is_the_smallest_whatever_order_the_sizes_come_in(tmp_path: Path) -> None:
    # A request a second: two replicas serve it as well as eight.
    rows = [json.dumps({"timestamp": i * 1000, "input_length": 500, "output_length": 20}) for i in range(60)]
    summary = compare_routers(_request(tmp_path, rows), ["cost", "round-robin"], sizes=[8, 2, 8])
    assert summary["sizes"] == [2, 8]
    assert summary["replicas_for_goal"] == {BASELINE: 2, "cost": 2, "round-robin": 2}
    assert summary["ratios"]["ttft_p99_cost_over_round-robin"]["replicas"] == 2
