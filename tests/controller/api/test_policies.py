"""REST contract of /v1/policies: status codes, ETags, validation messages, auth, merge patch, OpenSLO."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from contracts import errors
from controller.api import STATUS_BY_ERROR, status_for
from controller.errors import ActuationError
from controller.policy import Policy
from controller.store import StaleVersionError
from tests.controller.api.conftest import AUTH, make_client

POLICY = {"name": "qwen", "target": {"kind": "deployment", "namespace": "prod", "name": "qwen-moe"}}


def _create(client: TestClient, body: dict[str, Any] | None = None) -> Any:
    response = client.post("/v1/policies", json=body or POLICY, headers=AUTH)
    assert response.status_code == 201, response.text
    return response


def test_create_get_list_with_etag_and_defaults(client: TestClient) -> None:
    created = _create(client)
    assert created.headers["etag"] == '"1"'
    assert created.headers["location"] == "/v1/policies/qwen"
    body = created.json()
    assert body["version"] == 1
    assert body["policy"]["objectives"]["ttft"] == {
        "threshold_s": 0.5, "target": 0.99, "reference_prompt_tokens": 1000, "per_1k_prompt_tokens_s": 0.0,
    }
    assert body["policy"]["scaling"]["scale_down_cooldown_s"] == 180 and body["policy"]["lead_time_s"] == 120
    got = client.get("/v1/policies/qwen")
    assert got.status_code == 200 and got.headers["etag"] == '"1"'
    assert [item["name"] for item in client.get("/v1/policies").json()["items"]] == ["qwen"]
    again = client.post("/v1/policies", json=POLICY, headers=AUTH)
    assert again.status_code == 409 and "already exists" in again.json()["detail"]


@pytest.mark.parametrize(
    ("patch", "field", "message"),
    [
        ({"scaling": {"min_replicas": -1}}, "scaling.min_replicas", "greater than or equal to 0"),
        (
            {"scaling": {"min_replicas": 5, "max_replicas": 2}},
            "scaling",
            "max_replicas (2) must be >= min_replicas (5)",
        ),
        ({"objectives": {"ttft": {"threshold_s": 0.5, "target": 1.5}}}, "objectives.ttft.target", "less than 1"),
        ({"objectives": {"itl": {"threshold_s": 0.02, "target": 0}}}, "objectives.itl.target", "greater than 0"),
        (
            {"objectives": {"ttft": {"threshold_s": 0.5, "target": 0.99, "per_1k_prompt_tokens_s": -0.1}}},
            "objectives.ttft.per_1k_prompt_tokens_s",
            "greater than or equal to 0",
        ),
        (
            {"objectives": {"ttft": {"threshold_s": 0.5, "target": 0.99, "per_1k_prompt_tokens_s": "fast"}}},
            "objectives.ttft.per_1k_prompt_tokens_s",
            "valid number",
        ),
        (
            {"objectives": {"ttft": {"threshold_s": 0.5, "target": 0.99, "reference_prompt_tokens": 1.5}}},
            "objectives.ttft.reference_prompt_tokens",
            "valid integer",
        ),
        (
            {"objectives": {"itl": {"threshold_s": 0.02, "target": 0.99, "per_1k_prompt_tokens_s": 0.1}}},
            "objectives.itl.per_1k_prompt_tokens_s",
            "Extra inputs are not permitted",
        ),
        (
            # The normalized histogram has no 0.32 edge: the SLI would interpolate inside 0.3..0.35 while the
            # definition, the alerts and the replay judge each request exactly.
            {"objectives": {"ttft": {"threshold_s": 0.32, "target": 0.99, "per_1k_prompt_tokens_s": 0.05}}},
            "objectives.ttft.threshold_s",
            "0.32 is not a bucket edge of moeslo_ttft_normalized_seconds; the nearest edges are 0.3 and 0.35",
        ),
        ({"target": {"kind": "statefulset", "name": "x"}}, "target", "does not match any of the expected tags"),
        ({"surprise": 1}, "surprise", "Extra inputs are not permitted"),
        ({"scaling": {"max_replicas": "many"}}, "scaling.max_replicas", "valid integer"),
        ({"window": "30x"}, "window", "must be a number followed by one of s, m, h, d, w"),
        # Windows the alert generator has no burn-rate rule for (moeslo alerts generate refuses them too).
        ({"window": "1h"}, "window", "window '1h' must be between 50h and 366d"),
        ({"window": "49h"}, "window", "window '49h' must be between 50h and 366d"),
        ({"window": "367d"}, "window", "window '367d' must be between 50h and 366d"),
        (
            {"objectives": {"ttft": {"threshold_s": 0.5, "target": 0.9}}},
            "window",
            "a 30d window is too long for objectives.ttft.target 0.9: its 1h/5m page alert needs a burn rate of 14.4, "
            "and with target 0.9 the most it can reach is 10 (every event bad); use a window of at most 500h or a "
            "target of at least 0.930556",
        ),
        ({"lead_time_s": -5}, "lead_time_s", "greater than or equal to 0"),
        ({"name": "Not_A_Name"}, "name", "should match pattern"),
    ],
)
def test_bad_policies_get_422_naming_the_field(
    client: TestClient, patch: dict[str, Any], field: str, message: str
) -> None:
    response = client.post("/v1/policies", json={**POLICY, **patch}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problems = response.json()["errors"]
    assert any(p["field"] == field and message in p["message"] for p in problems), problems


@pytest.mark.parametrize(
    ("field", "fragment"),
    [
        ("objectives.ttft.threshold_s", '"objectives": {"ttft": {"threshold_s": NaN, "target": 0.99}}'),
        ("objectives.itl.target", '"objectives": {"itl": {"threshold_s": 0.02, "target": NaN}}'),
        ("objectives.imbalance.max_cv", '"objectives": {"imbalance": {"max_cv": NaN}}'),
        ("forecast.quantile", '"forecast": {"quantile": NaN}'),
        ("forecast.max_wape", '"forecast": {"max_wape": Infinity}'),
        ("forecast.min_coverage", '"forecast": {"min_coverage": -Infinity}'),
    ],
)
def test_a_nan_or_infinite_number_is_refused_as_such(client: TestClient, field: str, fragment: str) -> None:
    """Python's JSON reads ``NaN``: it was refused as "Input should be less than or equal to 3600", which NaN
    is not the trouble with."""
    raw = '{"name": "p", "target": {"kind": "model", "model": "m"}, ' + fragment + "}"
    response = client.post("/v1/policies", content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["errors"] == [{"field": field, "message": "Input should be a finite number"}]


def test_the_windows_and_targets_a_refusal_suggests_are_accepted(client: TestClient) -> None:
    assert _create(client, {**POLICY, "window": "50h"}).json()["policy"]["window"] == "50h"
    loose = {"ttft": {"threshold_s": 0.5, "target": 0.9}}
    loose_target, tight_target = ({**POLICY["target"], "model": name} for name in ("loose", "tight"))  # one a model
    loose_policy = {**POLICY, "name": "loose", "target": loose_target, "objectives": loose, "window": "500h"}
    assert _create(client, loose_policy).status_code == 201
    tight = {"ttft": {"threshold_s": 0.5, "target": 0.930556}}
    tight_policy = {**POLICY, "name": "tight", "target": tight_target, "objectives": tight}
    assert _create(client, tight_policy).status_code == 201  # the 30d default
    # A merge patch is judged as a whole policy: a window too short, or a target too loose for it, is refused.
    merge = {**AUTH, "Content-Type": "application/merge-patch+json"}
    short = client.patch("/v1/policies/qwen", json={"window": "24h"}, headers=merge)
    assert short.status_code == 422, short.text
    assert short.json()["errors"][0]["field"] == "window" and "between 50h and 366d" in short.text
    longer = client.patch("/v1/policies/loose", json={"window": "30d"}, headers=merge)
    assert longer.status_code == 422 and "use a window of at most 500h" in longer.json()["errors"][0]["message"]
    assert client.get("/v1/policies/loose").json()["policy"]["window"] == "500h"


def test_a_policy_stored_under_the_older_window_rule_still_loads_and_a_change_must_pass(tmp_path: Path) -> None:
    # Windows from 1h were taken before the 50h rule: such a stored policy keeps loading (the controller keeps
    # running it), and any change to it is judged by today's rule.
    with make_client(tmp_path) as client:
        _create(client)
    db = sqlite3.connect(tmp_path / "c.db")
    with db:  # as the older controller wrote it
        db.execute("UPDATE policies SET spec = json_set(spec, '$.window', '24h')")
    db.close()
    with make_client(tmp_path) as client:
        assert client.get("/v1/policies/qwen").json()["policy"]["window"] == "24h"
        assert [item["policy"]["window"] for item in client.get("/v1/policies").json()["items"]] == ["24h"]
        merge = {**AUTH, "Content-Type": "application/merge-patch+json"}
        changed = client.patch("/v1/policies/qwen", json={"scaling": {"max_replicas": 4}}, headers=merge)
        assert changed.status_code == 422 and changed.json()["errors"][0]["field"] == "window"
        fixed = client.patch("/v1/policies/qwen", json={"scaling": {"max_replicas": 4}, "window": "7d"}, headers=merge)
        assert fixed.status_code == 200 and fixed.json()["policy"]["window"] == "7d"


def test_every_failure_is_reported_at_once(client: TestClient) -> None:
    body = {**POLICY, "scaling": {"min_replicas": -1, "max_step": 0}, "extra": True}
    fields = {p["field"] for p in client.post("/v1/policies", json=body, headers=AUTH).json()["errors"]}
    assert fields == {"scaling.min_replicas", "scaling.max_step", "extra"}


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b'"text"'])
def test_malformed_or_non_object_bodies_are_4xx(client: TestClient, raw: bytes) -> None:
    response = client.post("/v1/policies", content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"]


def test_a_patch_nested_too_deeply_is_422(client: TestClient) -> None:
    client.post("/v1/policies", json=POLICY, headers=AUTH)
    deep = b"[" * 100_000 + b"]" * 100_000
    response = client.patch(f"/v1/policies/{POLICY['name']}", content=deep,
                            headers={**AUTH, "Content-Type": "application/merge-patch+json"})  # fmt: skip
    assert response.status_code == 422 and "nested too deeply" in response.json()["detail"]


@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/policies"), ("PUT", "/v1/policies/qwen")])
@pytest.mark.parametrize(
    ("raw", "why"),
    [(b'{"name": "qwen", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}", "body: JSON nested too deeply"),
     (b'{"name": "qwen", "x": ' + b'{"a": ' * 2000 + b"1" + b"}" * 2001, "body: JSON nested too deeply"),
     (b'{"name": "q\xffwen"}', "body: not UTF-8 text at byte 11")],
)  # fmt: skip
def test_a_body_that_decodes_to_nothing_is_422_naming_the_body(
    client: TestClient, method: str, path: str, raw: bytes, why: str
) -> None:
    """It was a bare 400 with no errors (FastAPI's "There was an error parsing the body"), while PATCH said why."""
    response = client.request(method, path, content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 422 and response.headers["content-type"] == "application/problem+json"
    assert response.json()["detail"] == why
    assert response.json()["errors"] == [{"field": "body", "message": why.removeprefix("body: ")}]


def test_a_body_that_decodes_to_nothing_without_the_token_is_401(client: TestClient) -> None:
    deep = b"[" * 2000 + b"]" * 2000
    response = client.post("/v1/policies", content=deep, headers={"Content-Type": "application/json"})
    assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")


def test_writes_need_the_bearer_token_reads_do_not(client: TestClient) -> None:
    missing = client.post("/v1/policies", json=POLICY)
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    wrong = client.post("/v1/policies", json=POLICY, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    _create(client)
    assert client.delete("/v1/policies/qwen").status_code == 401
    assert client.patch("/v1/policies/qwen", json={"mode": "off"}).status_code == 401
    assert client.get("/v1/policies/qwen").status_code == 200


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'{"name": 1}'])
def test_a_write_without_the_token_is_401_whatever_its_body(client: TestClient, raw: bytes) -> None:
    """The token is checked before the body is judged: a stranger learns nothing of what a route reads."""
    for method, path in (("POST", "/v1/policies"), ("PUT", "/v1/policies/qwen"), ("PATCH", "/v1/policies/qwen")):
        response = client.request(method, path, content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == 401, (method, raw, response.text)
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_put_creates_replaces_and_honours_if_match(client: TestClient) -> None:
    first = client.put("/v1/policies/qwen", json=POLICY, headers=AUTH)
    assert first.status_code == 201 and first.headers["etag"] == '"1"'
    changed = {**POLICY, "mode": "advisory"}
    second = client.put("/v1/policies/qwen", json=changed, headers={**AUTH, "If-Match": '"1"'})
    assert second.status_code == 200 and second.headers["etag"] == '"2"'
    stale = client.put("/v1/policies/qwen", json=POLICY, headers={**AUTH, "If-Match": '"1"'})
    assert stale.status_code == 412 and "is at version 2, not version 1" in stale.json()["detail"]
    star = client.put("/v1/policies/qwen", json=POLICY, headers={**AUTH, "If-Match": "*"})
    assert star.status_code == 200
    bad_tag = client.put("/v1/policies/qwen", json=POLICY, headers={**AUTH, "If-Match": "version-3"})
    assert bad_tag.status_code == 422 and "'version-3' is not an ETag of this API" in bad_tag.json()["detail"]
    # The API's own words, not a pattern dump.
    for value, says in (('"2", "3"', "exactly one ETag"), ('"2"x', "is not an ETag of this API")):
        refused = client.put("/v1/policies/qwen", json=POLICY, headers={**AUTH, "If-Match": value})
        assert refused.status_code == 422 and says in refused.json()["detail"], refused.text
    # Entity tags this API never issued match no version under If-Match's strong comparison: 412, not 422.
    for value, says in (('W/"3"', "a weak ETag never matches"), ('"99999999999999999999"', "names no version"),
                        ('"abc"', "names no version")):  # fmt: skip
        refused = client.put("/v1/policies/qwen", json=POLICY, headers={**AUTH, "If-Match": value})
        assert refused.status_code == 412 and says in refused.json()["detail"], refused.text
    renamed = client.put("/v1/policies/other", json=POLICY, headers=AUTH)
    assert renamed.status_code == 422 and renamed.json()["errors"][0]["field"] == "name"
    absent_star = client.put("/v1/policies/ghost", json={**POLICY, "name": "ghost"}, headers={**AUTH, "If-Match": "*"})
    assert absent_star.status_code == 412
    assert "'ghost' does not exist: If-Match: * needs a current version" in absent_star.json()["detail"]


def test_require_if_match_gives_428(tmp_path: Path) -> None:
    with make_client(tmp_path, require_if_match=True) as client:
        _create(client)
        assert client.put("/v1/policies/qwen", json=POLICY, headers=AUTH).status_code == 428
        assert client.patch("/v1/policies/qwen", json={"mode": "off"}, headers=AUTH).status_code == 428
        assert client.delete("/v1/policies/qwen", headers=AUTH).status_code == 428
        # An OpenSLO import may not change it either; it may create new policies.
        exported = client.get("/v1/policies/qwen/openslo").text
        assert client.post("/v1/openslo", content=exported, headers=AUTH).status_code == 428
        assert client.get("/v1/policies/qwen").json()["version"] == 1
        new = exported.replace("moeslo.io/policy: qwen", "moeslo.io/policy: new").replace("qwen-moe", "new-moe")
        assert client.post("/v1/openslo", content=new, headers=AUTH).status_code == 200  # its own model
        assert client.delete("/v1/policies/qwen", headers={**AUTH, "If-Match": '"1"'}).status_code == 204
        # What does not exist is a 404, with If-Match or without.
        assert client.patch("/v1/policies/qwen", json={"mode": "off"}, headers=AUTH).status_code == 404
        assert client.delete("/v1/policies/qwen", headers=AUTH).status_code == 404
        assert client.put("/v1/policies/qwen", json=POLICY, headers=AUTH).status_code == 201  # creation needs none


def test_under_require_if_match_a_put_without_it_only_creates_in_its_own_transaction(tmp_path: Path) -> None:
    """The PUT looked for the policy before its write, which then created or replaced: another writer's
    create in between was replaced without a word (a lost write)."""
    with make_client(tmp_path, require_if_match=True) as client:
        store = client.app.state.store  # type: ignore[attr-defined]
        real = store._retrying

        def another_writer_first(write: Any) -> Any:  # another PUT creates it just before this one writes
            store._retrying = real
            store.create_policy(Policy.model_validate({**POLICY, "description": "the other writer's"}))
            return real(write)

        store._retrying = another_writer_first
        refused = client.put("/v1/policies/qwen", json={**POLICY, "description": "mine"}, headers=AUTH)
        assert refused.status_code == 428, refused.text
        assert "requires If-Match" in refused.json()["detail"]
        stored = client.get("/v1/policies/qwen").json()
        assert (stored["version"], stored["policy"]["description"]) == (1, "the other writer's")


def test_merge_patch(client: TestClient) -> None:
    _create(client, {**POLICY, "description": "prod fleet"})
    headers = {**AUTH, "Content-Type": "application/merge-patch+json", "If-Match": '"1"'}
    patched = client.patch("/v1/policies/qwen", content=b'{"scaling": {"max_replicas": 3}, "description": null}',
                           headers=headers)
    assert patched.status_code == 200, patched.text
    policy = patched.json()["policy"]
    assert policy["scaling"]["max_replicas"] == 3 and policy["scaling"]["min_replicas"] == 1
    assert policy["description"] == ""  # null removes the field: back to its default
    stale = client.patch("/v1/policies/qwen", json={"mode": "off"}, headers={**AUTH, "If-Match": '"1"'})
    assert stale.status_code == 412
    invalid = client.patch("/v1/policies/qwen", json={"scaling": {"min_replicas": 9}}, headers=AUTH)
    assert invalid.status_code == 422 and invalid.json()["errors"][0]["field"] == "scaling"
    rename = client.patch("/v1/policies/qwen", json={"name": "other"}, headers=AUTH)
    assert rename.status_code == 422
    text = client.patch("/v1/policies/qwen", content=b"mode=off", headers={**AUTH, "Content-Type": "text/plain"})
    assert text.status_code == 415 and "Content-Type" in text.json()["detail"]
    assert client.patch("/v1/policies/ghost", json={"mode": "off"}, headers=AUTH).status_code == 404


def test_delete_and_history(client: TestClient) -> None:
    _create(client)
    assert client.delete("/v1/policies/qwen", headers={**AUTH, "If-Match": '"7"'}).status_code == 412
    assert client.delete("/v1/policies/qwen", headers=AUTH).status_code == 204
    missing = client.get("/v1/policies/qwen")
    assert missing.status_code == 404 and missing.json()["detail"] == "policy 'qwen' not found"
    history = client.get("/v1/policies/qwen/history").json()
    assert [v["operation"] for v in history["versions"]] == ["delete", "create"]  # newest first
    assert client.get("/v1/policies/ghost/history").status_code == 404


def test_the_history_comes_in_pages_newest_first(client: TestClient) -> None:
    """?limit was ignored: every version, each with its whole spec, in one answer.  Then the default page was the
    oldest 100: past 100 versions it never showed the current one, which a rollback starts from; and a last page
    that was exactly full gave a cursor to an empty page."""
    _create(client)
    for replicas in range(2, 7):
        body = {**POLICY, "scaling": {"max_replicas": replicas}}
        assert client.put("/v1/policies/qwen", json=body, headers=AUTH).status_code == 200
    pages, cursor = [], None
    while True:
        params = {"limit": 4} | ({} if cursor is None else {"cursor": cursor})
        page = client.get("/v1/policies/qwen/history", params=params).json()
        pages.append([v["version"] for v in page["versions"]])
        if (cursor := page["next_cursor"]) is None:
            break
    assert pages == [[6, 5, 4, 3], [2, 1]]
    every = client.get("/v1/policies/qwen/history").json()  # default: 100
    assert [v["version"] for v in every["versions"]] == [6, 5, 4, 3, 2, 1] and every["next_cursor"] is None
    full = client.get("/v1/policies/qwen/history", params={"limit": 3, "cursor": 4}).json()
    assert [v["version"] for v in full["versions"]] == [3, 2, 1] and full["next_cursor"] is None
    assert client.get("/v1/policies/qwen/history", params={"limit": 6}).json()["next_cursor"] is None
    assert client.get("/v1/policies/qwen/history", params={"limit": 5}).json()["next_cursor"] == 2
    assert client.get("/v1/policies/qwen/history", params={"limit": 501}).status_code == 422
    assert client.get("/v1/policies/ghost/history", params={"cursor": 3}).status_code == 404


def test_openslo_round_trip_keeps_the_long_prompt_allowance(client: TestClient) -> None:
    ttft = {"threshold_s": 0.5, "target": 0.99, "reference_prompt_tokens": 2000, "per_1k_prompt_tokens_s": 0.05}
    _create(client, {**POLICY, "objectives": {"ttft": ttft}})
    docs = list(yaml.safe_load_all(client.get("/v1/policies/qwen/openslo").text))
    good = docs[0]["spec"]["indicator"]["spec"]["ratioMetric"]["good"]["metricSource"]["spec"]["query"]
    assert "moeslo_ttft_normalized_seconds_bucket" in good
    assert 'reference_prompt_tokens="2000"' in good and 'per_1k_prompt_tokens_s="0.05"' in good
    client.delete("/v1/policies/qwen", headers=AUTH)
    _create(client, POLICY)  # flat; importing the documents brings the allowance back
    imported = client.post("/v1/openslo", content=yaml.safe_dump_all(docs),
                           headers={**AUTH, "Content-Type": "application/yaml"})  # fmt: skip
    assert imported.status_code == 200, imported.text
    assert client.get("/v1/policies/qwen").json()["policy"]["objectives"]["ttft"] == ttft


def test_openslo_export_and_import_round_trip(client: TestClient) -> None:
    _create(client, {**POLICY, "target": {**POLICY["target"], "model": "Qwen/Qwen3-30B-A3B"}})
    exported = client.get("/v1/policies/qwen/openslo")
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("application/yaml")
    docs = list(yaml.safe_load_all(exported.text))
    assert [d["kind"] for d in docs] == ["SLO", "SLO", "SLO"]
    assert all(d["apiVersion"] == "openslo/v1" for d in docs)
    ttft = docs[0]
    good = ttft["spec"]["indicator"]["spec"]["ratioMetric"]["good"]["metricSource"]["spec"]["query"]
    assert 'le="0.5"' in good and 'model_name="Qwen/Qwen3-30B-A3B"' in good
    assert ttft["spec"]["objectives"][0]["target"] == 0.99
    # Tighten TTFT to 300 ms at 99.9 %, import: the policy keeps its target and scaling.
    ttft["spec"]["objectives"][0]["target"] = 0.999
    good_source = ttft["spec"]["indicator"]["spec"]["ratioMetric"]["good"]["metricSource"]["spec"]
    good_source["query"] = good.replace("0.5", "0.3")
    docs[2]["spec"]["objectives"][0]["value"] = 0.2
    body = yaml.safe_dump_all(docs)
    imported = client.post("/v1/openslo", content=body, headers={**AUTH, "Content-Type": "application/yaml"})
    assert imported.status_code == 200, imported.text
    policy = client.get("/v1/policies/qwen").json()["policy"]
    assert policy["objectives"]["ttft"] == {
        "threshold_s": 0.3, "target": 0.999, "reference_prompt_tokens": 1000, "per_1k_prompt_tokens_s": 0.0,
    }
    assert policy["objectives"]["imbalance"]["max_cv"] == 0.2
    assert policy["target"]["kind"] == "deployment"
    # Documents for an unknown policy create a read-only model policy (once qwen no longer watches the model).
    assert client.delete("/v1/policies/qwen", headers=AUTH).status_code == 204
    for doc in docs:
        doc["metadata"]["annotations"]["moeslo.io/policy"] = "fresh"
    created = client.post("/v1/openslo", content=yaml.safe_dump_all(docs), headers=AUTH)
    assert created.status_code == 200
    fresh = client.get("/v1/policies/fresh").json()["policy"]
    assert fresh["target"] == {"kind": "model", "model": "Qwen/Qwen3-30B-A3B"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("a: [unclosed", "invalid YAML"),
        ("apiVersion: openslo/v2\nkind: SLO\n", "must be 'openslo/v1'"),
        ("apiVersion: openslo/v1\nkind: Service\n", "only 'SLO' documents"),
        ("", "no OpenSLO documents"),
        ("apiVersion: openslo/v1\nkind: SLO\nmetadata: {name: a}\nspec: {objectivs: []}\n",
         "document[1].spec.objectivs: not an OpenSLO v1 SLO field"),
        # Parts of the wrong shape where a mapping or a number belongs: the client's document, never a 500.
        ("apiVersion: openslo/v1\nkind: SLO\nmetadata: {name: a, annotations: oops}\nspec: {service: s}\n",
         "document[1]: malformed OpenSLO SLO (AttributeError"),
        ("apiVersion: openslo/v1\nkind: SLO\nmetadata: {name: a}\nspec: {indicator: {spec: {ratioMetric: "
         "{good: {metricSource: {spec: [1]}}}}}}\n", "document[1]: malformed OpenSLO SLO"),
        ("[" * 10_000 + "]" * 10_000, "body: YAML nested too deeply"),
        # A YAML alias nested six deep is a million strings to str() or repr(): refused as it is read.
        ("apiVersion: openslo/v1\nkind: SLO\nmetadata:\n  name: a\n  labels:\n"
         "    l0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
         + "".join(f"    l{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 6))
         + "spec: {service: *a5}\n", "body: YAML aliases are not accepted (*a0 at line 7 column 14)"),
        # A refused value is shown cut short, not spelt out whole.
        ("apiVersion: [" + ", ".join(["v"] * 100_000) + "]\n",
         "apiVersion: must be 'openslo/v1', got ['v', 'v', 'v', 'v', ...]"),
    ],
)
def test_bad_openslo_is_422(client: TestClient, body: str, message: str) -> None:
    response = client.post("/v1/openslo", content=body, headers=AUTH)
    assert response.status_code == 422
    assert message in response.json()["detail"] and len(response.content) < 2_000


def test_openslo_import_with_a_bad_target_value_changes_nothing(client: TestClient) -> None:
    _create(client)
    docs = list(yaml.safe_load_all(client.get("/v1/policies/qwen/openslo").text))
    docs[1]["spec"]["objectives"][0]["target"] = 1.2
    response = client.post("/v1/openslo", content=yaml.safe_dump_all(docs), headers=AUTH)
    assert response.status_code == 422
    assert "document[2].spec.objectives[0].target: must be a number in (0, 1)" in response.json()["detail"]
    assert client.get("/v1/policies/qwen").json()["version"] == 1


def test_openslo_fields_of_the_wrong_type_are_422(client: TestClient) -> None:
    _create(client)
    docs = list(yaml.safe_load_all(client.get("/v1/policies/qwen/openslo").text))
    docs[0]["spec"]["timeWindow"][0]["duration"] = ["30d"]
    response = client.post("/v1/openslo", content=yaml.safe_dump_all(docs), headers=AUTH)
    assert "spec.timeWindow[0].duration: must be a string, got list" in response.json()["detail"]
    docs[0]["spec"]["timeWindow"][0]["duration"] = "30d"
    objective = docs[0]["spec"]["objectives"][0]
    del objective["target"]
    objective["targetPercent"] = True  # a bool is an int to Python: it read as 1 %
    response = client.post("/v1/openslo", content=yaml.safe_dump_all(docs), headers=AUTH)
    assert response.status_code == 422, response.text
    assert "spec.objectives[0].target: must be a number in (0, 1), got True" in response.json()["detail"]
    objective["targetPercent"] = 99.5
    assert client.post("/v1/openslo", content=yaml.safe_dump_all(docs), headers=AUTH).status_code == 200
    assert client.get("/v1/policies/qwen").json()["policy"]["objectives"]["ttft"]["target"] == 0.995


@pytest.mark.parametrize("window", ["30d\n", "\uff13\uff10d", "30 d", "d"])
def test_a_window_prometheus_would_not_read_is_422(client: TestClient, window: str) -> None:
    response = client.post("/v1/policies", json={**POLICY, "window": window}, headers=AUTH)
    assert response.status_code == 422 and "window" in response.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "application/yaml", ""])
def test_a_body_that_is_not_json_is_415_naming_the_type(client: TestClient, content_type: str) -> None:
    body = b'{"name": "qwen", "target": {"kind": "model", "model": "m"}}'
    for method, path in (("POST", "/v1/policies"), ("PUT", "/v1/policies/qwen")):
        response = client.request(method, path, content=body, headers={**AUTH, "Content-Type": content_type})
        assert response.status_code == 415, (method, response.text)
        assert f"expected application/json, got {content_type!r}" in response.json()["detail"]
    stranger = client.post("/v1/policies", content=body, headers={"Content-Type": content_type})
    assert stranger.status_code == 401  # the token first
    json_body = {**AUTH, "Content-Type": "application/json; charset=utf-8"}
    assert client.post("/v1/policies", content=body, headers=json_body).status_code == 201


def test_a_label_name_with_a_trailing_newline_is_422(client: TestClient) -> None:
    router = {"prometheus_labels": {"team\n": "a"}}
    response = client.post("/v1/policies", json={**POLICY, "router": router}, headers=AUTH)
    assert response.status_code == 422 and "is not a Prometheus label name" in response.text


def test_head_is_answered_as_get_and_405_names_the_methods(client: TestClient) -> None:
    _create(client)
    for path in ("/health", "/v1/policies", "/v1/policies/qwen", "/ui/"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == 200 and head.content == b"", path
        assert head.headers["content-length"] == got.headers["content-length"], path
    refused = client.request("TRACE", "/v1/policies/qwen")
    assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD, PUT, PATCH, DELETE"
    assert client.options("/v1/policies").headers["allow"] == "GET, HEAD, POST"
    assert client.delete("/health", headers=AUTH).headers["allow"] == "GET, HEAD"


def test_an_import_does_not_replace_a_policy_created_after_it_looked(client: TestClient) -> None:
    _create(client)
    docs = yaml.safe_dump_all(yaml.safe_load_all(client.get("/v1/policies/qwen/openslo").text))
    store = client.app.state.store  # type: ignore[attr-defined]
    real = store.get_policy

    def not_yet(name: str) -> Any:  # the import looks before the policy's creator has written it
        if name == "qwen":
            raise errors.NotFoundError("policy", name)
        return real(name)

    store.get_policy = not_yet
    response = client.post("/v1/openslo", content=docs, headers=AUTH)
    store.get_policy = real
    assert response.status_code == 409, response.text
    stored = client.get("/v1/policies/qwen").json()
    assert stored["version"] == 1 and stored["policy"]["target"]["kind"] == "deployment"


def test_every_error_class_maps_to_one_status() -> None:
    assert status_for(errors.ValidationError("x: y")) == 422
    assert status_for(errors.NotFoundError("policy", "p")) == 404
    assert status_for(errors.ConflictError("taken")) == 409
    assert status_for(StaleVersionError("p", current=2, expected=1)) == 412
    assert status_for(errors.OverloadedError("full", retry_after_s=1)) == 429
    assert status_for(errors.UnavailableError("down")) == 503
    assert status_for(ActuationError("failed")) == 502
    assert status_for(errors.DataError("bad", path="f", line=2)) == 422
    assert status_for(errors.MoesloError("?")) == 500
    assert STATUS_BY_ERROR[-1][0] is errors.MoesloError


def test_patch_without_if_match_reapplies_over_a_concurrent_write(client: TestClient) -> None:
    _create(client)
    store = client.app.state.store  # type: ignore[attr-defined]
    real = store.replace_policy
    raced = {"done": False}

    def racing_replace(policy, *, expected_version=None, create=False):  # type: ignore[no-untyped-def]
        if not raced["done"]:  # another writer lands between our read and our write
            raced["done"] = True
            current = store.get_policy("qwen").policy
            real(current.model_copy(update={"description": "theirs"}), expected_version=1)
        return real(policy, expected_version=expected_version, create=create)

    store.replace_policy = racing_replace
    patched = client.patch("/v1/policies/qwen", json={"mode": "advisory"}, headers=AUTH)
    assert patched.status_code == 200, patched.text
    body = patched.json()
    assert body["version"] == 3
    assert (body["policy"]["mode"], body["policy"]["description"]) == ("advisory", "theirs")  # both kept
    store.replace_policy = real
    raced["done"] = False
    store.replace_policy = racing_replace
    pinned = client.patch("/v1/policies/qwen", json={"mode": "off"}, headers={**AUTH, "If-Match": '"3"'})
    assert pinned.status_code == 412  # with If-Match, a lost race is the client's to resolve


def _another_writer_lands_first(store: Any, method: str) -> None:
    """The store's ``method`` lets another writer change policy qwen just before its first call writes."""
    real, raced = getattr(store, method), []

    def racing(*args: Any, **kwargs: Any) -> Any:
        if not raced:
            raced.append(True)
            current = store.get_policy("qwen")
            store.replace_policy(current.policy.model_copy(update={"description": "theirs"}),
                                 expected_version=current.version)  # fmt: skip
        return real(*args, **kwargs)

    setattr(store, method, racing)


@pytest.mark.parametrize(("method", "write"), [("replace_policy", "PUT"), ("replace_policy", "PATCH"),
                                                ("delete_policy", "DELETE")])  # fmt: skip
def test_if_match_star_holds_while_the_policy_exists_whoever_wrote_last(
    client: TestClient, method: str, write: str
) -> None:
    """``If-Match: *`` is true while the policy exists (RFC 9110 13.1.1), but the API read its version first and
    then wrote on that version: another writer landing in between made it a 412."""
    _create(client)
    _another_writer_lands_first(client.app.state.store, method)  # type: ignore[attr-defined]
    body = {"json": {"mode": "advisory"}} if write == "PATCH" else {"json": POLICY} if write == "PUT" else {}
    response = client.request(write, "/v1/policies/qwen", headers={**AUTH, "If-Match": "*"}, **body)
    assert response.status_code == (204 if write == "DELETE" else 200), response.text
    history = [v["operation"] for v in client.get("/v1/policies/qwen/history").json()["versions"]]
    assert history == ["delete" if write == "DELETE" else "update", "update", "create"]


def test_if_match_star_on_a_policy_that_is_gone(client: TestClient) -> None:
    """PUT would create it, so the precondition fails (412); PATCH and DELETE fail as they would without it (404)."""
    star = {**AUTH, "If-Match": "*"}
    assert client.put("/v1/policies/qwen", json=POLICY, headers=star).status_code == 412
    assert client.patch("/v1/policies/qwen", json={"mode": "off"}, headers=star).status_code == 404
    assert client.delete("/v1/policies/qwen", headers=star).status_code == 404
    assert client.get("/v1/policies/qwen").status_code == 404



def test_if_none_match_star_on_put_creates_only(tmp_path: Path) -> None:
    """``If-None-Match: *`` (RFC 9110 13.1.2: no current representation) was ignored: a create-only PUT replaced
    the policy it meant not to touch.  It creates (also under require_if_match: a create changes nothing there
    is), and finds the policy there in the write's own transaction: 412, the policy as it was."""
    create_only = {**AUTH, "If-None-Match": "*"}
    with make_client(tmp_path, require_if_match=True) as client:
        assert client.put("/v1/policies/qwen", json=POLICY, headers=create_only).status_code == 201
        again = client.put("/v1/policies/qwen", json={**POLICY, "mode": "off"}, headers=create_only)
        assert again.status_code == 412 and "If-None-Match: *" in again.json()["detail"], again.text
        both = client.put("/v1/policies/qwen", json=POLICY, headers={**create_only, "If-Match": '"1"'})
        assert both.status_code == 412 and "cannot both hold" in both.json()["detail"], both.text
        # PATCH and DELETE change a policy that exists, so * fails there (412); on one that does not, 404.
        merge = {**create_only, "Content-Type": "application/merge-patch+json"}
        assert client.patch("/v1/policies/qwen", json={"mode": "off"}, headers=merge).status_code == 412
        assert client.delete("/v1/policies/qwen", headers=create_only).status_code == 412
        assert client.delete("/v1/policies/ghost", headers=create_only).status_code == 404
        assert client.get("/v1/policies/qwen").json()["policy"]["mode"] == "enforce"


@pytest.mark.parametrize("value", ['"1"', 'W/"1"', '"2", "3"', "1"])
def test_if_none_match_with_entity_tags_on_a_write_is_422_never_ignored(client: TestClient, value: str) -> None:
    """RFC 9110 13.1.2 reads ``If-None-Match: "1"`` on a write as "only if the current version is not 1".  The
    store conditions a write on one version (If-Match) and no other way, so judging it before the write would
    let another writer's change in between slip past it; and ignoring it, as before, writes where the client
    said not to.  It is refused as a request this API does not carry out (422, naming the field and the two
    conditions it does take), not 412, which would say the condition was judged and found false."""
    _create(client)
    headers = {**AUTH, "If-None-Match": value}
    for method, body in (("PUT", {"json": {**POLICY, "mode": "off"}}), ("PATCH", {"json": {"mode": "off"}}),
                         ("DELETE", {})):  # fmt: skip
        refused = client.request(method, "/v1/policies/qwen", headers=headers, **body)
        assert refused.status_code == 422, (method, refused.text)
        assert refused.json()["errors"][0]["field"] == "If-None-Match" and "If-Match" in refused.text
    assert client.get("/v1/policies/qwen").json()["version"] == 1


@pytest.mark.parametrize("tag", ['"5"', '"abc"', 'W/"5"', '"99999999999999999999"'])
def test_if_match_on_a_policy_that_does_not_exist_is_a_404_whatever_it_names(client: TestClient, tag: str) -> None:
    """A weak or foreign tag got 412 where a version got 404: without the precondition the answer is a 404, and
    RFC 9110 (13.2.1) evaluates no precondition then."""
    headers = {**AUTH, "If-Match": tag}
    assert client.delete("/v1/policies/ghost", headers=headers).status_code == 404
    merge = {**headers, "Content-Type": "application/merge-patch+json"}
    assert client.patch("/v1/policies/ghost", json={"mode": "off"}, headers=merge).status_code == 404


def test_a_patch_names_the_field_as_put_and_post_do(client: TestClient) -> None:
    """PATCH kept the target kind pydantic validated against in the path (target.deployment.namespace)."""
    _create(client)
    bad = {"kind": "deployment", "namespace": "Bad_NS", "name": "w"}
    merge = {**AUTH, "Content-Type": "application/merge-patch+json"}
    fields = [
        [p["field"] for p in response.json()["errors"]]
        for response in (
            client.put("/v1/policies/qwen", json={**POLICY, "target": bad}, headers=AUTH),
            client.patch("/v1/policies/qwen", json={"target": bad}, headers=merge),
            client.post("/v1/policies", json={**POLICY, "name": "other", "target": bad}, headers=AUTH),
        )
    ]
    assert fields == [["target.namespace"]] * 3


def test_a_stored_policy_that_no_longer_validates_leaves_the_others_served(tmp_path: Path) -> None:
    """It made every listing, status and page a 500, every write too, and could not be deleted."""
    from tests.controller.store.test_unreadable_policies import spoil

    with make_client(tmp_path) as client:
        _create(client)
        _create(client, {"name": "old", "target": {"kind": "model", "model": "o"}})
    spoil(tmp_path / "c.db", "old")
    with make_client(tmp_path) as client:
        listed = client.get("/v1/policies").json()
        assert [item["name"] for item in listed["items"]] == ["qwen"]
        [unreadable] = listed["unreadable"]
        assert (unreadable["name"], unreadable["version"]) == ("old", 1)
        assert "surprise: Extra inputs are not permitted" in unreadable["problem"]
        for path in ("/v1/status", "/ui/", "/v1/scrape-targets", "/v1/policies/qwen"):
            assert client.get(path).status_code == 200, path
        health = client.get("/health")
        assert (health.status_code, health.json()["status"]) == (200, "degraded")
        assert health.json()["store"] == "unreadable policies: old"
        one = client.get("/v1/policies/old")
        assert one.status_code == 500 and "policy 'old'" in one.json()["detail"]
        third = {"name": "third", "target": {"kind": "model", "model": "t"}}
        assert client.put("/v1/policies/third", json=third, headers=AUTH).status_code == 201
        assert client.delete("/v1/policies/old", headers={**AUTH, "If-Match": '"1"'}).status_code == 204
        assert client.get("/v1/policies").json()["unreadable"] == []
        assert client.get("/health").json()["status"] == "ok"


def test_a_policy_that_no_longer_validates_is_replaced_or_deleted_under_require_if_match(tmp_path: Path) -> None:
    from tests.controller.store.test_unreadable_policies import spoil

    with make_client(tmp_path) as client:
        _create(client)
    spoil(tmp_path / "c.db", "qwen")
    with make_client(tmp_path, require_if_match=True) as client:
        assert client.put("/v1/policies/qwen", json=POLICY, headers=AUTH).status_code == 428
        assert client.delete("/v1/policies/qwen", headers=AUTH).status_code == 428
        fixed = client.put("/v1/policies/qwen", json={**POLICY, "mode": "off"}, headers={**AUTH, "If-Match": '"1"'})
        assert fixed.status_code == 200 and fixed.json()["version"] == 2


def test_an_off_edge_ttft_threshold_is_refused_with_an_allowance_only_and_a_stored_one_still_loads(
    tmp_path: Path,
) -> None:
    """A threshold between two edges of the normalized histogram was taken, and the controller then read 99 % good
    requests as 20 % (interpolated inside the bucket) and scaled up for nothing.  A flat objective reads
    vllm:time_to_first_token_seconds, whose edges vLLM's --custom-histogram-buckets may set, so deploy render
    judges it per engine; a policy stored before the rule keeps loading."""
    off_edge = {"threshold_s": 0.32, "target": 0.99, "per_1k_prompt_tokens_s": 0.05}
    with make_client(tmp_path) as client:
        flat = {**POLICY, "objectives": {"ttft": {**off_edge, "per_1k_prompt_tokens_s": 0.0}}}
        assert _create(client, flat).json()["policy"]["objectives"]["ttft"]["threshold_s"] == 0.32
        merge = {**AUTH, "Content-Type": "application/merge-patch+json"}
        refused = client.patch("/v1/policies/qwen", json={"objectives": {"ttft": off_edge}}, headers=merge)
        assert refused.status_code == 422, refused.text
        [problem] = refused.json()["errors"]
        assert problem["field"] == "objectives.ttft.threshold_s" and "0.3 and 0.35" in problem["message"]
    db = sqlite3.connect(tmp_path / "c.db")
    with db:  # as an older controller took it
        db.execute("UPDATE policies SET spec = json_set(spec, '$.objectives.ttft.per_1k_prompt_tokens_s', 0.05)")
    db.close()
    with make_client(tmp_path) as client:
        assert client.get("/v1/policies/qwen").json()["policy"]["objectives"]["ttft"]["per_1k_prompt_tokens_s"] == 0.05
