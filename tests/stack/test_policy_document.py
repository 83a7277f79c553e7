"""The demo's policy document and replica flags: the router's queue as demand, ranks kept in one process on one CPU."""

from __future__ import annotations

from pathlib import Path

from controller.policy import ROUTER_JOB, Policy
from stack.run import policy_document
from stack.state import StackOptions


def test_the_demo_policy_names_its_router_for_both_sources() -> None:
    options = StackOptions()
    plain = Policy.model_validate(policy_document(Path("/ckpt"), options))
    assert plain.router is None
    routed = Policy.model_validate(policy_document(Path("/ckpt"), options, router_url="http://127.0.0.1:18080"))
    assert routed.router is not None
    assert routed.router.endpoints == ("http://127.0.0.1:18080",)  # the direct-scrape source's URL
    assert routed.router.prometheus_labels == {"job": ROUTER_JOB}  # the job the stack's Prometheus gives it
    assert routed.model_dump(exclude={"router"}) == plain.model_dump(exclude={"router"})  # nothing else changes


def test_replicas_on_fewer_cpus_than_ranks_keep_the_ranks_in_one_process() -> None:
    from stack.run import _engine_flags

    one_cpu = StackOptions(ep=2, cpus_per_replica=1)
    assert one_cpu.colocate_ranks and "--colocate-ranks" in _engine_flags(one_cpu)
    assert one_cpu.ep_label == "EP 2, ranks in one process"
    two_cpus = StackOptions(ep=2, cpus_per_replica=2)
    assert not two_cpus.colocate_ranks and "--colocate-ranks" not in _engine_flags(two_cpus)
    assert _engine_flags(two_cpus)[:2] == ["--ep", "2"]
    flags = _engine_flags(two_cpus)  # 32-token chunks run 32 sequences at most, as `moeslo serve` now requires
    assert flags[flags.index("--max-num-seqs") + 1] == flags[flags.index("--max-num-batched-tokens") + 1] == "32"
