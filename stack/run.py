"""``moeslo up``: the whole loop on one machine.

It starts, all on 127.0.0.1: Prometheus and Alertmanager when installed
(rules from ``alerts/``, pages to a webhook the stack runs); the controller
(SQLite, the local actuator, the default policy for a local target), which
starts the embedded engine (EP 2) as its first replica; and a load generator
replaying a time-compressed slice of the Azure 2023 conversation trace on a
checkpoint whose router is skewed, so expert imbalance is real.  A live view
shows latency against the SLOs, imbalance per layer, replicas and decisions;
at the end come a summary and PNG plots.  Every process it started is
stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from contracts.errors import UnavailableError
from contracts.slo_defaults import ITL_THRESHOLD_S, LATENCY_TARGET, MAX_IMBALANCE_CV, TTFT_THRESHOLD_S
from harness.loadgen import LoadRequest, plan_from_trace, send_request
from harness.processes import free_port, moeslo_command
from harness.traces import conversation_trace
from harness.webhook import WebhookReceiver
from stack.services import Supervisor, start_alertmanager, start_prometheus
from stack.state import Sample, StackOptions, StackState

POLICY_NAME = "qwen3-moe-local"
MODEL_NAME = "moeslo-demo"
ROOT = Path(__file__).resolve().parents[1]
DRAIN_S = 20.0
"""How long in-flight requests may finish after the last planned arrival."""


def _checkpoint(options: StackOptions) -> Path:
    if options.checkpoint is not None:
        return options.checkpoint
    from engine.checkpoint import init_random_checkpoint
    from engine.config import ModelConfig

    return init_random_checkpoint(options.out / "checkpoint", ModelConfig(), seed=options.seed, router_skew=1.0)


def _policy(checkpoint: Path, options: StackOptions) -> dict[str, Any]:
    return {
        "name": POLICY_NAME,
        "description": "The mission's SLOs for the local embedded engine (moeslo up).",
        "target": {"kind": "local", "model": MODEL_NAME, "checkpoint": str(checkpoint)},
        "objectives": {"imbalance": {"max_cv": MAX_IMBALANCE_CV, "sustain_s": 15}},
        "scaling": {"min_replicas": options.min_replicas, "max_replicas": options.max_replicas,
                    "scale_down_cooldown_s": 60, "max_step": 1},
        "lead_time_s": 20,
        "mode": "enforce",
    }


def _window(values: list[float], done: list[float], since_s: float) -> list[float]:
    return [v for v, t in zip(values, done, strict=True) if t >= since_s]


class LocalStack:
    """Starts the processes, drives the load, samples, and stops everything."""

    def __init__(self, options: StackOptions, on_update: Callable[[StackState], None] | None = None) -> None:
        self.options = options
        self.state = StackState(options)
        self.supervisor = Supervisor(options.out / "logs")
        self.pager: WebhookReceiver | None = None
        self.on_update = on_update or (lambda _state: None)
        self.engine_ports: list[int] = []

    # ------------------------------------------------------------------ start
    def start(self, progress: Callable[[str], None]) -> None:
        opts, state = self.options, self.state
        opts.out.mkdir(parents=True, exist_ok=True)
        progress("writing the checkpoint (skewed router)")
        checkpoint = _checkpoint(opts)
        first_port = free_port()
        # The local actuator takes the first free ports from first_port on; scrape a few of them.
        self.engine_ports = [first_port + i for i in range(opts.max_replicas + 2)]
        controller_port = free_port()
        state.controller_url = f"http://127.0.0.1:{controller_port}"
        if opts.prometheus:
            self._start_monitoring(controller_port, progress)
        progress("starting the controller (SQLite, local actuator)")
        settings = {
            "host": "127.0.0.1", "port": controller_port, "db": str((opts.out / "controller.db").resolve()),
            "actuator": "local", "tick_interval_s": opts.tick_interval_s, "stale_after_s": 30.0,
            "local": {
                "command": [*moeslo_command(), "serve", "--checkpoint", "{checkpoint}", "--port", "{port}",
                            "--ep", str(opts.ep), "--model-name", "{model}", "--engine-id", "{port}"],
                "checkpoint": str(checkpoint), "first_port": first_port,
                "log_dir": str((opts.out / "logs").resolve()),
            },
        }
        if state.prometheus_url is not None:
            settings["prometheus_url"] = state.prometheus_url
        config_path = opts.out / "controller.yaml"
        config_path.write_text(yaml.safe_dump(settings, sort_keys=False))
        controller = self.supervisor.start(
            "controller", moeslo_command("controller", "serve", "--config", str(config_path)), cwd=ROOT
        )
        controller.wait_ready(f"{state.controller_url}/health", timeout_s=90)
        response = httpx.put(f"{state.controller_url}/v1/policies/{POLICY_NAME}", json=_policy(checkpoint, opts),
                             timeout=10)
        if response.status_code >= 400:
            raise UnavailableError(f"the controller refused the default policy: {response.text}")
        state.event(f"policy {POLICY_NAME} applied: TTFT<={TTFT_THRESHOLD_S * 1000:g}ms, "
                    f"ITL<={ITL_THRESHOLD_S * 1000:g}ms ({LATENCY_TARGET:.0%}), CV<={MAX_IMBALANCE_CV:g}")
        progress(f"waiting for the first engine replica (EP {opts.ep})")
        deadline = time.monotonic() + 180
        while not self._probe_engines():
            if not controller.alive():
                raise UnavailableError(f"the controller exited:\n{controller.log_tail()}")
            if time.monotonic() > deadline:
                raise UnavailableError("no engine replica became ready within 180 s; see the logs in "
                                       f"{opts.out / 'logs'}")
            time.sleep(1.0)
        state.event(f"engine replica ready at {state.engines[0]}")

    def _start_monitoring(self, controller_port: int, progress: Callable[[str], None]) -> None:
        from generators.alerts.alertmanager import ReceiverOptions, build_alertmanager_config

        opts, state = self.options, self.state
        am_port, prom_port = free_port(), free_port()
        self.pager = WebhookReceiver()
        progress("starting Alertmanager")
        am = start_alertmanager(
            self.supervisor, opts.out / "alertmanager", port=am_port,
            config=build_alertmanager_config(ReceiverOptions(
                page_webhook_url=f"{self.pager.url}/page", ticket_webhook_url=f"{self.pager.url}/ticket",
            )),
        )
        if am is not None:
            state.alertmanager_url = f"http://127.0.0.1:{am_port}"
        progress("starting Prometheus")
        prom = start_prometheus(
            self.supervisor, opts.out / "prometheus", port=prom_port,
            targets={"moeslo-engine": [f"127.0.0.1:{p}" for p in self.engine_ports],
                     "moeslo-controller": [f"127.0.0.1:{controller_port}"]},
            rule_files=[(ROOT / "alerts" / "moeslo-rules.yaml").resolve()],
            alertmanager_port=am_port if am is not None else None,
        )
        if prom is not None:
            state.prometheus_url = f"http://127.0.0.1:{prom_port}"
            state.event("Prometheus and Alertmanager up: the controller reads SLIs through PromQL")
        else:
            state.event("Prometheus not installed: the controller scrapes the engines' /metrics directly")

    def _probe_engines(self) -> list[str]:
        ready = []
        for port in self.engine_ports:
            url = f"http://127.0.0.1:{port}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=0.5).status_code == 200:
                    ready.append(url)
        for url in ready:
            if url not in self.state.engines:
                self.state.event(f"replica {url} serving")
        for url in self.state.engines:
            if url not in ready:
                self.state.event(f"replica {url} gone")
        self.state.engines = ready
        return ready

    # ------------------------------------------------------------------- load
    def load_plan(self) -> list[LoadRequest]:
        from contracts.traces import load_request_trace

        trace = load_request_trace(self.options.trace or conversation_trace())
        return plan_from_trace(trace, duration_s=self.options.duration_s, speedup=self.options.speedup,
                               length_scale=self.options.length_scale, max_prompt_tokens=512,
                               max_output_tokens=64)

    async def _drive(self, plan: list[LoadRequest], vocab_size: int) -> None:
        state = self.state
        rng = np.random.default_rng(self.options.seed)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=120.0, limits=limits) as client:
            start = time.monotonic()

            async def one(req: LoadRequest) -> None:
                delay = start + req.arrival_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                engines = state.engines or [f"http://127.0.0.1:{self.engine_ports[0]}"]
                url = min(engines, key=lambda u: state.in_flight.get(u, 0))
                state.in_flight[url] = state.in_flight.get(url, 0) + 1
                prompt = rng.integers(0, vocab_size, size=req.prompt_tokens).tolist()
                try:
                    record = await send_request(client, req, prompt, start + req.arrival_s, None, 0.0,
                                                base_url=url)
                finally:
                    state.in_flight[url] -= 1
                state.records.append(record)
                state.done_at_s.append(state.elapsed())

            await asyncio.gather(*(one(r) for r in plan))

    # ---------------------------------------------------------------- sample
    async def _sample_loop(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(timeout=3.0) as client:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    await self._sample(client)
                self.on_update(self.state)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.options.sample_interval_s)

    async def _sample(self, client: httpx.AsyncClient) -> None:
        state = self.state
        await asyncio.to_thread(self._probe_engines)
        cvs: list[list[float]] = []
        for url in state.engines:
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                load = (await client.get(f"{url}/v1/expert-load")).json()
                if load.get("steps_in_window"):
                    cvs.append([float(x) for x in load["imbalance_cv"]])
        current = desired = None
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            status = (await client.get(f"{state.controller_url}/v1/status/{POLICY_NAME}")).json()
            current, desired = status.get("current_replicas"), status.get("desired_replicas")
        with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
            page = (await client.get(f"{state.controller_url}/v1/decisions",
                                     params={"policy": POLICY_NAME, "limit": 50})).json()
            for decision in reversed(page.get("items", [])):
                key = str(decision.get("id"))
                if key in state.seen_decisions:
                    continue
                state.seen_decisions.add(key)
                state.decisions.append(decision)
                if decision.get("action") in ("rebalance", "verify_rebalance"):
                    state.event(f"{decision['action']} {decision.get('outcome')}: {decision.get('detail')}")
                elif decision.get("action") != "hold":
                    reasons = ", ".join((decision.get("inputs") or {}).get("reasons", [])[1:]) or decision.get("reason")
                    state.event(f"decision: {decision.get('action')} ({reasons}) "
                                f"{decision.get('current_replicas')} -> {decision.get('desired_replicas')}, "
                                f"{decision.get('outcome')}")
        alerts: list[str] = []
        if state.alertmanager_url is not None:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                active = (await client.get(f"{state.alertmanager_url}/api/v2/alerts")).json()
                alerts = sorted({a["labels"].get("alertname", "?") for a in active})
        if self.pager is not None:
            for path, note in self.pager.posts[len(state.pages):]:
                state.pages.append(note)
                names = ", ".join(sorted({a["labels"].get("alertname", "?") for a in note.get("alerts", [])}))
                state.event(f"{path.strip('/')} delivered ({note.get('status')}): {names}")
        now = state.elapsed()
        recent_ttft = _window([r.ttft_s or 0.0 for r in state.records], state.done_at_s, now - 30)
        recent_itl = [x for r, t in zip(state.records, state.done_at_s, strict=True) if t >= now - 30
                      for x in r.itls_s]
        ok = sum(r.ok for r in state.records)
        state.samples.append(Sample(
            t_s=now,
            ttft_p99_s=float(np.percentile(recent_ttft, 99)) if recent_ttft else None,
            itl_p99_s=float(np.percentile(recent_itl, 99)) if recent_itl else None,
            requests_ok=ok, requests_failed=len(state.records) - ok,
            imbalance_cv=np.max(np.array(cvs), axis=0).tolist() if cvs else [],
            current_replicas=current, desired_replicas=desired, ready_engines=len(state.engines), alerts=alerts,
        ))

    # -------------------------------------------------------------------- run
    async def run_load(self) -> None:
        from engine.config import ModelConfig

        checkpoint = self.options.checkpoint or self.options.out / "checkpoint"
        vocab = ModelConfig.load(checkpoint).vocab_size
        plan = self.load_plan()
        self.state.event(f"replaying {len(plan)} requests of the Azure 2023 conversation trace "
                         f"at {self.options.speedup:g}x over {self.options.duration_s:.0f} s")
        self.state.load_started_s = self.state.elapsed()
        stop = asyncio.Event()
        sampler = asyncio.create_task(self._sample_loop(stop))
        drive = asyncio.create_task(self._drive(plan, vocab))
        try:
            await asyncio.wait_for(asyncio.shield(drive), timeout=self.options.duration_s + DRAIN_S)
        except TimeoutError:
            drive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drive
            self.state.unfinished = len(plan) - len(self.state.records)
            self.state.event(f"stopped {self.state.unfinished} requests still in flight {DRAIN_S:.0f} s "
                             "after the last arrival")
        finally:
            stop.set()
            await sampler

    def stop(self) -> None:
        self.supervisor.stop_all()
        if self.pager is not None:
            self.pager.stop()

    def write_results(self) -> dict[str, Any]:
        from stack.report import summarize, write_plots

        summary = summarize(self.state)
        summary["plots"] = [str(p) for p in write_plots(self.state, self.options.out)]
        (self.options.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


def run_stack(
    options: StackOptions,
    progress: Callable[[str], None] = lambda _text: None,
    on_update: Callable[[StackState], None] | None = None,
) -> dict[str, Any]:
    """Run the stack for ``options.duration_s``; return the summary (also written to ``out/summary.json``)."""
    stack = LocalStack(options, on_update)
    try:
        stack.start(progress)
        asyncio.run(stack.run_load())
    finally:
        stack.stop()
    return stack.write_results()
