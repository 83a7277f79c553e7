"""SLO policies: the typed resource users set over REST.

A policy names what it governs (``target``), what good looks like
(``objectives``), over which compliance window, and how far the controller
may go to keep it (``scaling``, ``lead_time_s``, ``mode``), and how it sizes
the fleet (``forecast``: pre-scaling from a traffic forecast, with a reactive
fallback; ``profile``: the measured capacity of one replica).  Defaults are
the mission's numbers: TTFT <= 500 ms and ITL <= 20 ms for 99 % of requests,
expert-imbalance CV <= 0.15, a 30-day window, 180 s scale-down cooldown and
120 s lead time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Literal, Self, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails
from pydantic_core import ValidationError as PydanticCoreValidationError

from contracts.catalogue import (
    BUCKETS_BY_METRIC,
    TTFT_NORMALIZED_HISTOGRAM,
    format_le,
    is_bucket_edge,
    nearest_edges,
)
from contracts.slo_defaults import (
    COMPLIANCE_WINDOW,
    ITL_THRESHOLD_S,
    LATENCY_TARGET,
    LEAD_TIME_S,
    MAX_IMBALANCE_CV,
    MAX_SCALE_DOWN_RATE,
    SCALE_DOWN_COOLDOWN_S,
    SIZING_HEADROOM,
    TTFT_REFERENCE_PROMPT_TOKENS,
    TTFT_THRESHOLD_S,
)
from contracts.ttft_objective import TtftAllowance, format_allowance_label, label_keeps
from controller.capacity import ReplicaProfile
from controller.endpoints import check_endpoint_url

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"
"""Names, models and paths: no control characters (NUL, newlines, escapes)."""
_TEXT = r"^[^\x00-\x08\x0b-\x1f\x7f]*$"
"""Free text: tabs and newlines, no other control characters."""
ModelName = Annotated[str, Field(min_length=1, max_length=253, pattern=_NO_CONTROL)]
_DURATION = re.compile(r"([0-9]+)([smhdw])")
"""Matched whole (``fullmatch``): ``\\d`` would take any script's digits and ``$`` a trailing newline, neither of
which Prometheus or OpenSLO reads."""
_DURATION_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

FASTEST_ALERT_WINDOW_S = 3600
"""The long window of the fastest burn-rate alert (the SRE workbook's 1h/5m page, :mod:`controller.slo`)."""
FASTEST_ALERT_BUDGET_FRACTION = 0.02
"""The share of the window's error budget that alert pages on (2 % within its hour)."""
MIN_WINDOW_S = round(FASTEST_ALERT_WINDOW_S / FASTEST_ALERT_BUDGET_FRACTION)
"""The shortest compliance window (50 h): the fastest alert's burn-rate factor, 0.02 x window / 1 h, reaches 1 only
there.  Under it every standard alert would fire while the SLO is still met, so the alert generator has no rule to
write, and a policy is refused, by the API and the generator alike."""
MAX_WINDOW_S = 366 * 86400
"""The longest compliance window (366 days)."""
STORED = "stored"
"""Validation context key (``{STORED: True}``) of a spec read back from the store: a policy written before the
window rule above (from 1h, whatever its targets), the 6 significant digits of a TTFT allowance or the bucket-edge
rule of a TTFT threshold with an allowance still loads, so the controller keeps serving it; any change to it is
validated in full."""
NORMALIZED_TTFT_EDGES_S = BUCKETS_BY_METRIC[TTFT_NORMALIZED_HISTOGRAM]
"""The edges every engine writes ``moeslo_ttft_normalized_seconds`` with (the embedded one and the vLLM plugin)."""


def parse_duration_s(text: str) -> int:
    """Seconds in a Prometheus-style duration such as ``30d`` or ``5m``."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"duration {text!r} must be a number followed by one of s, m, h, d, w (e.g. 30d)")
    return int(match.group(1)) * _DURATION_S[match.group(2)]


class Mode(StrEnum):
    """What the controller does with its decisions for a policy."""

    ENFORCE = "enforce"
    """Decide and actuate."""
    ADVISORY = "advisory"
    """Decide and log, never actuate."""
    OFF = "off"
    """Neither decide nor actuate; SLIs are still evaluated."""


class _Strict(BaseModel):
    # Numbers are strict (no bools, no numeric strings, no 1.0 for counts): a wrong type is a 422.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ModelTarget(_Strict):
    """Engines found by the model name they serve (read-only: nothing to scale)."""

    kind: Literal["model"] = "model"
    model: ModelName


class KubernetesTarget(_Strict):
    """A Deployment or LeaderWorkerSet whose ``scale`` subresource the controller patches."""

    kind: Literal["deployment", "leaderworkerset"]
    namespace: Annotated[str, Field(pattern=_DNS_LABEL.pattern)]
    name: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
    model: ModelName | None = None
    """Model name used in metric label selectors; defaults to the workload name."""
    hpa: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")] | None = None
    """Name of an HPA that owns the workload: the controller then patches its minReplicas."""
    port: Annotated[int, Field(strict=True, ge=1, le=65535)] = 8000
    """Port the workload's engines serve on: its ready pods are listed as ``http://<pod IP>:<port>``
    (``/v1/policies/{name}/endpoints``, what the entry router reads)."""


class LocalTarget(_Strict):
    """Embedded-engine processes on this machine."""

    kind: Literal["local"] = "local"
    model: ModelName = "moeslo-qwen3-moe"
    checkpoint: Annotated[str, Field(min_length=1, max_length=4096, pattern=_NO_CONTROL)] | None = None
    """Checkpoint directory for new replicas (None: the controller's configured default)."""
    endpoints: Annotated[tuple[str, ...], Field(max_length=256)] = ()
    """Metrics endpoints of replicas started outside the controller (``http://host:port``; loopback,
    link-local and metadata addresses only where the controller's config allows them)."""

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_endpoint_url(url) for url in value)


Target = Annotated[ModelTarget | KubernetesTarget | LocalTarget, Field(discriminator="kind")]
TARGET_KINDS = frozenset(
    kind for target in (ModelTarget, KubernetesTarget, LocalTarget)
    for kind in get_args(target.model_fields["kind"].annotation)
)
"""What ``target.kind`` may be; pydantic puts the one it validated against in an error's location."""

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
ROUTER_JOB = "moeslo-router"
"""The ``job`` label of the entry router's series, as deploy/'s PodMonitor and ``moeslo up``'s Prometheus set it."""


class EntryRouter(_Strict):
    """The entry router (``moeslo route``) in front of this policy's replicas.

    Requests it holds at admission (``moeslo_router_queued_requests``, queue mode) are demand the
    engines do not see yet: they add to the engines' queue, and they are what scales a fleet up from
    zero replicas.  Requests it refuses with 429 (``outcome="rejected"``) are demand too: their rate
    adds to the engines' (:func:`controller.entry_demand.offered_load`).  The Prometheus source reads
    the series its ``prometheus_labels`` select; the direct-scrape source reads ``<endpoint>/metrics``
    of each of its ``endpoints``.  The router's series carry no model label, so a router named by
    several policies counts its whole queue and refusals for each of them.
    """

    endpoints: Annotated[tuple[str, ...], Field(max_length=64)] = ()
    """Base URLs of the router replicas (``http://host:port``) for the direct-scrape source (the same
    address rules as ``target.endpoints``)."""
    prometheus_labels: Annotated[dict[str, str], Field(min_length=1, max_length=16)] = {"job": ROUTER_JOB}
    """Exact-match labels that pick the router's series in Prometheus (summed over what matches)."""

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("a router endpoint is listed twice")
        return tuple(check_endpoint_url(url) for url in value)

    @field_validator("prometheus_labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for name, label_value in value.items():
            if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
                raise ValueError(f"{name!r} is not a Prometheus label name (letters, digits, _; no leading __)")
            if len(label_value) > 1024 or re.search(r"[\x00-\x1f\x7f]", label_value):
                raise ValueError(f"the value of label {name!r} must be at most 1024 characters, no control characters")
        return value

    def __hash__(self) -> int:  # a frozen model with a dict field: hash what identifies it
        return hash((self.endpoints, tuple(sorted(self.prometheus_labels.items()))))


class LatencyObjective(_Strict):
    """``target`` of requests must see the latency at or below ``threshold_s``."""

    threshold_s: Annotated[float, Field(strict=True, gt=0, le=3600, allow_inf_nan=False)]
    target: Annotated[float, Field(strict=True, gt=0, lt=1, allow_inf_nan=False)]


class TtftObjective(LatencyObjective):
    """TTFT at a reference prompt length: ``target`` of requests must see
    ``TTFT - per_1k_prompt_tokens_s * max(0, prompt - reference_prompt_tokens) / 1000 <= threshold_s``.

    The default allowance (0) is the flat objective; see :mod:`contracts.ttft_objective`.
    """

    reference_prompt_tokens: Annotated[int, Field(strict=True, ge=0, le=10_000_000)] = TTFT_REFERENCE_PROMPT_TOKENS
    """The prompt length ``threshold_s`` is stated for."""
    per_1k_prompt_tokens_s: Annotated[float, Field(strict=True, ge=0, le=60, allow_inf_nan=False)] = 0.0
    """Extra TTFT allowed per 1,000 prompt tokens beyond the reference (0: a flat objective), to 6 significant
    digits: the normalized histogram's label spells it so, and two allowances that differ only beyond it would
    read one series."""

    @field_validator("per_1k_prompt_tokens_s")
    @classmethod
    def _six_digits(cls, value: float, info: ValidationInfo) -> float:
        if label_keeps(value) or (info.context and info.context.get(STORED)):
            return value
        raise ValueError(f"per_1k_prompt_tokens_s {value!r}: at most 6 significant digits, as the "
                         f"{TTFT_NORMALIZED_HISTOGRAM} label spells it ({format_allowance_label(value)})")

    @model_validator(mode="after")
    def _normalized_edge(self, info: ValidationInfo) -> Self:
        # The controller's SLI would interpolate inside a bucket where the definition, the alerts and the replay
        # judge each request: 99 % good reads as 20 % at 0.3 s.  The flat objective reads vLLM's own TTFT
        # histogram, whose edges --custom-histogram-buckets may set: deploy render checks it per engine.
        if self.allowance.flat or is_bucket_edge(self.threshold_s, NORMALIZED_TTFT_EDGES_S):
            return self
        if info.context and info.context.get(STORED):
            return self
        around = nearest_edges(self.threshold_s, NORMALIZED_TTFT_EDGES_S)
        nearest = " and ".join(format_le(edge) for edge in around if edge is not None)
        problem = (
            f"threshold_s {self.threshold_s!r} is not a bucket edge of {TTFT_NORMALIZED_HISTOGRAM}; the nearest "
            f"edges are {nearest}. An objective with a long-prompt allowance counts its good requests from the "
            f"bucket at the threshold, so it must be one of {', '.join(map(format_le, NORMALIZED_TTFT_EDGES_S))}"
        )
        # Raised as pydantic's own error so that it names the field, not the objective (a ValueError here would).
        detail = InitErrorDetails(type="value_error", loc=("threshold_s",), input=self.threshold_s,
                                  ctx={"error": ValueError(problem)})  # fmt: skip
        raise PydanticCoreValidationError.from_exception_data(type(self).__name__, [detail])

    @property
    def allowance(self) -> TtftAllowance:
        return TtftAllowance(self.reference_prompt_tokens, self.per_1k_prompt_tokens_s)


class ImbalanceObjective(_Strict):
    """Per-layer CV of per-rank expert load must stay at or below ``max_cv``."""

    max_cv: Annotated[float, Field(strict=True, gt=0, le=10, allow_inf_nan=False)] = MAX_IMBALANCE_CV
    sustain_s: Annotated[int, Field(strict=True, ge=0, le=86400)] = 300
    """How long a violation must last before a rebalance is considered."""


class Objectives(_Strict):
    ttft: TtftObjective = TtftObjective(threshold_s=TTFT_THRESHOLD_S, target=LATENCY_TARGET)
    itl: LatencyObjective = LatencyObjective(threshold_s=ITL_THRESHOLD_S, target=LATENCY_TARGET)
    imbalance: ImbalanceObjective = ImbalanceObjective()

    @field_validator("ttft", mode="before")
    @classmethod
    def _flat_ttft(cls, value: object) -> object:
        # A plain latency objective is the flat TTFT objective (code written before the allowance).
        if isinstance(value, LatencyObjective) and not isinstance(value, TtftObjective):
            return value.model_dump()
        return value


class Scaling(_Strict):
    min_replicas: Annotated[int, Field(strict=True, ge=0, le=10000)] = 1
    """0 lets the fleet go to zero replicas, but only for a policy that names its entry ``router``: a
    fleet at zero has no engines and so no engine signals, and the router's queue is what wakes it.
    Without a router the controller never goes below 1 (see ``Policy.router``)."""
    max_replicas: Annotated[int, Field(strict=True, ge=1, le=10000)] = 8
    scale_down_cooldown_s: Annotated[int, Field(strict=True, ge=0, le=86400)] = SCALE_DOWN_COOLDOWN_S
    max_step: Annotated[int, Field(strict=True, ge=1, le=10000)] = 4
    """Most replicas added or removed in one tick."""
    max_scale_down_rate: Annotated[float, Field(strict=True, gt=1, le=1000, allow_inf_nan=False)] = MAX_SCALE_DOWN_RATE
    """A scale-down keeps at least ``current / max_scale_down_rate`` replicas (Knative's ``max-scale-down-rate``;
    2: at most half the fleet at once), but may always remove one.  Below that the capacity model would be
    trusted at a size the fleet has not been seen to serve at, and a wrong guess costs a start-up time of missed
    objectives.  A fleet going to zero (an idle router, ``min_replicas: 0``) is not held by it."""
    headroom: Annotated[float, Field(strict=True, ge=0.5, le=1.0, allow_inf_nan=False)] = SIZING_HEADROOM
    """The fleet is sized so that the capacity model's p99s stay within this share of each latency objective
    (and the KV cache and batch within this share of theirs): what the model does not see (bursts inside a
    tick, a replica's bad minute) comes out of the rest.  Lower buys attainment with replicas, as an HPA's
    lower target does; 1 sizes for the objectives themselves."""

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})"
            )
        return self


class ForecastSettings(_Strict):
    """How the controller forecasts this policy's traffic, and when it stops trusting the forecast.

    With ``enabled``, the fleet is sized one lead time ahead for the upper ``quantile`` of the
    forecast interval, never below what the load and queue need now.  Every forecast is scored
    against what arrived: when the rolling WAPE rises above ``max_wape`` or the share of actuals
    inside its 80 % interval falls below ``min_coverage``, sizing falls back to reactive
    (``forecast_unreliable``) until both recover.
    """

    enabled: Annotated[bool, Field(strict=True)] = True
    quantile: Annotated[float, Field(strict=True, ge=0.5, lt=1, allow_inf_nan=False)] = 0.9
    """Upper quantile of the forecast interval the fleet is sized for."""
    min_history_s: Annotated[int, Field(strict=True, ge=0, le=30 * 86400)] = 240
    """History the forecaster needs before its forecasts are used (until then: reactive)."""
    max_wape: Annotated[float, Field(strict=True, gt=0, le=10, allow_inf_nan=False)] = 0.5
    """Rolling weighted absolute percentage error above which the forecast is not trusted."""
    min_coverage: Annotated[float, Field(strict=True, ge=0, le=1, allow_inf_nan=False)] = 0.5
    """Share of actuals that must fall inside the forecast's 80 % interval (its quantile-0.9 one, nominally
    80 % covered), whatever ``quantile`` the fleet is sized for."""
    audit_forecasts: Annotated[int, Field(strict=True, ge=4, le=10000)] = 40
    """How many scored forecasts the rolling WAPE and coverage cover; the forecast is judged once 8 are scored
    (all of a shorter window)."""


def alert_target_problem(objective: str, target: float, window: str) -> str | None:
    """Why the fastest burn-rate alert over ``window`` cannot fire for ``objective``'s ``target`` (None: it can).

    Its factor is 0.02 x window / 1 h (14.4 for 30 days), and with every event bad the burn rate is
    ``1 / (1 - target)`` at most: a lower ceiling means a page that never fires, which the alert generator
    refuses.  A shorter window lowers the factor; a higher target raises the ceiling.
    """
    seconds = parse_duration_s(window)
    factor = FASTEST_ALERT_BUDGET_FRACTION * seconds / FASTEST_ALERT_WINDOW_S  # as controller.slo computes it
    if factor * (1.0 - target) <= 1.0:
        return None
    longest_h = math.floor(FASTEST_ALERT_WINDOW_S / (FASTEST_ALERT_BUDGET_FRACTION * (1.0 - target)) / 3600)
    lowest_target = math.ceil((1.0 - FASTEST_ALERT_WINDOW_S / (FASTEST_ALERT_BUDGET_FRACTION * seconds)) * 1e6) / 1e6
    return (
        f"a {window} window is too long for objectives.{objective}.target {target:g}: its 1h/5m page alert needs "
        f"a burn rate of {factor:.6g}, and with target {target:g} the most it can reach is {1 / (1 - target):.6g} "
        f"(every event bad); use a window of at most {longest_h}h or a target of at least {lowest_target:g}"
    )


class Policy(_Strict):
    """One SLO policy."""

    name: Annotated[str, Field(pattern=_DNS_LABEL.pattern, max_length=63)]
    description: Annotated[str, Field(max_length=1024, pattern=_TEXT)] = ""
    target: Target
    objectives: Objectives = Objectives()
    window: str = COMPLIANCE_WINDOW
    """Compliance window, a Prometheus duration (e.g. ``30d``), from 50h to 366d, and no longer than the objectives'
    targets allow their burn-rate alerts (:func:`alert_target_problem`)."""
    scaling: Scaling = Scaling()
    lead_time_s: Annotated[int, Field(strict=True, ge=0, le=86400)] = LEAD_TIME_S
    """Replica start-up time: how far ahead scale-ups must happen."""
    forecast: ForecastSettings = ForecastSettings()
    profile: ReplicaProfile | None = None
    """Capacity of one replica (``moeslo profile`` writes it); None: the controller's default profile."""
    router: EntryRouter | None = None
    """The entry router in front of the replicas: its queue and refusals count as demand (None: engine signals
    only)."""
    mode: Mode = Mode.ENFORCE

    @field_validator("window")
    @classmethod
    def _window(cls, value: str, info: ValidationInfo) -> str:
        seconds = parse_duration_s(value)
        if info.context and info.context.get(STORED) and 3600 <= seconds <= MAX_WINDOW_S:
            return value
        if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
            raise ValueError(
                f"window {value!r} must be between {MIN_WINDOW_S // 3600}h and {MAX_WINDOW_S // 86400}d: a shorter "
                "compliance window has no burn-rate alert (the fastest, 1h/5m, would fire below 1x, while the SLO "
                "is still met)"
            )
        objectives = info.data.get("objectives")  # absent when it failed validation itself
        if isinstance(objectives, Objectives):
            problems = [alert_target_problem(key, getattr(objectives, key).target, value) for key in ("ttft", "itl")]
            if any(problems):
                raise ValueError("; ".join(p for p in problems if p))
        return value

    @property
    def window_s(self) -> int:
        return parse_duration_s(self.window)

    @property
    def model_name(self) -> str:
        """The ``model_name`` label value of the engines this policy watches."""
        target = self.target
        if isinstance(target, KubernetesTarget):
            return target.model or target.name
        return target.model


def model_held_problem(model: str, holder: str, policy: str, *, where: str = "") -> str:
    """Why ``policy`` may not watch ``model``: ``holder`` (found ``where``) does.  The SLIs, the load and the alerts
    are read per ``model_name``, so two policies of one model would each see the other's traffic and page together."""
    return (f"model {model!r} is watched by policy {holder!r}{where} already: policy {policy!r} cannot watch it "
            f"too (one policy a model; give {policy!r} another target.model, or change or delete {holder!r})")


def shared_model_problems(policies: Mapping[int, Policy], *, source: str | None = None) -> list[str]:
    """A problem for each policy whose model an earlier one of another name watches.  With ``source``, the
    policies are the items of that file by their index, and the problems name the items."""
    first: dict[str, int] = {}
    problems = []
    for index, policy in policies.items():
        holder = first.setdefault(policy.model_name, index)
        if policies[holder].name == policy.name:
            continue
        where, field = ("", "") if source is None else (f" (at [{holder}])", f"{source}[{index}].target.model: ")
        problems.append(field + model_held_problem(policy.model_name, policies[holder].name, policy.name, where=where))
    return problems
