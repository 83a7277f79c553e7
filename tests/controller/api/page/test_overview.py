"""The overview page: the numbers of /v1/status, the most urgent first, escaping, filters, empty states."""

from __future__ import annotations

import re
from typing import Any

from controller.policy import Policy
from controller.runtime import PolicyRuntime
from tests.controller.api.page.fakes import alert, burning_runtime

HOSTILE = '<script>alert("x")</script>&'


def _policy(name: str, **extra: Any) -> Policy:
    return Policy.model_validate({"name": name, "target": {"kind": "model", "model": f"m-{name}"}, **extra})


def _cells(html: str, row_policy: str) -> dict[str, str]:
    """data-field -> data-value inside the row of one policy."""
    row = re.search(rf'<tr [^>]*data-policy="{row_policy}".*?</tr>', html, re.S)
    assert row is not None, row_policy
    return {field: value for value, field in re.findall(r'data-value="([^"]*)" data-field="([^"]*)"', row.group(0))}


def test_the_numbers_are_those_of_the_status_api(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(_policy("burning"))
    page.store.create_policy(_policy("calm"))
    page.view.runtimes["burning"] = burning_runtime()
    html = page.client.get("/ui/").text
    status = {p["name"]: p for p in page.client.get("/v1/status").json()["policies"]}
    cells = _cells(html, "burning")
    api = status["burning"]
    assert float(cells["error_budget_remaining.ttft"]) == api["error_budget_remaining"]["ttft"]
    assert float(cells["error_budget_remaining.itl"]) == api["error_budget_remaining"]["itl"]
    assert int(cells["current_replicas"]) == api["current_replicas"] == 2
    assert int(cells["desired_replicas"]) == api["desired_replicas"] == 4
    # Compliance is the window's good ratio the budget was computed from: 1 - (1 - left)(1 - target).
    assert float(cells["compliance.ttft"]) == 1 - (1 - api["error_budget_remaining"]["ttft"]) * (1 - 0.99)
    assert "-73 %" in html and "+46 %" in html
    assert _cells(html, "calm")["current_replicas"] == ""  # no runtime yet: no number at all


def test_the_burning_policy_comes_first_and_says_why(make_page: Any) -> None:
    page = make_page()
    for name in ("aaa", "bbb", "zzz"):
        page.store.create_policy(_policy(name))
    page.view.runtimes["zzz"] = burning_runtime()
    page.view.runtimes["aaa"] = PolicyRuntime(stale=False, observed_at=burning_runtime().observed_at,
                                              error_budget_remaining={"ttft": 0.9, "itl": 0.9},
                                              burn_rates={"ttft": {"1h": 0.1, "5m": 0.1}})
    html = page.client.get("/ui/").text
    order = re.findall(r'data-policy="([^"]+)"', html)
    assert order == ["zzz", "bbb", "aaa"]  # paging, then no data yet, then fine
    assert 'data-level="PAGE"' in html and "TTFT burning 15.2x over 1h and 18.8x over 5m (alert at 14.4x)" in html
    assert re.search(r'data-count="page" data-value="1"', html)
    assert "1 paging · moeslo" in html  # the tab's title says it too
    by_name = page.client.get("/ui/?sort=name").text
    assert re.findall(r'data-policy="([^"]+)"', by_name) == ["aaa", "bbb", "zzz"]
    assert re.findall(r'data-policy="([^"]+)"', page.client.get("/ui/?state=page").text) == ["zzz"]


def test_too_little_traffic_for_the_alert_is_not_paging(make_page: Any) -> None:
    """The generated rules need 0.1 requests/s before they fire: 0.05 burning 50x pages nobody."""
    from dataclasses import replace

    page = make_page()
    page.store.create_policy(_policy("quiet"))
    page.view.runtimes["quiet"] = replace(burning_runtime(), seen={"request_rate_rps": 0.05})
    html = page.client.get("/ui/").text
    assert 'data-level="PAGE"' not in html and "paging · moeslo" not in html
    page.view.runtimes["quiet"] = replace(burning_runtime(), seen={"request_rate_rps": 0.2})
    assert 'data-level="PAGE"' in page.client.get("/ui/").text


def test_user_strings_are_escaped(make_page: Any) -> None:
    page = make_page()
    page.store.create_policy(Policy.model_validate({"name": "evil", "target": {"kind": "model", "model": HOSTILE},
                                                    "description": HOSTILE}))
    runtime = burning_runtime(stale=True)
    runtime.decision = {"action": "hold", "reasons": ["hold", HOSTILE], "detail": HOSTILE}
    page.view.runtimes["evil"] = runtime
    html = page.client.get("/ui/", params={"q": HOSTILE}).text + page.client.get("/ui/").text
    assert "<script>" not in html and "<b>answer</b>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;" in html


def test_no_policy_and_no_match_say_so(make_page: Any) -> None:
    page = make_page()
    assert "No policy yet" in page.client.get("/ui/").text
    page.store.create_policy(_policy("one"))
    assert "No policy matches the filter." in page.client.get("/ui/?q=nothing-like-it").text
    html = page.client.get("/ui/").text
    assert 'data-level="NO_DATA"' in html and "no observation yet" in html


def test_filter_and_pages_stay_usable_with_many_policies(make_page: Any) -> None:
    page = make_page()
    for i in range(120):
        page.store.create_policy(_policy(f"p-{i:03d}"))
    first = page.client.get("/ui/").text
    assert len(re.findall(r"data-policy=", first)) == 50 and "page 1 of 3 (120 policies)" in first
    third = page.client.get("/ui/?page=3").text
    assert len(re.findall(r"data-policy=", third)) == 20
    past = page.client.get("/ui/?page=9").text  # a link kept after policies went: the last page, not "9 of 3"
    assert len(re.findall(r"data-policy=", past)) == 20 and "page 3 of 3 (120 policies)" in past
    found = page.client.get("/ui/?q=P-11").text  # case-insensitive, name or model
    assert re.findall(r'data-policy="([^"]+)"', found) == [f"p-11{i}" for i in range(10)]
    assert page.client.get("/ui/?per_page=0").status_code == 422


def test_the_filter_form_keeps_the_page_size_asked_for(make_page: Any) -> None:
    """Filtering from ?per_page=2 went back to 50 a page."""
    page = make_page()
    for i in range(3):
        page.store.create_policy(_policy(f"p{i}"))
    form = re.search(r"<form.*?</form>", page.client.get("/ui/?per_page=2&sort=name").text, re.S)
    assert form is not None and '<input type="hidden" name="per_page" value="2">' in form.group(0)
    default = re.search(r"<form.*?</form>", page.client.get("/ui/").text, re.S)
    assert default is not None and 'name="per_page"' not in default.group(0)


def test_alerts_come_from_alertmanager_and_its_absence_is_said(make_page: Any) -> None:
    page = make_page(alertmanager=True)
    page.store.create_policy(_policy("burning"))
    page.upstream.alerts = [alert("burning"), alert("burning", severity="ticket"), alert("other")]
    html = page.client.get("/ui/").text
    assert _cells(html, "burning").get("alerts") is None  # plain text cell
    assert re.search(r'data-field="alerts">2<', html)
    page.upstream.alertmanager_down = True
    down = page.client.get("/ui/").text
    assert "Alertmanager unreachable" in down and re.search(r'data-field="alerts">–<', down)


def test_a_password_in_an_outside_url_is_never_shown(make_page: Any) -> None:
    """httpx sends a URL's user:password as basic auth; the banners name the URL without them."""
    page = make_page(prometheus="http://moeslo:s3cr3t@127.0.0.1:9", alertmanager="https://ops:hunter2@am.test:1")
    page.store.create_policy(_policy("a"))
    page.view.runtimes["a"] = burning_runtime()
    page.upstream.prometheus_down = page.upstream.alertmanager_down = True
    for path in ("/ui/", "/ui/policies/a"):
        html = page.client.get(path).text
        assert "Prometheus unreachable" in html and "Alertmanager unreachable" in html
        assert "***@127.0.0.1:9" in html and "***@am.test:1" in html
        assert "s3cr3t" not in html and "hunter2" not in html and "moeslo:" not in html


def test_pages_refresh_themselves_and_load_nothing_from_elsewhere(make_page: Any) -> None:
    page = make_page(tick_interval_s=10.0)
    page.store.create_policy(_policy("one"))
    html = page.client.get("/ui/").text
    assert '<meta http-equiv="refresh" content="10">' in html
    assert '<meta http-equiv="refresh"' not in page.client.get("/ui/?refresh=0").text
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<script" not in html
    response = page.client.get("/", follow_redirects=False)
    assert response.status_code == 307 and response.headers["location"] == "/ui/"
    assert page.client.get("/ui/").headers["server-timing"].startswith("render;dur=")
    assert "/ui/" not in page.client.get("/openapi.json").text


def test_every_link_keeps_the_refresh_asked_for(make_page: Any) -> None:
    """A reader who turned the reloads off (``?refresh=0``) got them back on the next page they opened."""
    page = make_page(tick_interval_s=10.0)
    page.store.create_policy(_policy("one"))
    overview = page.client.get("/ui/?refresh=0&sort=name").text
    links = [h.replace("&amp;", "&") for h in re.findall(r'href="(/ui/[^"]*)"', overview)]
    assert "/ui/policies/one?refresh=0" in links and "/ui/?refresh=0" in links
    assert all("refresh=0" in h for h in links), links
    assert '<input type="hidden" name="refresh" value="0"' in overview  # the filter form's GET too
    policy = page.client.get("/ui/policies/one?refresh=0").text
    assert '<meta http-equiv="refresh"' not in policy
    links = [h.replace("&amp;", "&") for h in re.findall(r'href="(/ui/[^"]*)"', policy)]
    assert "/ui/policies/one?range=1d&refresh=0" in links and "/ui/?refresh=0" in links
    assert all("refresh=0" in h for h in links), links
    plain = page.client.get("/ui/").text  # none asked: the links stay as they were
    assert "refresh=" not in plain
    missing = page.client.get("/ui/policies/gone?refresh=0")  # a policy deleted meanwhile
    assert missing.status_code == 404
    assert re.findall(r'href="(/ui/[^"]*)"', missing.text) == ["/ui/?refresh=0", "/ui/?refresh=0"]


def test_the_clear_link_keeps_the_page_size_and_order(make_page: Any) -> None:
    """Clearing the filter went back to 50 lines by urgency while every other link kept the reader's choice."""
    page = make_page()
    for i in range(3):
        page.store.create_policy(_policy(f"p{i}"))
    html = page.client.get("/ui/?q=p&per_page=2&sort=name").text
    clear = re.search(r'<a href="([^"]*)">clear</a>', html)
    assert clear is not None and clear.group(1).replace("&amp;", "&") == "/ui/?sort=name&per_page=2"
