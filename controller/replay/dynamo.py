"""NVIDIA Dynamo's SLA planner (throughput-based, Gen A), as its source does it, on aggregated replicas.

Ported from ai-dynamo/dynamo ``components/src/dynamo/planner/utils/`` (@002a7c31 unless noted):

- timing (``BasePlanner.run``, ``_throughput_loop``): the first adjustment comes one
  ``adjustment_interval`` (180 s) after the planner starts, then one per interval;
- observation (``observe_traffic_stats``): means over the last interval from the
  frontend's histograms (``increase(sum[180s]) / increase(count[180s])``) of TTFT, ITL,
  request duration, ISL and OSL, and ``increase(requests_total[180s])`` (a count); an
  interval without traffic is skipped (``Metrics.is_valid``); every interval feeds one
  point to each of the three predictors (:mod:`controller.replay.dynamo_predictors`);
- correction factors (``_update_correction_factor``, recomputed every interval from that
  interval alone): ``p_cf = ttft / interpolate_ttft(isl)``;
  ``d_cf = itl / interpolate_itl(concurrency, isl + osl / 2)`` with
  ``concurrency = num_req / workers * request_duration / interval`` (Little's law);
- replicas (``_compute_replica_requirements``): prefill demand
  ``num_req * isl / interval * min(1, p_cf)`` over the profile's prefill throughput per
  GPU at that ISL; decode demand ``num_req * osl / interval`` over the best decode
  throughput per GPU whose ITL meets ``itl_target / d_cf`` at that context length;
- profile (``perf_interpolation.py``): prefill TTFT and throughput against ISL from a
  one-request-at-a-time sweep, cubic ``interp1d``, ISL clipped to the swept range;
  decode ITL and throughput on a 100 x 100 grid of (KV usage, context length);
  ``find_best_throughput_per_gpu`` scans from the highest KV usage down;
- actuation (``KubernetesConnector.set_component_replicas``): a decision made while the
  deployment is not ready (replicas still starting) is dropped.

Two adaptations, stated: (1) moeslo replicas are aggregated (each serves both phases),
so the planner's prefill and decode demands (in GPUs, before its ceilings) are added
and rounded up once; (2) its profile is generated from the controllers'
:class:`ReplicaProfile` (what Dynamo's profiler would have measured on the nominal
engine), and ``headroom`` (the replay's tuning knob) divides the demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from contracts.errors import ValidationError
from contracts.traces import FloatArray
from controller.capacity import ReplicaProfile
from controller.replay.dynamo_predictors import PREDICTORS, LoadPredictor, make_predictor
from controller.replay.signals import FrontendWindow

__all__ = ["DecodeProfile", "DynamoPlanner", "PlannerSettings", "PrefillProfile"]

GRID = 100


class PrefillProfile:
    """``PrefillInterpolator``: TTFT and throughput per GPU against ISL (one request at a time)."""

    def __init__(self, profile: ReplicaProfile, *, max_context_tokens: int) -> None:
        from scipy.interpolate import interp1d

        self.isl = np.linspace(100.0, max(max_context_tokens - 512.0, 200.0), 16)
        # A lone prompt prefills at the raw rate (nothing decodes beside it).
        self.ttft_ms = (profile.ttft_overhead_s + self.isl / profile.prefill_tokens_per_s) * 1000.0
        thpt = self.isl / self.ttft_ms * 1000.0
        self._ttft = interp1d(self.isl, self.ttft_ms, kind="cubic")
        self._thpt = interp1d(self.isl, thpt, kind="cubic")

    def _clip(self, isl: float) -> float:
        return float(np.clip(isl, self.isl[0], self.isl[-1]))

    def interpolate_ttft_ms(self, isl: float) -> float:
        return float(self._ttft(self._clip(isl)))

    def interpolate_thpt_per_gpu(self, isl: float) -> float:
        return float(self._thpt(self._clip(isl)))


class DecodeProfile:
    """``DecodeInterpolator``: ITL and throughput per GPU on a (KV usage, context length) grid."""

    def __init__(self, profile: ReplicaProfile, *, max_context_tokens: int) -> None:
        self.max_kv_tokens = float(profile.kv_capacity_tokens)
        self.xi = np.linspace(0.0, 1.0, GRID)
        self.yi = np.linspace(0.0, float(max_context_tokens), GRID)
        kv, context = np.meshgrid(self.xi, self.yi)  # rows: context, columns: KV usage
        with np.errstate(divide="ignore", invalid="ignore"):
            concurrency = np.where(context > 0, kv * self.max_kv_tokens / context, profile.max_num_seqs)
        batch = np.clip(concurrency, 1.0, profile.max_num_seqs)
        step_s = profile.itl_base_s + profile.itl_per_seq_s * batch
        self.itl_ms: FloatArray = step_s * 1000.0
        self.thpt_per_gpu: FloatArray = batch / step_s

    def _index(self, concurrency: float, context: float) -> tuple[int, int]:
        ix = int(np.clip(round(concurrency * context / self.max_kv_tokens / self.xi[1]), 0, GRID - 1))
        iy = int(np.clip(round(context / self.yi[1]), 0, GRID - 1))
        return ix, iy

    def interpolate_itl_ms(self, concurrency: float, context: float) -> float:
        ix, iy = self._index(concurrency, context)
        return float(self.itl_ms[iy, ix])

    def find_best_throughput_per_gpu(self, itl_ms: float, context: float) -> float:
        iy = int(np.clip(round(context / self.yi[1]), 0, GRID - 1))
        for ix in range(GRID - 1, -1, -1):
            if self.itl_ms[iy, ix] <= itl_ms:
                return float(self.thpt_per_gpu[iy, ix])
        return float(self.thpt_per_gpu[iy, 0])


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannerSettings:
    adjustment_interval_s: float = 180.0
    predictor: str = "arima"
    ttft_target_ms: float = 500.0
    itl_target_ms: float = 20.0
    """Dynamo's default is 50 ms; the replay gives it the mission's SLO."""
    min_endpoint: int = 1
    max_replicas: int = 10_000
    """``max_gpu_budget`` at one GPU per replica (its default of 8 would cap any real fleet)."""
    headroom: float = 1.0
    """Demand is divided by this (the replay's tuning knob; 1.0 is Dynamo as shipped)."""
    no_correction: bool = False
    max_context_tokens: int = 32_768

    def __post_init__(self) -> None:
        problems = []
        if self.predictor not in PREDICTORS:
            problems.append(f"predictor must be one of {', '.join(PREDICTORS)}, got {self.predictor!r}")
        if not 0 < self.headroom <= 2:
            problems.append(f"headroom must be in (0, 2], got {self.headroom}")
        if self.adjustment_interval_s <= 0:
            problems.append("adjustment_interval_s must be > 0")
        if problems:
            raise ValidationError(problems)


@dataclass(kw_only=True)
class _Corrections:
    prefill: float = 1.0
    decode: float = 1.0


@dataclass(kw_only=True)
class PlannerDecision:
    """What one adjustment computed (kept for tests and plots)."""

    at_s: float
    replicas: int | None
    predicted_requests: float
    predicted_isl: float
    predicted_osl: float
    prefill_correction: float
    decode_correction: float
    dropped: bool = False


class DynamoPlanner:
    """The planner's throughput loop; :meth:`tick` is called at every replay tick."""

    def __init__(self, profile: ReplicaProfile, settings: PlannerSettings, *, started_at_s: float = 0.0) -> None:
        self.settings = settings
        self.prefill = PrefillProfile(profile, max_context_tokens=settings.max_context_tokens)
        self.decode = DecodeProfile(profile, max_context_tokens=settings.max_context_tokens)
        self.predictors: dict[str, LoadPredictor] = {
            name: make_predictor(settings.predictor) for name in ("num_req", "isl", "osl")
        }
        self.last_adjustment_s = started_at_s
        self.corrections = _Corrections()
        self.decisions: list[PlannerDecision] = []
        self._last_prediction = (0.0, 0.0, 0.0)

    def due(self, now_s: float) -> bool:
        return now_s - self.last_adjustment_s >= self.settings.adjustment_interval_s - 1e-9

    def tick(self, now_s: float, window: FrontendWindow, *, ready_workers: int, deployment_ready: bool) -> int | None:
        """The replica count to set now, or None (not due, no traffic, or dropped as not ready)."""
        if not self.due(now_s):
            return None
        self.last_adjustment_s = now_s
        self._observe(window)
        if not window.valid:
            return None
        self._correct(window, ready_workers)
        replicas = self.plan()
        decision = PlannerDecision(
            at_s=now_s,
            replicas=replicas,
            predicted_requests=self._last_prediction[0],
            predicted_isl=self._last_prediction[1],
            predicted_osl=self._last_prediction[2],
            prefill_correction=self.corrections.prefill,
            decode_correction=self.corrections.decode,
            dropped=not deployment_ready,
        )
        self.decisions.append(decision)
        return replicas if deployment_ready else None

    def _observe(self, window: FrontendWindow) -> None:
        """``update_predictors_from_metrics``: one point per series (NaN -> 0 in the predictor)."""
        self.predictors["num_req"].add_data_point(window.requests)
        self.predictors["isl"].add_data_point(_rounded(window.prompt_mean_tokens))
        self.predictors["osl"].add_data_point(_rounded(window.output_mean_tokens))

    def _correct(self, window: FrontendWindow, ready_workers: int) -> None:
        if self.settings.no_correction:
            return
        assert window.ttft_mean_s is not None and window.itl_mean_s is not None
        isl = window.prompt_mean_tokens or 0.0
        osl = window.output_mean_tokens or 0.0
        expected_ttft = self.prefill.interpolate_ttft_ms(isl)
        if expected_ttft > 0:
            self.corrections.prefill = window.ttft_mean_s * 1000.0 / expected_ttft
        if ready_workers > 0 and window.duration_mean_s is not None:
            interval = self.settings.adjustment_interval_s
            concurrency = window.requests / ready_workers * window.duration_mean_s / interval
            expected_itl = self.decode.interpolate_itl_ms(concurrency, isl + osl / 2.0)
            if expected_itl > 0:
                self.corrections.decode = window.itl_mean_s * 1000.0 / expected_itl

    def plan(self) -> int:
        """``_compute_replica_requirements`` on predicted load, prefill and decode GPUs added."""
        s = self.settings
        interval = s.adjustment_interval_s
        requests = self.predictors["num_req"].predict_next()
        isl = self.predictors["isl"].predict_next()
        osl = self.predictors["osl"].predict_next()
        self._last_prediction = (requests, isl, osl)
        prefill_tokens_per_s = requests * isl / interval * min(1.0, self.corrections.prefill)
        prefill_gpus = prefill_tokens_per_s / max(self.prefill.interpolate_thpt_per_gpu(isl), 1e-9)
        decode_cf = self.corrections.decode
        itl_target = s.itl_target_ms if decode_cf <= 0 else s.itl_target_ms / decode_cf
        per_gpu = self.decode.find_best_throughput_per_gpu(itl_target, isl + osl / 2.0)
        decode_gpus = requests * osl / interval / per_gpu if per_gpu > 0 else 0.0
        demand = (prefill_gpus + decode_gpus) / s.headroom
        replicas = max(math.ceil(round(demand, 9)), s.min_endpoint)
        return min(replicas, s.max_replicas)


def _rounded(value: float | None) -> float:
    """Means as a histogram's sum over count reports them (the float noise of two increases removed)."""
    return math.nan if value is None else round(value, 3)
