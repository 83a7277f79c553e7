"""What a decision records of its inputs: the observation it saw and every advisor's advice (flat, JSON-safe).

Split from :mod:`controller.core`; the decision log and ``/v1/status`` show these keys.
"""

from __future__ import annotations

from controller.types import Advice, PolicyObservation, Scalar

__all__ = ["record_advice", "record_observation"]


def record_observation(inputs: dict[str, Scalar], obs: PolicyObservation, now_s: float) -> None:
    inputs["observed_at_s"] = obs.observed_at_s
    inputs["data_age_s"] = now_s - obs.observed_at_s
    inputs["current_replicas"] = obs.current_replicas
    inputs["ready_replicas"] = obs.ready_replicas
    inputs["queue_depth"] = obs.queue_depth
    if obs.router_queued is not None:
        inputs["router_queued"] = obs.router_queued
    if obs.router_refused_rps is not None:
        inputs["router_refused_rps"] = obs.router_refused_rps
    inputs["running_requests"] = obs.running_requests
    inputs["request_rate_rps"] = obs.request_rate_rps
    if obs.request_rate_peak_rps is not None:
        inputs["request_rate_peak_rps"] = obs.request_rate_peak_rps
    inputs["prompt_tokens_per_s"] = obs.prompt_tokens_per_s
    inputs["output_tokens_per_s"] = obs.output_tokens_per_s
    inputs["kv_cache_usage"] = obs.kv_cache_usage
    inputs["prefix_cache_hit_rate"] = obs.prefix_cache_hit_rate
    inputs["source_errors"] = len(obs.errors)
    sli = obs.sli
    if sli is not None:
        inputs["sli_age_s"] = now_s - sli.observed_at_s
        inputs["sli_requests_in_window"] = sli.requests_in_window
        inputs["ttft_good_ratio"] = sli.ttft_good_ratio
        inputs["itl_good_ratio"] = sli.itl_good_ratio
        inputs["ttft_p99_s"] = sli.ttft_p99_s
        inputs["itl_p99_s"] = sli.itl_p99_s
        inputs["imbalance_cv_max"] = sli.imbalance_cv_max


def record_advice(inputs: dict[str, Scalar], name: str, advice: Advice) -> None:
    inputs[f"{name}.replicas_needed"] = advice.replicas_needed
    inputs[f"{name}.reasons"] = ",".join(advice.reasons)
    if advice.forecast_request_rate_rps is not None:
        inputs[f"{name}.forecast_request_rate_rps"] = advice.forecast_request_rate_rps
    if advice.forecast_request_rate_upper_rps is not None:
        inputs[f"{name}.forecast_request_rate_upper_rps"] = advice.forecast_request_rate_upper_rps
    if advice.forecast_horizon_s is not None:
        inputs[f"{name}.forecast_horizon_s"] = advice.forecast_horizon_s
    for key, value in advice.details.items():
        inputs[f"{name}.{key}"] = value
