"""Settings of the vLLM plugin, read once from the environment.

The plugin runs inside vLLM's processes, which we do not start, so the
environment is its only configuration channel (vLLM passes it on to the
engine-core and worker processes it spawns).

========================  =========  ==================================================
variable                  default    meaning
========================  =========  ==================================================
MOESLO_VLLM_PLUGIN        unset      ``1`` (or ``on``, ``true``) switches the plugin on; ``0``,
                                     ``off``, ``false`` or unset leave it off
MOESLO_VLLM_EP_RANKS      8          virtual EP size when vLLM runs without EP
MOESLO_VLLM_FLUSH_S       1.0        how often workers publish their counts (seconds, 0.1 to 60)
MOESLO_VLLM_WINDOW_S      60.0       routing window of the imbalance gauges (seconds; past 1,000
                                     flush intervals, kept in 1,000 slots of several flushes)
MOESLO_VLLM_MODEL_NAME    unknown    ``model_name`` label only where vLLM's config is unreadable
                                     (else vLLM's served model name, as on its own series)
MOESLO_VLLM_EXPERT_SERIES auto       ``moe_expert_tokens_total`` per (layer, expert): ``auto``
                                     up to 4,096 series (as ``moeslo serve``), ``1`` always,
                                     ``0`` never
MOESLO_VLLM_METRICS_DIR   (temp)     where workers leave snapshots without multiprocess
                                     Prometheus (set by the plugin in vLLM's API server)
MOESLO_TTFT_ALLOWANCES    unset      long-prompt allowances ``moeslo_ttft_normalized_seconds``
                                     has series for besides 1000:0.05 (``2000:0.1,...``, as
                                     ``moeslo serve --ttft-allowances``)
========================  =========  ==================================================
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from contracts.errors import ValidationError
from contracts.ttft_objective import EXPORTED_BY_DEFAULT, TTFT_ALLOWANCES_ENV, TtftAllowance, exported_allowances

ENABLE_ENV = "MOESLO_VLLM_PLUGIN"
EP_RANKS_ENV = "MOESLO_VLLM_EP_RANKS"
FLUSH_ENV = "MOESLO_VLLM_FLUSH_S"
WINDOW_ENV = "MOESLO_VLLM_WINDOW_S"
MODEL_NAME_ENV = "MOESLO_VLLM_MODEL_NAME"
METRICS_DIR_ENV = "MOESLO_VLLM_METRICS_DIR"
EXPERT_SERIES_ENV = "MOESLO_VLLM_EXPERT_SERIES"
FLUSH_BOUNDS_S = (0.1, 60.0)
"""The flush interval's range.  Below 0.1 s nothing reads the snapshots (a scrape or a controller tick is
a second or more apart) while each one costs the worker that runs the model a device copy, the GIL and a
file write, and the routing window holds ``window_s / flush_s`` slots (60 s at 1 ms: 60,000 arrays of
layers x experts); above 60 s ``/metrics`` serves counts older than a scrape interval and the routing
window stretches to one flush (and past about 9e9 s the flush thread's wait overflows)."""
_SWITCH = {"": None, "auto": None, "1": True, "on": True, "true": True, "0": False, "off": False, "false": False}
PROMETHEUS_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginSettings:
    """What the plugin does in this process."""

    enabled: bool = False
    virtual_ep_ranks: int = 8
    """Ranks to group experts into (contiguously) when vLLM's EP is off."""
    flush_interval_s: float = 1.0
    window_s: float = 60.0
    model_name: str | None = None
    expert_series: bool | None = None
    """Per-(layer, expert) series: None for up to the exporters' cap, else forced on or off."""
    metrics_dir: str | None = None
    prometheus_multiproc_dir: str | None = None
    ttft_allowances: tuple[TtftAllowance, ...] = EXPORTED_BY_DEFAULT

    @property
    def window_flushes(self) -> int:
        """The routing window in flush intervals (at least one)."""
        return max(1, math.ceil(self.window_s / self.flush_interval_s))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PluginSettings:
        """Read the settings; every bad value is reported in one ValidationError."""
        env = os.environ if env is None else env
        problems: list[str] = []

        def number(name: str, default: float, *, integer: bool, bounds: tuple[float, float] | None = None) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = int(raw) if integer else float(raw)
            except ValueError:
                problems.append(f"{name}={raw!r} is not {'an integer' if integer else 'a number'}")
                return default
            if bounds is not None and not bounds[0] <= value <= bounds[1]:
                problems.append(f"{name}={raw!r} must be between {bounds[0]:g} and {bounds[1]:g} seconds")
                return default
            if not value > 0 or not math.isfinite(value):
                problems.append(f"{name}={raw!r} must be > 0")
                return default
            return value

        ranks = int(number(EP_RANKS_ENV, 8, integer=True))
        flush_s = number(FLUSH_ENV, 1.0, integer=False, bounds=FLUSH_BOUNDS_S)
        window_s = number(WINDOW_ENV, 60.0, integer=False)
        switch = env.get(ENABLE_ENV, "").strip().lower()
        if switch not in _SWITCH or switch == "auto":  # a typo must not leave the plugin off without a word
            problems.append(f"{ENABLE_ENV}={switch!r} is not 1 or 0 (on or off, true or false)")
        series = env.get(EXPERT_SERIES_ENV, "").strip().lower()
        if series not in _SWITCH:
            problems.append(f"{EXPERT_SERIES_ENV}={series!r} is not auto, 1 or 0")
        allowances = EXPORTED_BY_DEFAULT
        try:
            allowances = exported_allowances(env.get(TTFT_ALLOWANCES_ENV))
        except ValueError as exc:
            problems.append(f"{TTFT_ALLOWANCES_ENV}: {exc}")
        if problems:
            raise ValidationError(problems)
        return cls(
            enabled=_SWITCH[switch] is True,
            virtual_ep_ranks=ranks,
            flush_interval_s=flush_s,
            window_s=window_s,
            model_name=env.get(MODEL_NAME_ENV) or None,
            expert_series=_SWITCH[series],
            metrics_dir=env.get(METRICS_DIR_ENV) or None,
            prometheus_multiproc_dir=env.get(PROMETHEUS_MULTIPROC_ENV) or None,
            ttft_allowances=allowances,
        )
