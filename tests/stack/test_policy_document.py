"""The demo's policy document: with the entry router, the controller reads the router's queue."""

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
