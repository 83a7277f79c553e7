"""A policy's page: the numbers of /v1/status/{name}, charts from Prometheus or the decision log, escaping."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controller.policy import Policy
from controller.runtime import PolicyRuntime
from controller.store import DecisionRecord
from tests.controller.api.page.fakes import LAYERS, alert, burning_runtime

HOSTILE = '<img src=x onerror="alert(1)">'


def _policy(name: str = "qwen", **extra: Any) -> Policy:
    return Policy.model_validate({"name": name, "target": {"kind": "model", "model": "m"}, **extra})


def _decision(at: datetime, action: str = "hold", *, rate: float = 5.0, replicas: int = 2, desired: int = 2,
              detail: str = "hold at 2", **inputs: Any) -> DecisionRecord:
    return DecisionRecord(
        policy="qwen", policy_version=1, at=at, tick_s=at.timestamp(), action=action,
        reason="forecast" if action != "hold" else "steady", current_replicas=replicas, desired_replicas=desired,
        mode="enforce", outcome="held" if action == "hold" else "applied", detail=detail,
        inputs={"request_rate_rps": rate, "ttft_good_ratio": 0.995, "itl_good_ratio": 0.999,
                "sizing.forecast_request_rate_rps": rate * 1.1, "sizing.forecast_request_rate_upper_rps": rate * 1.3,
                "sizing.predictive.forecast_lower_rps": rate * 0.9, "sizing.forecast_horizon_s": 120,
                "imbalance_cv_max": 0.08, "reasons": [action, "forecast"], **inputs},
    )


def _ticks(n: int = 60, tick_s: float = 15.0) -> list[DecisionRecord]:
    now = datetime.now(UTC)
    out = [_decision(now - timedelta(seconds=(n - k) * tick_s), rate=4.0 + k * 0.1) for k in range(n)]
    out[30] = _decision(out[30].at, "scale_up", replicas=2, desired=3, detail="scale up 2 -> 3: forecast")
    return out


def _series(html: str, chart: str, series: str) -> dict[str, str]:
    svg = re.search(rf'<svg [^>]*data-chart="{chart}".*?</svg>', html, re.S)
    assert svg is not None, chart
    found = re.search(rf'<[a-z]+ [^>]*data-series="{series}"[^>]*>', svg.group(0))
    assert found is not None, series
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', found.group(0)))


def _source(html: str, panel: str) -> str:
    found = re.search(rf'data-panel="{panel}".*?data-source="([^"]*)"', html, re.S)
    assert found is not None, panel
    return found.group(1)


def test_the_numbers_are_those_of_the_status_api(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(_policy())
    page.view.runtimes["qwen"] = burning_runtime()
    html = page.client.get("/ui/policies/qwen").text
    api = page.client.get("/v1/status/qwen").json()
    fields = {f: v for v, f in re.findall(r'data-value="([^"]*)" data-field="([^"]*)"', html)}
    for slo in ("ttft", "itl"):
        assert float(fields[f"error_budget_remaining.{slo}"]) == api["error_budget_remaining"][slo]
        assert float(fields[f"sli.{slo}_good_ratio"]) == api["sli"][f"{slo}_good_ratio"]
    for key in ("request_rate_rps", "wape", "coverage", "sized_request_rate_rps"):
        assert float(fields[f"forecast.{key}"]) == api["forecast"][key]
    assert int(fields["current_replicas"]) == api["current_replicas"]
    firing = dict(re.findall(r'data-pair="([^"]+)" data-firing="(true|false)"', html))
    assert firing["ttft:1h/5m"] == "true" and firing["ttft:6h/30m"] == "false" and firing["itl:1h/5m"] == "false"
    assert 'data-verdict="PAGE"' in html


def test_a_missed_objective_never_reads_as_met(make_page: Any) -> None:
    """0.99986 good against 99.99 % showed "99.99 %" at 2 decimals, and a compliance of 0.999945 against 99.995 %
    showed "99.995 %" at 3, while both budgets were overspent."""
    page = make_page()
    page.store.create_policy(_policy(objectives={"ttft": {"threshold_s": 0.5, "target": 0.9999},
                                                 "itl": {"threshold_s": 0.02, "target": 0.99995}}))
    page.view.runtimes["qwen"] = replace(burning_runtime(), sli={"ttft_good_ratio": 0.99986, "itl_good_ratio": 1.0},
                                         error_budget_remaining={"ttft": -0.4, "itl": -0.1})
    html = page.client.get("/ui/policies/qwen").text
    text = {field: shown for field, shown in re.findall(r'data-field="([^"]*)"[^>]*>([^<]*)<', html)}
    assert text["sli.ttft_good_ratio"] == "99.98 %" and text["sli.itl_good_ratio"] == "100.000 %"
    assert text["compliance.itl"] == "99.994 %" and text["compliance.ttft"] == "99.986 %"
    overview = page.client.get("/ui/").text
    assert re.search(r'data-field="compliance.itl"[^>]*>99.994 %<', overview)


def test_a_policy_without_data_renders_clear_empty_states(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(_policy())
    response = page.client.get("/ui/policies/qwen")
    assert response.status_code == 200
    html = response.text
    assert 'data-verdict="NO_DATA"' in html
    assert "No SLI samples in the last 6h" in html and "No decisions in the last 6h" in html
    assert "No load observed and no forecast made" in html and "No expert rebalance" in html
    assert "No forecast yet: the forecaster is warming up (it needs 240 s of history)" in html and "<svg" not in html


def test_an_observed_policy_with_nothing_served_is_not_ok_and_a_failing_source_says_so(make_page: Any) -> None:
    """An engine up but idle showed a green "ok" over dashes; one that died showed "SLI source ok"."""
    page = make_page()
    page.store.create_policy(_policy())
    page.view.runtimes["qwen"] = PolicyRuntime(stale=False, observed_at=datetime.now(UTC), current_replicas=1)
    html = page.client.get("/ui/policies/qwen").text
    assert 'data-verdict="NO_DATA"' in html and "no requests in the SLI window yet" in html
    assert "good now (5m)" in html  # the controller's SLI window (300 s by default)
    short = make_page(sli_window_s=30)
    short.store.create_policy(_policy())
    assert "good now (30s)" in short.client.get("/ui/policies/qwen").text  # it said "5 min" whatever the window
    page.view.runtimes["qwen"] = replace(burning_runtime(), errors=["scrape http://127.0.0.1:9: ConnectError"])
    html = page.client.get("/ui/policies/qwen").text
    assert re.search(r"SLI source</dt><dd><span>failing, observed", html), html
    assert "ConnectError" in html


def test_charts_from_the_decision_log_match_it(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(_policy())
    page.store.append_decisions(_ticks())
    html = page.client.get("/ui/policies/qwen").text
    newest = page.client.get("/v1/decisions", params={"policy": "qwen", "limit": 1}).json()["items"][0]
    load = _series(html, "load", "actual")
    assert float(load["last-v"]) == newest["inputs"]["request_rate_rps"] and load["n"] == "60"
    assert float(load["last-t"]) == pytest.approx(datetime.fromisoformat(newest["at"]).timestamp(), abs=1e-3)
    forecast = _series(html, "load", "forecast")
    # The band's upper edge is the rate sized for, not the interval's (the legend said "forecast interval").
    assert "forecast: the interval's lower bound up to the rate sized for" in html
    assert float(forecast["last-v"]) == pytest.approx(newest["inputs"]["sizing.forecast_request_rate_rps"])
    assert float(forecast["last-t"]) == pytest.approx(float(load["last-t"]) + 120, abs=1e-3)  # drawn at its horizon
    assert float(_series(html, "replicas", "current")["last-v"]) == newest["current_replicas"]
    assert float(_series(html, "good_ratio", "ttft")["last-v"]) == newest["inputs"]["ttft_good_ratio"]
    assert "decision log" in _source(html, "good_ratio") and "decision log" in _source(html, "replicas")
    replicas = re.search(r'<svg [^>]*data-chart="replicas".*?</svg>', html, re.S)
    assert replicas is not None and replicas.group(0).count('class="marker"') == 2  # the scale-up; policy v1
    assert "scale up 2 -&gt; 3: forecast" in html


def test_decision_details_and_descriptions_are_escaped(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(_policy(description=HOSTILE))
    now = datetime.now(UTC)
    page.store.append_decisions([_decision(now, "scale_up", detail=HOSTILE, reasons=["scale_up", HOSTILE])])
    html = page.client.get("/ui/policies/qwen").text
    assert "<img" not in html
    assert html.count("&lt;img src=x onerror=") >= 4  # description, the marker's tooltip, reasons, detail


def test_prometheus_draws_good_ratios_load_and_the_layer_heatmap(make_page: Any) -> None:
    page = make_page(prometheus=True)
    page.store.create_policy(_policy())
    page.store.append_decisions(_ticks())
    html = page.client.get("/ui/policies/qwen").text
    assert float(_series(html, "good_ratio", "ttft")["last-v"]) == pytest.approx(page.upstream.ttft_good)
    assert float(_series(html, "good_ratio", "itl")["last-v"]) == pytest.approx(page.upstream.itl_good)
    assert float(_series(html, "load", "actual")["last-v"]) == page.upstream.load_rps
    assert _source(html, "good_ratio").startswith("Prometheus") and _source(html, "load").startswith("actual: Prom")
    assert re.search(rf'data-chart="imbalance" data-rows="{LAYERS}"', html)
    assert any('model_name="m"' in q for q in page.upstream.queries)


def test_the_charts_say_and_ask_for_the_controllers_windows(make_page: Any) -> None:
    """``moeslo up``'s controller acts on 30 s SLIs and 10 s rates: the charts said and asked for 5 m and 1 m."""
    page = make_page(prometheus=True, rate_window_s=10, sli_window_s=30, tick_interval_s=2)
    page.store.create_policy(_policy())
    page.store.append_decisions(_ticks(tick_s=2.0))
    page.upstream.since_s = time.time() - 120.0  # two minutes of series: asked again at 2 s steps
    html = page.client.get("/ui/policies/qwen").text
    assert "TTFT and ITL good ratio (30s)" in html and "good/total over 30s, at the threshold)" in html
    assert "Request rate (req/s over 10s)" in html and "one step" not in html
    ranged = [q for q in page.upstream.queries if "request_success" in q or "_bucket" in q]
    assert {q for q in ranged if "[10s]" in q or "[30s]" in q} and all("[5m]" not in q for q in ranged)


def test_a_range_whose_step_is_longer_than_the_windows_names_the_window_it_asked_for(make_page: Any) -> None:
    """3 d at 18-minute steps asked for 5-minute increases and 1-minute rates: 13 minutes of every 18 unseen."""
    page = make_page(prometheus=True)
    page.store.create_policy(_policy())
    page.store.append_decisions(_ticks())
    html = page.client.get("/ui/policies/qwen?range=3d").text
    assert "TTFT and ITL good ratio (18m)" in html and "good/total over 18m" in html
    assert "Request rate (req/s over 18m)" in html and "not the controller's 5m" in html
    ranged = [q for q in page.upstream.queries if "request_success" in q or "_bucket" in q]
    assert ranged and all("[18m]" in q for q in ranged)


def test_prometheus_down_falls_back_to_the_log_and_says_so(make_page: Any) -> None:
    page = make_page(prometheus=True)
    page.store.create_policy(_policy())
    page.store.append_decisions(_ticks())
    page.upstream.prometheus_down = True
    response = page.client.get("/ui/policies/qwen")
    assert response.status_code == 200
    html = response.text
    assert 'data-banner="prometheus"' in html and "Prometheus unreachable" in html
    assert _source(html, "good_ratio").startswith("decision log")
    assert "The per-layer heatmap needs Prometheus" in html


def test_servers_that_trickle_their_answers_hold_a_page_3_s_not_their_whole_answer(make_page: Any) -> None:
    """The client's timeout is per read: one byte a second held the page for as long as the server went on."""
    page = make_page(prometheus=True, alertmanager=True)
    page.store.create_policy(_policy())
    page.store.append_decisions(_ticks())
    page.upstream.trickle = True
    for path in ("/ui/policies/qwen", "/ui/"):
        started = time.monotonic()
        response = page.client.get(path)
        assert response.status_code == 200 and time.monotonic() - started < 10
        assert "no whole answer within 3 s" in response.text, path


def test_a_slow_prometheus_keeps_the_first_answer_when_the_finer_one_misses_the_deadline(make_page: Any) -> None:
    """1.7 s a query and a series that began half an hour ago: the second, finer query ran past the page's 3 s,
    and the page said Prometheus was unreachable, throwing the first answer away."""
    page = make_page(prometheus=True)
    page.store.create_policy(_policy())
    page.store.append_decisions(_ticks())
    page.upstream.since_s, page.upstream.delay_s = time.time() - 1800.0, 1.7
    html = page.client.get("/ui/policies/qwen").text
    assert "Prometheus unreachable" not in html and 'data-banner="prometheus"' not in html
    assert _source(html, "good_ratio").startswith("Prometheus") and _source(html, "load").startswith("actual: Prom")
    assert float(_series(html, "load", "actual")["last-v"]) == page.upstream.load_rps


def test_alerts_firing_for_this_policy(make_page: Any) -> None:
    page = make_page(alertmanager=True)
    page.store.create_policy(_policy())
    page.upstream.alerts = [alert("qwen", summary="TTFT <b>budget</b> burning"), alert("other")]
    html = page.client.get("/ui/policies/qwen").text
    assert 'data-alerts="1"' in html and "TTFT &lt;b&gt;budget&lt;/b&gt; burning" in html
    page.upstream.alertmanager_down = True
    assert "Alertmanager unreachable" in page.client.get("/ui/policies/qwen").text


def test_an_alertmanager_answer_of_the_wrong_shape_is_a_banner(make_page: Any) -> None:
    """Labels as a list and annotations as text made both pages a 500 problem document."""
    page = make_page(alertmanager=True)
    page.store.create_policy(_policy())
    page.upstream.alerts = [{"labels": [["alertname", "X"]], "annotations": "text"}]
    for path in ("/ui/policies/qwen", "/ui/"):
        response = page.client.get(path)
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/html"), path
        assert 'data-banner="alertmanager"' in response.text and "malformed answer" in response.text, path


def test_rebalances_show_predicted_measured_and_the_noise_floor(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(_policy())
    now = datetime.now(UTC)
    plan = {"imbalance_before_cv": 0.31, "imbalance_after_cv": 0.07, "moves": 9}
    verify = {"ok": True, "reason": "verified", "measured_cv": 0.09, "predicted_cv": 0.07, "noise_cv": 0.02}
    page.store.append_decisions([
        DecisionRecord(policy="qwen", policy_version=1, at=now - timedelta(minutes=3), tick_s=1.0,
                       action="rebalance", reason="imbalance_sustained", current_replicas=None,
                       desired_replicas=None, mode="enforce", outcome="applied", detail="predicted",
                       inputs={"kind": "rebalance", "plan": plan}),
        DecisionRecord(policy="qwen", policy_version=1, at=now - timedelta(minutes=2), tick_s=2.0,
                       action="verify_rebalance", reason="verified", current_replicas=None, desired_replicas=None,
                       mode="enforce", outcome="verified", detail="measured", inputs={"kind": "verify",
                                                                                       "plan": plan,
                                                                                       "verify": verify}),
    ])
    html = page.client.get("/ui/policies/qwen").text
    assert float(_series(html, "rebalances", "predicted")["last-v"]) == 0.07
    assert float(_series(html, "rebalances", "measured")["last-v"]) == 0.09
    assert float(_series(html, "rebalances", "noise")["last-v"]) == 0.02
    assert "No decisions in the last 6h" in html  # rebalances are no scaling decisions


def test_rebalances_show_the_held_out_prediction_the_verification_judges(make_page: Any) -> None:
    # A plan over several windows is judged on a window it was not planned from (0.12), not on the
    # windows it was planned from (0.04): the chart shows what the verification compares with.
    page = make_page()
    page.store.create_policy(_policy())
    now = datetime.now(UTC)
    plan = {"imbalance_before_cv": 0.31, "imbalance_after_cv": 0.04, "moves": 9, "windows": 4,
            "held_out": {"worst_cv_before": 0.29, "worst_cv_after": 0.12}}
    verify = {"ok": True, "reason": "verified", "measured_cv": 0.13, "predicted_cv": 0.12, "noise_cv": 0.02}
    page.store.append_decisions([
        DecisionRecord(policy="qwen", policy_version=1, at=now - timedelta(minutes=3), tick_s=1.0,
                       action="rebalance", reason="imbalance_sustained", current_replicas=None,
                       desired_replicas=None, mode="enforce", outcome="applied", detail="predicted",
                       inputs={"kind": "rebalance", "plan": plan}),
        DecisionRecord(policy="qwen", policy_version=1, at=now - timedelta(minutes=2), tick_s=2.0,
                       action="verify_rebalance", reason="verified", current_replicas=None, desired_replicas=None,
                       mode="enforce", outcome="verified", detail="measured",
                       inputs={"kind": "verify", "plan": plan, "verify": verify}),
    ])
    html = page.client.get("/ui/policies/qwen").text
    assert float(_series(html, "rebalances", "predicted")["last-v"]) == verify["predicted_cv"] == 0.12
    assert float(_series(html, "rebalances", "measured")["last-v"]) == 0.13


def test_unknown_policy_and_ranges(make_page: Any) -> None:
    page = make_page()
    missing = page.client.get("/ui/policies/%3Cb%3Eghost")
    assert missing.status_code == 404 and "&lt;b&gt;ghost" in missing.text and "<b>ghost" not in missing.text
    page.store.create_policy(_policy())
    assert page.client.get("/ui/policies/qwen?range=1d").status_code == 200
    bad = page.client.get("/ui/policies/qwen?range=2y&refresh=-1")
    assert bad.status_code == 422 and bad.headers["content-type"].startswith("text/html")  # a page, not JSON
    assert "<code>query.range</code>" in bad.text and 'href="/ui/"' in bad.text
    api = page.client.get("/v1/decisions?limit=-5")  # the API's own stay problem documents
    assert api.status_code == 422 and api.headers["content-type"].startswith("application/problem+json")
    stale = page.client.get("/ui/?state=stale")  # the page's own word for the state it filters as "blind"
    assert stale.status_code == 200



@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/ui/nope", 404), ("GET", "/ui/policies/a/b", 404),
                                                        ("GET", "/ui/policies/", 404), ("POST", "/ui/", 405),
                                                        ("DELETE", "/ui/policies/qwen", 405)])
def test_an_unknown_ui_path_or_method_is_a_page(make_page: Any, method: str, path: str, status: int) -> None:
    """Routing's own 404 and 405 came back as problem documents; a person in a browser gets a page."""
    page = make_page()
    page.store.create_policy(_policy())
    answer = page.client.request(method, path)
    assert answer.status_code == status and answer.headers["content-type"].startswith("text/html")
    assert 'href="/ui/"' in answer.text
    if status == 405:
        assert answer.headers["allow"] == "GET, HEAD"
    api = page.client.get("/v1/nope")
    assert api.status_code == 404 and api.headers["content-type"].startswith("application/problem+json")

def test_a_ttft_objective_with_an_allowance_is_charted_from_its_own_series() -> None:
    """The chart read raw TTFT for every policy: a long-prompt objective met in full drew at 50 %."""
    from controller.api.page.prom import ChartWindows, _queries

    windows = ChartWindows(rate_window_s=60, sli_window_s=300, tick_interval_s=15)
    flat = Policy.model_validate({"name": "flat", "target": {"kind": "model", "model": "m"}})
    assert "vllm:time_to_first_token_seconds_bucket{" in _queries(flat, "", windows)["ttft:good"]
    ttft = {"threshold_s": 0.5, "target": 0.99, "reference_prompt_tokens": 1000, "per_1k_prompt_tokens_s": 0.05}
    long = Policy.model_validate({"name": "long", "target": {"kind": "model", "model": "m"},
                                  "objectives": {"ttft": ttft}})  # fmt: skip
    queries = _queries(long, 'job="x"', windows)
    for key in ("ttft:good", "ttft:total"):
        assert "moeslo_ttft_normalized_seconds_" in queries[key] and "vllm:time_to_first" not in queries[key]
        assert 'reference_prompt_tokens="1000"' in queries[key] and 'job="x"' in queries[key]
    assert "vllm:inter_token_latency_seconds_bucket" in queries["itl:good"]


def test_a_capped_decision_list_says_how_many_it_shows_and_where_the_rest_are(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(_policy())
    now = datetime.now(UTC)
    page.store.append_decisions([_decision(now - timedelta(seconds=10 * k), "scale_up", replicas=2, desired=3)
                                 for k in range(70)])  # fmt: skip
    html = page.client.get("/ui/policies/qwen").text
    assert html.count("data-decision=") == 50
    assert "The newest 50 of 70 decisions" in html and "/v1/decisions?policy=qwen" in html
    few = make_page()
    few.store.create_policy(_policy())
    few.store.append_decisions([_decision(now, "scale_up", replicas=2, desired=3)])
    assert "The newest" not in few.client.get("/ui/policies/qwen").text


def test_a_decision_the_actuator_could_not_carry_out_is_shown_failed_with_its_answer(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(_policy())
    refused = "deployment prod/qwen: scale to 4 failed: HTTP 403 Forbidden: cannot update deployments/scale"
    page.view.runtimes["qwen"] = replace(burning_runtime(), decision={
        "action": "scale_up", "reasons": ["scale_up", "forecast"], "detail": "scale up 2 -> 4",
        "outcome": "failed", "actuation": refused})
    html = page.client.get("/ui/policies/qwen").text
    assert re.search(r'data-field="actuation"><span class="badge page">failed</span> ' + re.escape(refused), html)
    assert page.client.get("/v1/status/qwen").json()["decision"]["outcome"] == "failed"
    overview = page.client.get("/ui/").text
    assert 'class="badge page" title="' + refused in overview



@pytest.mark.parametrize(("outcome", "actuation"), [("standby", "not the leader: another replica acts"),
                                                    ("advisory", ""), ("interrupted", "cut short at shutdown")])
def test_a_decision_not_carried_out_is_shown_with_its_outcome(make_page: Any, outcome: str, actuation: str) -> None:
    """A scale_up a standby only logged read like one applied: the outcome stands next to the action."""
    page = make_page()
    page.store.create_policy(_policy(mode="enforce"))
    page.view.runtimes["qwen"] = replace(burning_runtime(), decision={
        "action": "scale_up", "reasons": ["scale_up", "slo_burn"], "detail": "scale up 2 -> 4",
        "outcome": outcome, "actuation": actuation})
    html = page.client.get("/ui/policies/qwen").text
    said = f" {re.escape(actuation)}" if actuation else ""
    assert re.search(rf'data-field="actuation"><span class="badge off">{outcome}</span>{said}<', html)
    title = f' title="{re.escape(actuation)}"' if actuation else ""
    assert re.search(rf'<b>scale_up</b><span class="badge off"{title}> {outcome}</span>', page.client.get("/ui/").text)


def test_a_standby_controllers_policy_page_says_another_controller_acts(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(_policy(mode="enforce"))
    page.view.runtimes["qwen"] = burning_runtime()
    assert 'data-banner="standby"' not in page.client.get("/ui/policies/qwen").text
    page.view.leader = False
    html = page.client.get("/ui/policies/qwen").text
    assert re.search(r'data-banner="standby"><b>standby: </b>another controller acts', html)
    assert page.client.get("/v1/status").json()["mode"] == "standby"

def test_the_history_shows_the_last_ten_versions_read_as_such(make_page: Any) -> None:
    """The page read every version (each with its whole spec) to show the last 10."""
    page = make_page()
    page.store.create_policy(_policy())
    for replicas in range(2, 16):
        page.store.replace_policy(_policy(scaling={"max_replicas": replicas}))
    asked: list[dict[str, Any]] = []
    real = page.store.policy_history

    def recording(name: str, **kwargs: Any) -> Any:
        asked.append(kwargs)
        return real(name, **kwargs)

    page.store.policy_history = recording
    html = page.client.get("/ui/policies/qwen").text
    assert re.findall(r"<li>v(\d+) (?:create|update) at", html) == [str(v) for v in range(15, 5, -1)]
    assert asked == [{"limit": 10, "newest_first": True}]
