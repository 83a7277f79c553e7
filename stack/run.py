"""``moeslo up``: the whole loop on one machine.

It starts, all on 127.0.0.1: Prometheus and Alertmanager when installed (the
policy's generated burn-rate rules, pages to a webhook the stack runs); the
controller (SQLite, the local actuator with a host budget of one pinned CPU per
replica, the production decision core with forecasting, 2 s ticks), which starts
the embedded engine (EP 2) as its first replica.  Before any of that, a short profile
of a replica started alone (same command, CPU and EP; stopped after), which sizes
both the policy's capacity model and the load, so its deliberate overload never
shows in the run's SLI windows, load history or alerts.  Then a load generator
replaying the morning rise of a real day of traffic (Azure 2024), compressed into
the run, on a checkpoint whose router is skewed so expert imbalance is real.
Part-way through, an injected fault throttles every replica's CPU.  A live view
shows latency against the SLOs, the forecast, replicas, imbalance and every
decision with its reasons; at the end come ``summary.json`` and a PNG.  Every
process it started, and every replica its controller started, is stopped on the
way out, Ctrl-C included (:mod:`stack.shutdown`).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from contracts.errors import UnavailableError
from contracts.slo_defaults import ITL_THRESHOLD_S, LATENCY_TARGET, MAX_IMBALANCE_CV, TTFT_THRESHOLD_S
from harness.processes import free_port, moeslo_command
from harness.webhook import WebhookReceiver
from stack.cpu_pool import SharedCpuPool
from stack.faults import inject_fault
from stack.load import UNFINISHED_ERROR, drive, load_plan
from stack.profile import profile_replicas
from stack.run_folder import RUN_MARKER, clear_last_run, lock_run_folder
from stack.sampler import Sampler, read_router_requests
from stack.services import ManagedProcess, Supervisor, start_alertmanager, start_prometheus
from stack.shutdown import Interrupted, ReplicaRecord, run_cancelled_on_sigterm, signals_deferred, stop_on_sigterm
from stack.state import StackOptions, StackState

POLICY_NAME = "qwen3-moe-local"
MODEL_NAME = "moeslo-demo"
ROOT = Path(__file__).resolve().parents[1]
DRAIN_S = 20.0
"""How long in-flight requests may finish after the last planned arrival."""
DEMO_ALERT_FOR = "20s"
"""The demo's page fires after 20 s of burn instead of the committed rules' 1 m: its day is compressed
into two minutes, and the committed rules stay as they are."""


def _checkpoint(options: StackOptions) -> Path:
    if options.checkpoint is not None:
        return options.checkpoint
    from engine.checkpoint import init_random_checkpoint
    from engine.config import ModelConfig

    return init_random_checkpoint(options.out / "checkpoint", ModelConfig(), seed=options.seed, router_skew=1.0,
                                  name_eos=True)  # as `moeslo model init` writes it; the load ignores eos


SERVE_MAX_NUM_SEQS = 128
"""``moeslo serve``'s default batch limit, lowered to the prefill chunk when that is smaller (no more would run)."""


def _engine_flags(opts: StackOptions) -> list[str]:
    """What every replica is started with, beyond its address and names (the profiled ones alike)."""
    flags = ["--ep", str(opts.ep), "--max-num-batched-tokens", str(opts.max_num_batched_tokens),
             "--max-num-seqs", str(min(SERVE_MAX_NUM_SEQS, opts.max_num_batched_tokens))]
    if opts.colocate_ranks:
        flags.append("--colocate-ranks")
    return flags


def policy_document(
    checkpoint: Path, options: StackOptions, profile: dict[str, Any] | None = None, *, mode: str = "enforce",
    max_replicas: int | None = None, router_url: str | None = None,
) -> dict[str, Any]:
    """The demo's policy: the mission's objectives, 1..max replicas, forecasting on 2 s ticks.

    With the entry router (``router_url``), its queue counts as demand: the controller reads it from
    the router's /metrics (direct scrape) or from Prometheus, whose job for it is ``moeslo-router``.
    """
    document: dict[str, Any] = {
        "name": POLICY_NAME,
        "description": "The mission's SLOs for the local embedded engine (moeslo up).",
        "target": {"kind": "local", "model": MODEL_NAME, "checkpoint": str(checkpoint)},
        "objectives": {"imbalance": {"max_cv": MAX_IMBALANCE_CV, "sustain_s": 10}},
        "scaling": {"min_replicas": options.min_replicas, "max_replicas": max_replicas or options.max_replicas,
                    "scale_down_cooldown_s": 60, "max_step": 1},
        "lead_time_s": 16,
        "forecast": {"min_history_s": 16, "audit_forecasts": 20},
        "mode": mode,
    }
    if profile is not None:
        document["profile"] = profile
    if router_url is not None:
        document["router"] = {"endpoints": [router_url], "prometheus_labels": {"job": "moeslo-router"}}
    return document


class LocalStack:
    """Starts the processes, drives the load, samples, and stops everything."""

    def __init__(self, options: StackOptions, on_update: Callable[[StackState], None] | None = None) -> None:
        self.options = options
        self.state = StackState(options)
        self.supervisor = Supervisor(options.out / "logs")
        self.pager: WebhookReceiver | None = None
        self.on_update = on_update or (lambda _state: None)
        self._listed: list[str] = []
        """The replicas the controller last listed for the policy (its endpoints route)."""
        self.checkpoint: Path | None = None
        self.base_rate_rps = 1.0
        self._http = httpx.Client(timeout=1.0)
        """The engines' health probes share one client (a new one per probe reads the CA bundle each time)."""
        self._controller: ManagedProcess | None = None
        self._lock_fd: int | None = None
        self.cpu_pool = SharedCpuPool(os.sched_getaffinity(0), self._controller_pid, self._control_plane_pids)
        self.replica_record = ReplicaRecord()  # the controller's replicas, so none outlives the run
        self.sampler: Sampler | None = None

    # ------------------------------------------------------------------ start
    def start(self, progress: Callable[[str], None]) -> None:
        opts, state = self.options, self.state
        opts.out.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_run_folder(opts.out)
        if clear_last_run(opts.out):
            progress(f"a new run: the last run's controller database, Prometheus and Alertmanager data, results "
                     f"and logs in {opts.out} are removed")
        (opts.out / RUN_MARKER).write_text("moeslo up writes its run's state here; the next run clears it\n")
        progress("writing the checkpoint (skewed router)")
        self.checkpoint = checkpoint = _checkpoint(opts)
        # The profile runs on a replica of its own before anything scrapes: its deliberate
        # overload must not show in the SLI windows, load history or alerts of the run.
        measured = self._profile_replicas(checkpoint, progress)
        self.base_rate_rps = measured["base_rate_rps"]
        # The local actuator takes the first free ports from first_port on; which ones, the controller
        # lists (a port in use, by a listener or a client's connection, is skipped).
        first_port = free_port()
        controller_port = free_port()
        router_port = free_port() if opts.router else None
        state.controller_url = f"http://127.0.0.1:{controller_port}"
        if opts.prometheus:
            self._start_monitoring(controller_port, router_port, checkpoint, progress)
        progress("starting the controller (SQLite, local actuator, forecasting core)")
        self._controller = controller = self._start_controller(controller_port, first_port, checkpoint)
        state.event(f"status page: {state.controller_url}/ui/ (open it in a browser while the run lasts)")
        router_url = None if router_port is None else f"http://127.0.0.1:{router_port}"
        self._put_policy(policy_document(checkpoint, opts, measured["profile"], router_url=router_url))
        state.event(f"policy {POLICY_NAME} applied: TTFT<={TTFT_THRESHOLD_S * 1000:g}ms, "
                    f"ITL<={ITL_THRESHOLD_S * 1000:g}ms ({LATENCY_TARGET:.0%}), CV<={MAX_IMBALANCE_CV:g}; "
                    f"{opts.cpus_per_replica} pinned CPU per replica, capacity model from the profile")
        progress(f"waiting for the controller's first engine replica ({opts.ep_label})")
        deadline = time.monotonic() + 180
        while not self._probe_engines():
            self._follow_replicas_cpus()
            if not controller.alive():
                raise UnavailableError(f"the controller exited:\n{controller.log_tail()}")
            if time.monotonic() > deadline:
                raise UnavailableError(f"no engine replica became ready within 180 s; see {opts.out / 'logs'}")
            time.sleep(1.0)
        state.event(f"engine replica ready at {state.engines[0]}")
        self._follow_replicas_cpus()
        if router_port is not None:
            self._start_router(router_port, measured["profile"], progress)

    def _start_router(self, port: int, profile: dict[str, Any], progress: Callable[[str], None]) -> None:
        """The entry router, reading the replica set from the controller: the load goes through it."""
        state = self.state
        argv = [*moeslo_command(), "route", "--controller", state.controller_url, "--controller-policy", POLICY_NAME,
                "--port", str(port), "--policy", "cost", "--admission", "queue",
                "--ttft-objective-s", f"{TTFT_THRESHOLD_S:g}",
                "--prefill-tokens-per-s", f"{profile['prefill_tokens_per_s']:.0f}",
                # The profile's ITL line, so the cost policy sees a batch's ITL risk as this replica has it.
                "--itl-base-s", f"{profile['itl_base_s']:.5f}", "--itl-per-seq-s", f"{profile['itl_per_seq_s']:.5f}",
                "--cached-token-cost", f"{profile.get('cached_token_cost', 0.0):.3f}"]
        progress("starting the entry router (cost policy, the replicas the controller lists)")
        router = self.supervisor.start("router", argv, cwd=ROOT)
        router.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=60)
        state.router_url = f"http://127.0.0.1:{port}"
        state.event(f"entry router at {state.router_url}: each request to the replica predicted to serve it "
                    f"soonest (cost policy; replicas follow the controller's list)")

    def _profile_replicas(self, checkpoint: Path, progress: Callable[[str], None]) -> dict[str, Any]:
        """Start replicas as the local actuator would (same command, CPUs and EP), profile them at once, stop them.

        As many replicas as the run may have (and the CPUs hold), each on CPUs of its own: the run's
        replicas share the machine with each other and with the load generator, and a replica
        profiled alone on an idle machine measured about twice the rate it sustains in the run.
        """
        opts = self.options
        available = sorted(os.sched_getaffinity(0))
        count = max(1, min(opts.max_replicas, len(available) // opts.cpus_per_replica))
        replicas, urls = [], []
        try:
            for i in range(count):
                port = free_port()
                cpus = available[i * opts.cpus_per_replica: (i + 1) * opts.cpus_per_replica] or available[:1]
                argv = [*moeslo_command(), "serve", "--checkpoint", str(checkpoint), "--port", str(port),
                        "--model-name", MODEL_NAME, "--engine-id", f"profile-{i}", *_engine_flags(opts)]
                progress(f"starting a replica to profile ({opts.ep_label}, CPUs {cpus})")
                replicas.append(self.supervisor.start(f"profile-replica-{i}", argv, cwd=ROOT, cpus=cpus))
                urls.append(f"http://127.0.0.1:{port}")
            for replica, url in zip(replicas, urls, strict=True):
                replica.wait_ready(f"{url}/health", timeout_s=180)
            progress(f"profiling {count} replica(s) at once (the capacity model and the load are sized from them)")
            return profile_replicas(self.state, urls, progress)
        finally:
            for replica in replicas:
                replica.stop()

    def _start_controller(self, port: int, first_port: int, checkpoint: Path) -> ManagedProcess:
        opts, state = self.options, self.state
        settings: dict[str, Any] = {
            "host": "127.0.0.1", "port": port, "db": str((opts.out / "controller.db").resolve()),
            "actuator": "local", "tick_interval_s": opts.tick_interval_s, "stale_after_s": 30.0,
            # Expert-load windows of 10 s (the day is compressed): a plan waits for two, so its
            # prediction is judged on a window it did not see.
            "rebalance_window_s": 10.0, "rebalance_min_windows": 2,
            # Rates over 10 s (five 2 s scrapes), not a minute: over a minute the compressed ramp is seen
            # half a minute late, and the first minute's rates read low (the counters start with the run).
            "rate_window_s": 10,
            # SLIs over 30 s, not 5 minutes (a 2-minute run would carry its first requests to the end):
            # the compressed day's five minutes are half an hour of trace.
            "sli_window_s": 30,
            # The local stack's engines listen on 127.0.0.1: policies may name them.
            "allowed_endpoint_addresses": ["loopback"],
            "local": {
                "command": [*moeslo_command(), "serve", "--checkpoint", "{checkpoint}", "--port", "{port}",
                            "--model-name", "{model}", "--engine-id", "{port}", *_engine_flags(opts)],
                "checkpoint": str(checkpoint), "first_port": first_port,
                "log_dir": str((opts.out / "logs").resolve()), "cpus_per_replica": opts.cpus_per_replica,
            },
        }
        if state.prometheus_url is not None:
            settings["prometheus_url"] = state.prometheus_url
        if state.alertmanager_url is not None:  # the status page lists the alerts it is delivering
            settings["alertmanager_url"] = state.alertmanager_url
        config_path = opts.out / "controller.yaml"
        config_path.write_text(yaml.safe_dump(settings, sort_keys=False))
        controller = self.supervisor.start(
            "controller", moeslo_command("controller", "serve", "--config", str(config_path)), cwd=ROOT
        )
        controller.wait_ready(f"{state.controller_url}/health", timeout_s=90)
        return controller

    def _put_policy(self, document: dict[str, Any]) -> None:
        response = httpx.put(f"{self.state.controller_url}/v1/policies/{POLICY_NAME}", json=document, timeout=10)
        if response.status_code >= 400:
            raise UnavailableError(f"the controller refused the demo policy: {response.text}")

    def _start_monitoring(self, controller_port: int, router_port: int | None, checkpoint: Path,
                          progress: Callable[[str], None]) -> None:  # fmt: skip
        from controller.policy import Policy
        from generators.alerts import AlertOptions, build_rule_groups, dump_yaml, rules_document
        from generators.alerts.alertmanager import ReceiverOptions, build_alertmanager_config

        opts, state = self.options, self.state
        am_port, prom_port = free_port(), free_port()
        self.pager = WebhookReceiver()
        progress("starting Alertmanager")
        am = start_alertmanager(
            self.supervisor, opts.out / "alertmanager", port=am_port,
            config=build_alertmanager_config(ReceiverOptions(
                page_webhook_url=f"{self.pager.url}/page", ticket_webhook_url=f"{self.pager.url}/ticket",
                group_wait="1s", group_interval="10s",
            )),
        )
        if am is not None:
            state.alertmanager_url = f"http://127.0.0.1:{am_port}"
        policy = Policy.model_validate(policy_document(checkpoint, opts))
        rules = opts.out / "moeslo-demo-rules.yaml"
        groups = build_rule_groups([policy], AlertOptions(evaluation_interval="2s", min_for=DEMO_ALERT_FOR,
                                                          for_fraction_of_short_window=0.0))
        rules.write_text(dump_yaml(rules_document(groups)))
        progress("starting Prometheus")
        prom = start_prometheus(
            self.supervisor, opts.out / "prometheus", port=prom_port,
            targets={"moeslo-controller": [f"127.0.0.1:{controller_port}"],
                     **({"moeslo-router": [f"127.0.0.1:{router_port}"]} if router_port is not None else {})},
            rule_files=[rules.resolve()], alertmanager_port=am_port if am is not None else None,
            discovered={"moeslo-engine": f"http://127.0.0.1:{controller_port}/v1/scrape-targets"},
        )
        if prom is not None:
            state.prometheus_url = f"http://127.0.0.1:{prom_port}"
            state.event(f"Prometheus and Alertmanager up: SLIs through PromQL, pages after {DEMO_ALERT_FOR} of burn")
        else:
            state.event("Prometheus not installed: the controller scrapes the engines' /metrics directly")

    def _listed_replicas(self) -> list[str]:
        """The replicas the controller lists for the policy; the last list while it does not answer."""
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, TypeError):
            answer = self._http.get(f"{self.state.controller_url}/v1/policies/{POLICY_NAME}/endpoints")
            if answer.status_code == 200:
                self._listed = [str(url) for url in answer.json()["endpoints"]]
        return self._listed

    def _probe_engines(self) -> list[str]:
        ready = []
        for url in self._listed_replicas():
            with contextlib.suppress(httpx.HTTPError):
                if self._http.get(f"{url}/health").status_code == 200:
                    ready.append(url)
        for url in ready:
            if url not in self.state.engines:
                self.state.event(f"replica {url} serving")
        for url in self.state.engines:
            if url not in ready and (self.state.fault is None or not self._in_fault()):
                self.state.event(f"replica {url} gone")
        if self.state.fault is not None and self._in_fault():
            ready = sorted(set(ready) | set(self.state.engines))  # a throttled replica is slow, not gone
        self.state.engines = ready
        return ready

    def _controller_pid(self) -> int | None:
        controller = self._controller
        return None if controller is None or not controller.alive() else controller.process.pid

    def _control_plane_pids(self) -> list[int]:
        """Every process the stack started that is still running (the profile's replicas are gone by now)."""
        return [p.process.pid for p in self.supervisor.processes if p.alive()]

    def _follow_replicas_cpus(self) -> None:
        """The control plane onto the CPUs the replicas leave free (see :mod:`stack.cpu_pool`); the replicas
        recorded; the controller's exit noticed."""
        self._watch_controller()
        line = self.cpu_pool.update(self.replica_record.record(self._controller_pid()))
        if line is not None:
            self.state.event(line)

    def _watch_controller(self) -> None:
        """Once, when the controller exits before the stop: a line, and the summary says the loop was dead."""
        controller, state = self._controller, self.state
        if controller is None or state.controller_exit is not None or state.stopping_s is not None:
            return
        code = controller.process.poll()
        if code is not None:
            state.controller_exit = (state.elapsed(), code)
            state.event(f"controller exited with code {code}: the control loop is dead from here on (no scaling, "
                        f"no rebalancing; its replicas are stopped with it); see {controller.log_path}")

    async def _keep_cpu_pool(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self._follow_replicas_cpus)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)

    def _in_fault(self) -> bool:
        assert self.state.fault is not None
        start, end = self.state.fault
        return start <= self.state.elapsed() <= end + 2.0

    # -------------------------------------------------------------------- run
    async def run_load(self) -> None:
        from engine.config import ModelConfig

        assert self.checkpoint is not None
        opts, state = self.options, self.state
        vocab = ModelConfig.load(self.checkpoint).vocab_size
        plan, what = load_plan(opts, self.base_rate_rps)
        state.event(f"replaying {len(plan)} requests: {what}")
        state.load_started_s = state.elapsed()
        stop = asyncio.Event()
        self.sampler = Sampler(state, POLICY_NAME, self.pager, self._probe_engines)
        sampling = asyncio.create_task(self.sampler.loop(stop, self.on_update))
        pooling = asyncio.create_task(self._keep_cpu_pool(stop))
        fault = asyncio.create_task(inject_fault(state, self._controller_pid)) if opts.fault_in_load else None
        driving = asyncio.create_task(drive(state, plan, vocab, state.engines[0]))
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(driving), timeout=opts.duration_s + DRAIN_S)
        except TimeoutError:
            timed_out = True
        finally:
            await self._end_load(driving, timed_out)
            if fault is not None:
                fault.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await fault
            stop.set()
            await sampling
            await pooling
            await asyncio.to_thread(read_router_requests, state)

    async def _end_load(self, driving: asyncio.Task[None], timed_out: bool) -> None:
        """Cancel the requests still in flight, however the load ended (its drain ran out, Ctrl-C, SIGTERM), and
        count them: sent and never answered (on Ctrl-C they were neither recorded nor counted)."""
        state = self.state
        if not driving.done():
            driving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await driving
        # From the records, which drive writes as each request leaves, cancelled or not: counted from the requests
        # in flight, the count read 0 when something else had cancelled them first.
        state.unfinished = sum(r.error == UNFINISHED_ERROR for r in state.records)
        if state.unfinished:
            when = f"{DRAIN_S:.0f} s after the last arrival" if timed_out else "when the load was stopped"
            state.event(f"stopped {state.unfinished} requests still in flight {when}")

    def stop(self) -> list[str]:
        """Stop every process the run started and every replica the controller left; what is still running.

        The CPU pool, pager and lock are released whatever the stop raised; SIGINT and SIGTERM wait until the
        end (a second Ctrl-C cut the stop short and left Prometheus and Alertmanager running)."""
        state = self.state
        with signals_deferred():
            self._watch_controller()
            self.replica_record.record(self._controller_pid())  # a replica started since the last look, too
            if state.stopping_s is None:
                state.stopping_s = state.elapsed()
            try:
                still = self.supervisor.stop_all()
                still += [f"replica process {pid}" for pid in self.replica_record.stop_left()]
                state.still_running = still
            finally:
                self.cpu_pool.release()
                self._http.close()
                if self.pager is not None:
                    self.pager.stop()
                if self._lock_fd is not None:
                    os.close(self._lock_fd)  # the lock goes with it
                    self._lock_fd = None
        return state.still_running

    def write_results(self) -> dict[str, Any]:
        """``requests.csv``, ``summary.json`` and the plot, in that order: the plot takes seconds, and whatever cuts
        it short leaves the figures written (the summary lists the plot once it is drawn)."""
        from stack.plots import write_plots
        from stack.report import request_rows, summarize

        if self.sampler is not None:
            self.sampler.read_pages()  # those posted after the last look (the pager keeps them once stopped)
        summary = summarize(self.state)
        rows = request_rows(self.state)
        if rows:
            with (self.options.out / "requests.csv").open("w", newline="") as out:
                writer = csv.DictWriter(out, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
        summary_path = self.options.out / "summary.json"
        summary["plots"] = []
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
        summary["plots"] = [str(p) for p in write_plots(self.state, self.options.out)]
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def run_stack(
    options: StackOptions,
    progress: Callable[[str], None] = lambda _text: None,
    on_update: Callable[[StackState], None] | None = None,
) -> dict[str, Any]:
    """Run the stack for ``options.duration_s``; return the summary (also written to ``out/summary.json``).

    Ctrl-C raises :class:`Interrupted` once every process is stopped (or named as still running); SIGTERM,
    ``SystemExit(143)`` the same way (during the load it cancels the load as Ctrl-C does)."""
    stack = LocalStack(options, on_update)
    previous = stop_on_sigterm()
    loading = False
    try:
        stack.start(progress)
        loading = True
        run_cancelled_on_sigterm(stack.run_load())
    except (KeyboardInterrupt, SystemExit) as stopped:
        stack.state.interrupted = loading
        still = _finish(stack, previous)
        if isinstance(stopped, KeyboardInterrupt):
            raise Interrupted(still) from None
        raise
    except BaseException:
        _finish(stack, previous)
        raise
    _finish(stack, previous)
    with signals_deferred():  # a Ctrl-C while the plot is drawn lost every result file; the run is over by now
        return stack.write_results()


def _finish(stack: LocalStack, previous_sigterm: Any) -> list[str]:
    """Stop everything and keep what an interrupted run saw, SIGINT and SIGTERM held; what is still running."""
    try:
        with signals_deferred():
            try:
                return stack.stop()
            finally:
                if stack.state.interrupted:  # what the run saw until then is kept, marked as such
                    stack.write_results()
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)
