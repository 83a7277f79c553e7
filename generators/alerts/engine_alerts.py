"""Alerts on the engines themselves, for what the SLO's burn rates cannot see (pure: no I/O).

The TTFT SLI counts the requests that got a first token and those the engine ended without one (deadline,
error).  A hung engine ends neither: its requests wait on, counted nowhere, the error ratio stays at 0/0 and
every burn-rate alert silent.  Three alerts watch the engines instead:

- ``MoesloEngineStalled`` (page): a replica holds requests, and no first or output token came for a while;
- ``MoesloEngineUnhealthy`` (page): the embedded engine says it is broken (``moe_engine_healthy`` 0: its core
  died or went silent, a rank is dead).  It then fails every request it held and reports nothing in flight,
  so the stall cannot fire on it;
- ``MoesloEngineRestarting`` (ticket): a replica's process restarted again and again
  (``process_start_time_seconds`` changed; on Kubernetes, for a replica whose ``/metrics`` has no process
  start time, kube-state-metrics' restarts of its pod), each break too short to page.
"""

from __future__ import annotations

from contracts.catalogue import ENGINE_HEALTHY, ITL_HISTOGRAM, RUNNING, TTFT_HISTOGRAM, WAITING
from controller.policy import Policy
from generators.alerts.model import AlertingRule, promql_string
from generators.alerts.options import AlertOptions

PROCESS_START_TIME = "process_start_time_seconds"
"""prometheus_client's process collector: the Unix time the scraped process started.  vLLM with more than one
API server (``--api-server-count``) serves a multiprocess registry without it."""

CONTAINER_RESTARTS = "kube_pod_container_status_restarts_total"
POD_CREATED = "kube_pod_created"
"""kube-state-metrics' restarts of each container of a pod, and each pod's creation time; both carry the pod's
``uid``, which tells one incarnation of a pod name from the next (a LeaderWorkerSet recreates a group's pods
under the same names when one restarts)."""

POD_LABELS = "namespace, pod"

TARGET_LABELS = "namespace, pod, instance"
"""The labels that tell one scraped process from another (Kubernetes' and Prometheus' own)."""

REPLICA_LABELS = f"model_name, {TARGET_LABELS}, engine"
"""One engine of one replica: a vLLM pod with data parallelism runs several, told apart by ``engine``."""


def _model(policy: Policy) -> str:
    return f'model_name="{promql_string(policy.model_name)}"'


def _alert(policy: Policy, name: str, *, expr: str, for_: str, severity: str, summary: str,
           description: str) -> AlertingRule:  # fmt: skip
    """An engine alert: filed under the TTFT SLO, whose burn rates it stands in for."""
    labels = {"severity": severity, "policy": policy.name, "slo": "ttft"}
    return AlertingRule(alert=name, expr=expr, for_=for_, labels=labels,
                        annotations={"summary": summary, "description": description})


def stall_alert(policy: Policy, options: AlertOptions) -> AlertingRule:
    """A page when a replica holds requests but produces nothing: no first token, no output token.

    Read from the engines' own series, not the SLO's, and per replica: summed over the model, a healthy
    replica's tokens would hide a hung one.  Output tokens count as progress too, so a few long generations
    with no new arrivals are not a stall.
    """
    model = _model(policy)
    window = options.stall_window
    in_flight = f'sum by ({REPLICA_LABELS}) ({{__name__=~"{RUNNING}|{WAITING}",{model}}}) > 0'
    first, output = (
        f"sum by ({REPLICA_LABELS}) (increase({metric}_count{{{model}}}[{window}])) == 0"
        for metric in (TTFT_HISTOGRAM, ITL_HISTOGRAM)
    )
    return _alert(
        policy, "MoesloEngineStalled",
        expr=f"{in_flight}\nand on ({REPLICA_LABELS})\n{first}\nand on ({REPLICA_LABELS})\n{output}",
        for_=options.for_override or options.stall_for,
        severity="page",
        summary=f"A replica of policy {policy.name} holds requests but produces no tokens",
        description=(
            "{{ $value }} requests of {{ $labels.model_name }} are running or waiting on one replica (its labels "
            f"say which), and no first token and no output token has come from it for {window}: the engine is "
            "hung, or its requests are stuck before their first token. The TTFT error ratio counts requests that "
            "got a first token and those the engine ended without one (deadline, error); a hung engine ends "
            "neither, so the burn-rate alerts cannot see this."
        ),
    )


def unhealthy_alert(policy: Policy, options: AlertOptions) -> AlertingRule:
    """A page when an embedded engine has said it is broken for ``unhealthy_for``: no supervisor restarted it."""
    return _alert(
        policy, "MoesloEngineUnhealthy",
        expr=f"min by ({REPLICA_LABELS}) ({ENGINE_HEALTHY}{{{_model(policy)}}}) == 0",
        for_=options.for_override or options.unhealthy_for,
        severity="page",
        summary=f"An engine of policy {policy.name} is broken and serves nothing",
        description=(
            "Engine {{ $labels.engine }} of {{ $labels.model_name }} has reported itself broken "
            f"({ENGINE_HEALTHY} 0) for {options.unhealthy_for}: its core died, hung, or lost an expert-parallel "
            "rank, and every request it held failed. Its logs name the cause (engine broken: ...); the "
            "supervisor should have restarted it."
        ),
    )


def _pod_restarts(window: str) -> str:
    """Restarts of each pod in ``window`` as kube-state-metrics sees them: its containers' restarts plus its
    recreations under the same name (its uids less one), each counted once however many report it."""
    containers = (f"sum by ({POD_LABELS}) (max by ({POD_LABELS}, uid, container) "
                  f"(changes({CONTAINER_RESTARTS}[{window}])))")  # fmt: skip
    incarnations = f"count by ({POD_LABELS}, uid) (last_over_time({POD_CREATED}[{window}]))"
    recreations = f"count by ({POD_LABELS}) ({incarnations}) - 1"
    return f"{containers}\n+ on ({POD_LABELS}) ({recreations})"


def restart_alert(policy: Policy, options: AlertOptions) -> AlertingRule:
    """A ticket when a replica of the policy's model restarted more than ``max_restarts`` times in
    ``restart_window``.  The process collector's series carry no ``model_name``: they are joined to the
    engine's ``vllm:num_requests_running`` of the same target in the window, which both engines export.  A
    replica whose ``/metrics`` had no process start time in the window (vLLM with several API servers) is
    counted from kube-state-metrics instead, by pod: without kube-state-metrics (not on Kubernetes) it is not
    covered."""
    window = options.restart_window
    # The replica's window, not its current scrape: a target that stops answering (CrashLoopBackOff) has its
    # series marked stale at once, and a join to them would resolve the ticket while the replica is down.
    replicas = f"(last_over_time({RUNNING}{{{_model(policy)}}}[{window}]))"
    by_process = (f"(max by ({TARGET_LABELS}) (changes({PROCESS_START_TIME}[{window}])) > {options.max_restarts})\n"
                  f"* on ({TARGET_LABELS}) group_left (model_name)\n"
                  f"group by (model_name, {TARGET_LABELS}) {replicas}")  # fmt: skip
    # A pod that serves a process start time is counted by it alone: one ticket for one replica, not two.
    by_pod = (f"(\n({_pod_restarts(window)})\n> {options.max_restarts}\n"
              f"unless on ({POD_LABELS}) last_over_time({PROCESS_START_TIME}[{window}])\n)\n"
              f"* on ({POD_LABELS}) group_left (model_name)\n"
              f"group by (model_name, {POD_LABELS}) {replicas}")  # fmt: skip
    return _alert(
        policy, "MoesloEngineRestarting",
        expr=f"{by_process}\nor\n{by_pod}",
        for_=options.for_override or "0s",
        severity="ticket",
        summary=f"A replica of policy {policy.name} keeps restarting",
        description=(
            "The engine of {{ $labels.model_name }} on pod {{ $labels.pod }} "
            f"restarted {{{{ $value }}}} times in {window}: it breaks, and its supervisor restarts it (or "
            "recreates its pod). Each break fails the requests it held."
        ),
    )


__all__ = ["CONTAINER_RESTARTS", "POD_CREATED", "PROCESS_START_TIME", "restart_alert", "stall_alert", "unhealthy_alert"]
