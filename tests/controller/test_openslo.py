"""OpenSLO import and export (pure): which model a new policy watches, names, targets."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from pydantic import ValidationError as PydanticValidationError

from contracts.errors import ValidationError
from controller.api.errors import error_problem
from controller.openslo import apply_imported, export_policy, parse_openslo
from controller.policy import STORED, LocalTarget, Policy, parse_duration_s


def _slo(service: str = "chat-frontend", model_matcher: str = 'model_name="Qwen/Qwen3-30B-A3B",',
         annotations: dict[str, str] | None = None, name: str = "chat-ttft", **objective: Any) -> dict[str, Any]:
    """A hand-written TTFT SLO, as a team writing OpenSLO (not moeslo's export) would."""
    metric = "vllm:time_to_first_token_seconds"
    return {
        "apiVersion": "openslo/v1",
        "kind": "SLO",
        "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
        "spec": {
            "service": service,
            "indicator": {"metadata": {"name": "ttft"}, "spec": {"ratioMetric": {
                "counter": True,
                "good": {"metricSource": {"type": "Prometheus", "spec": {
                    "query": f'sum(rate({metric}_bucket{{{model_matcher}le="0.5"}}[5m]))'}}},
                "total": {"metricSource": {"type": "Prometheus", "spec": {
                    "query": f"sum(rate({metric}_count{{{model_matcher.rstrip(',')}}}[5m]))"}}},
            }}},
            "timeWindow": [{"duration": "30d", "isRolling": True}],
            "budgetingMethod": "Occurrences",
            "objectives": [objective or {"target": 0.99}],
        },
    }


def _import(*docs: dict[str, Any]) -> dict[str, Any]:
    return {name: apply_imported(slos, None) for name, slos in parse_openslo(yaml.safe_dump_all(docs)).items()}


def test_a_new_policy_watches_the_model_its_queries_count_not_the_service() -> None:
    """The service names what users call (``chat-frontend``); the SLIs count ``model_name``: a policy on the
    service's name watched a model no engine serves."""
    (policy,) = _import(_slo()).values()
    assert policy.name == "chat-frontend"
    assert policy.target.model_dump() == {"kind": "model", "model": "Qwen/Qwen3-30B-A3B"}


def test_the_model_annotation_names_the_model_the_queries_leave_unsaid_and_escapes_are_read_back() -> None:
    (policy,) = _import(_slo(model_matcher="", annotations={"moeslo.io/model": "served-name"})).values()
    assert policy.model_name == "served-name"
    (policy,) = _import(_slo(annotations={"moeslo.io/model": "Qwen/Qwen3-30B-A3B"})).values()  # said twice, alike
    assert policy.model_name == "Qwen/Qwen3-30B-A3B"
    (escaped,) = _import(_slo(model_matcher='model_name="a\\"b\\\\c",')).values()
    assert escaped.model_name == 'a"b\\c'


def test_a_model_annotation_other_than_the_model_the_queries_count_is_refused_naming_it() -> None:
    """The annotation won over the queries: a policy on ``llama`` enforced SLOs whose SLIs count ``qwen``."""
    with pytest.raises(ValidationError) as caught:
        parse_openslo(yaml.safe_dump(_slo(annotations={"moeslo.io/model": "llama"})))
    (problem,) = caught.value.problems
    assert problem.startswith("document[1].metadata.annotations.moeslo.io/model: 'llama', but the queries count "
                              "model_name 'Qwen/Qwen3-30B-A3B'"), problem  # fmt: skip


def test_a_new_policy_without_a_model_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match=r"cannot tell which model a new policy watches.*moeslo\.io/model"):
        _import(_slo(model_matcher=""))
    with pytest.raises(ValidationError, match="the queries name several models"):
        _import(_slo(model_matcher='model_name="a",model_name="b",'))


def test_two_slos_of_one_name_are_refused() -> None:
    itl = _slo(name="chat-ttft")
    for part in ("good", "total"):
        source = itl["spec"]["indicator"]["spec"]["ratioMetric"][part]["metricSource"]["spec"]
        source["query"] = source["query"].replace("time_to_first_token", "inter_token_latency").replace("0.5", "0.02")
    with pytest.raises(ValidationError) as caught:
        parse_openslo(yaml.safe_dump_all([_slo(), itl]))
    assert caught.value.problems == ("document[2].metadata.name: 'chat-ttft' is used by document[1] too",)
    itl["metadata"]["name"] = "chat-itl"
    assert set(parse_openslo(yaml.safe_dump_all([_slo(), itl]))["chat-frontend"].objectives) == {"ttft", "itl"}


def test_a_malformed_metadata_is_a_refusal_not_a_crash() -> None:
    """The duplicate-name check read metadata.name before the document was checked: AttributeError, a 500."""
    for metadata in ("oops", [1]):
        with pytest.raises(ValidationError):
            parse_openslo(yaml.safe_dump({**_slo(), "metadata": metadata}))


def test_a_target_percent_reads_as_the_decimal_it_says() -> None:
    """99.9 / 100 is 0.9990000000000001 in floats: stored, exported and drawn as such."""
    (policy,) = _import(_slo(targetPercent=99.9)).values()
    assert policy.objectives.ttft.target == 0.999
    assert "target: 0.999\n" in export_policy(policy)


def test_exported_names_stay_within_63_characters_and_import_back() -> None:
    """A policy name may have 63 characters; ``<name>-ttft-good-ratio`` then had 79, which OpenSLO refuses."""
    names = ["a" * 63, "a" * 62 + "b", "short"]
    exported = {name: list(yaml.safe_load_all(export_policy(Policy(name=name, target=LocalTarget(model="m")))))
                for name in names}  # fmt: skip
    objects = [n for docs in exported.values() for d in docs
               for n in (d["metadata"]["name"], d["spec"]["indicator"]["metadata"]["name"])]
    assert max(map(len, objects)) <= 63 and len(set(objects)) == len(objects) == 18
    assert exported["short"][0]["metadata"]["name"] == "short-ttft"
    assert set(_import(*exported["a" * 63])) == {"a" * 63}


def test_names_over_63_characters_are_refused_not_cut() -> None:
    with pytest.raises(ValidationError, match=r"document\[1\]\.metadata\.name: 64 characters; OpenSLO names"):
        parse_openslo(yaml.safe_dump(_slo(name="x" * 64)))
    # A policy named after a long service was cut to its first 63 characters: another policy's name, maybe.
    with pytest.raises(ValidationError, match="at most 63 characters"):
        _import(_slo(service="s" * 70))


def test_an_slo_needs_a_dns_label_name_and_a_service_without_letters_leaves_the_policy_its_name() -> None:
    for name in ("", "Chat_TTFT", "-chat", "chat-"):
        with pytest.raises(ValidationError, match=r"document\[1\]\.metadata\.name: .* is not an OpenSLO name"):
            parse_openslo(yaml.safe_dump(_slo(name=name)))
    assert set(parse_openslo(yaml.safe_dump(_slo(name="chat-ttft", service="***")))) == {"chat-ttft"}


def test_the_exported_service_is_the_policy_a_valid_name() -> None:
    """The model name (``Qwen/Qwen3-30B-A3B``) is no OpenSLO service name; import reads the model from the queries."""
    policy = Policy(name="chat", target=LocalTarget(model="Qwen/Qwen3-30B-A3B"))
    docs = list(yaml.safe_load_all(export_policy(policy)))
    assert {d["spec"]["service"] for d in docs} == {"chat"}
    for doc in docs:
        del doc["metadata"]["annotations"]  # as a tool that keeps only OpenSLO's own fields passes them on
    (imported,) = _import(*docs).values()
    assert (imported.name, imported.model_name) == ("chat", "Qwen/Qwen3-30B-A3B")


def _refusal(doc: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(ValidationError) as caught:
        parse_openslo(yaml.safe_dump(doc))
    return caught.value.problems


@pytest.mark.parametrize("method", ["Timeslices", "RatioTimeslices", "Banana", None])
def test_a_budgeting_method_other_than_occurrences_is_refused_not_read_as_one(method: str | None) -> None:
    """The budgeting method was never read: time slices (or none, which OpenSLO does not allow) read as
    Occurrences, another SLO than the document states."""
    doc = _slo(target=0.99, **({"timeSliceTarget": 0.95, "timeSliceWindow": "1m"} if method else {}))
    doc["spec"]["budgetingMethod"] = method
    said = "required" if method is None else f"{method!r} is not supported"
    assert _refusal(doc) == (f"document[1].spec.budgetingMethod: {said}; a ttft SLO is imported with Occurrences "
                             "only",)  # fmt: skip


def test_the_exported_imbalance_slo_needs_its_timeslices() -> None:
    policy = Policy(name="chat", target=LocalTarget(model="m"))
    docs = list(yaml.safe_load_all(export_policy(policy)))
    assert set(_import(*docs)) == {"chat"}
    docs[2]["spec"]["budgetingMethod"] = "Occurrences"
    with pytest.raises(ValidationError, match=r"document\[3\]\.spec\.budgetingMethod: 'Occurrences' is not supported; "
                                              r"a imbalance SLO is imported with Timeslices only"):  # fmt: skip
        _import(*docs)


def test_a_calendar_window_without_is_rolling_is_calendar_aligned_and_refused() -> None:
    """OpenSLO: isRolling, omitted, is false where a calendar is given; it was read as rolling."""
    doc = _slo()
    doc["spec"]["timeWindow"] = [{"duration": "30d", "calendar": {"startTime": "2024-01-01 00:00:00",
                                                                 "timeZone": "UTC"}}]  # fmt: skip
    (problem,) = _refusal(doc)
    assert problem.startswith("document[1].spec.timeWindow[0].isRolling: only rolling windows are supported")
    doc["spec"]["timeWindow"][0]["isRolling"] = True
    assert parse_openslo(yaml.safe_dump(doc))["chat-frontend"].window == "30d"


def test_a_ratio_objective_takes_its_threshold_from_le_never_from_value_or_op() -> None:
    """``value: 1`` on a ratio objective overrode ``le="0.5"``: a 1 s TTFT threshold nobody wrote."""
    (problem,) = _refusal(_slo(target=0.99, value=1))
    assert problem.startswith("document[1].spec.objectives[0].value: 1 is not the good query's le=\"0.5\"")
    (problem,) = _refusal(_slo(target=0.99, op="gt"))
    assert problem.startswith("document[1].spec.objectives[0].op: a ratioMetric objective has none")
    (policy,) = _import(_slo(target=0.99, value=0.5)).values()  # the same threshold, said twice
    assert policy.objectives.ttft.threshold_s == 0.5


def test_a_bad_total_ratio_is_refused_as_such() -> None:
    doc = _slo()
    ratio = doc["spec"]["indicator"]["spec"]["ratioMetric"]
    ratio["bad"] = ratio.pop("good")
    (problem,) = _refusal(doc)
    assert problem.startswith("document[1].spec.indicator.spec.ratioMetric.bad: bad/total ratios are not supported")


def test_an_allowance_finer_than_its_label_is_refused_and_the_rest_round_trips_exactly() -> None:
    """0.1234567 came back from OpenSLO as 0.123457 (the label's 6 digits), and read 0.123457's series."""
    ttft = {"threshold_s": 0.5, "target": 0.995, "reference_prompt_tokens": 2000, "per_1k_prompt_tokens_s": 0.1234567}
    spec = {"name": "rt", "target": {"kind": "model", "model": "m"}, "objectives": {"ttft": ttft}}
    with pytest.raises(PydanticValidationError, match=r"objectives\.ttft\.per_1k_prompt_tokens_s\n.*at most 6 "
                                                      r"significant digits.*\(0\.123457\)"):  # fmt: skip
        Policy.model_validate(spec)
    assert Policy.model_validate(spec, context={STORED: True}).objectives.ttft.per_1k_prompt_tokens_s == 0.1234567
    for per_1k in (0.123456, 1.23456e-05, 59.9999):
        policy = Policy.model_validate({**spec, "objectives": {"ttft": {**ttft, "per_1k_prompt_tokens_s": per_1k}}})
        (back,) = _import(*yaml.safe_load_all(export_policy(policy))).values()
        assert back.objectives.ttft == policy.objectives.ttft


def test_an_allowance_slo_whose_le_is_no_edge_of_the_normalized_histogram_is_refused_naming_the_edges() -> None:
    """``le="0.3"`` on moeslo_ttft_normalized_seconds was imported: no such bucket exists, so the controller
    interpolated inside 0.25..0.5 and read 99 % good requests as 20 %."""
    doc = _slo(target=0.99)
    good = doc["spec"]["indicator"]["spec"]["ratioMetric"]["good"]["metricSource"]["spec"]
    good["query"] = ('sum(rate(moeslo_ttft_normalized_seconds_bucket{model_name="Qwen/Qwen3-30B-A3B",'
                     'reference_prompt_tokens="1000",per_1k_prompt_tokens_s="0.05",le="0.32"}[5m]))')
    _with_query(doc, "total", good["query"].replace("_bucket", "_count").replace(',le="0.32"', ""))
    with pytest.raises(ValidationError) as caught:
        _import(doc)
    (problem,) = caught.value.problems
    assert problem.startswith("policy 'chat-frontend': objectives.ttft.threshold_s: threshold_s 0.32 is not a bucket "
                              "edge of moeslo_ttft_normalized_seconds; the nearest edges are 0.3 and 0.35")
    good["query"] = good["query"].replace('le="0.32"', 'le="0.25"')
    (policy,) = _import(doc).values()
    assert (policy.objectives.ttft.threshold_s, policy.objectives.ttft.per_1k_prompt_tokens_s) == (0.25, 0.05)


def _alias_bomb(levels: int = 6) -> str:
    """A few hundred bytes of YAML whose aliases expand to 10**levels strings."""
    anchors = "".join(f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, levels))
    return f"x:\n  a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n{anchors}apiVersion: *a{levels - 1}\n"


def test_yaml_aliases_are_refused_by_name_before_anything_expands_them() -> None:
    """An alias nested six deep is a million strings: the apiVersion's message spelt them out (144 MB)."""
    with pytest.raises(ValidationError) as caught:
        parse_openslo(_alias_bomb())
    (problem,) = caught.value.problems
    assert problem == "body: YAML aliases are not accepted (*a0 at line 3 column 12); write the value out"
    assert parse_openslo(yaml.safe_dump(_slo()).replace("chat-ttft", "&n chat-ttft", 1))  # an anchor alone is fine


def _imbalance_doc(**objective: Any) -> dict[str, Any]:
    doc = next(d for d in yaml.safe_load_all(export_policy(Policy(name="chat", target=LocalTarget(model="m"))))
               if d["metadata"]["annotations"]["moeslo.io/objective"] == "imbalance")  # fmt: skip
    doc["spec"]["objectives"][0].update(objective)
    return doc


@pytest.mark.parametrize(
    ("doc", "start"),
    [
        ({**_slo(), "apiVersion": ["v"] * 10_000}, "document[1].apiVersion: must be 'openslo/v1', got ['v', 'v', "),
        ({**_slo(), "kind": {str(i): i for i in range(10_000)}}, "document[1].kind: only 'SLO' documents"),
        (_slo(target=list(range(10_000))), "document[1].spec.objectives[0].target: must be a number in (0, 1), got"),
        (_slo(target=0.99, value="x" * 10_000), "document[1].spec.objectives[0].value: 'xxx"),
        (_imbalance_doc(op=["lte"] * 10_000), "document[1].spec.objectives[0].op: imbalance objectives must be lte"),
        (_imbalance_doc(value=[1.0] * 10_000), "document[1].spec.objectives[0].value: must be a CV in (0, 10]"),
        (_imbalance_doc(timeSliceWindow=["1m"] * 10_000),
         "document[1].spec.objectives[0].timeSliceWindow: must be a string, got list"),
    ],
)
def test_a_value_in_a_message_is_shown_cut_short(doc: dict[str, Any], start: str) -> None:
    """The messages spelt a refused value out whole with repr(): a structure the size of the request, or (with
    aliases) of gigabytes."""
    (problem,) = _refusal(doc)
    assert problem.startswith(start) and len(problem) < 300, problem


@pytest.mark.parametrize(
    ("extra", "shown"),
    [
        ('cycle="2",', 'cycle="2"'),  # read as le="2": a 2 s threshold nobody wrote
        ('role="prefill",', 'role="prefill"'),
        ('handle="x",', 'handle="x"'),
        ('engine="e1",', 'engine="e1"'),  # one engine's requests: the controller counts every engine's
        ('model_name!="other",', 'model_name!="other"'),
        ('team=~"a.*",', 'team=~"a.*"'),
        ("engine='e1',", 'engine="e1"'),  # PromQL strings may be single-quoted or backquoted as well
        ("role=`prefill`,", 'role="prefill"'),
        ("model_name!='other',", 'model_name!="other"'),
        ("handle='it\\'s',", 'handle="it\'s"'),  # the escape undone
        ("handle=`a\\b`,", 'handle="a\\b"'),  # a raw string: the backslash is kept
    ],
)
def test_a_matcher_the_controller_would_not_read_is_refused_naming_it(extra: str, shown: str) -> None:
    """``cycle="2"`` matched the threshold's pattern (a 2 s threshold), and every other matcher was dropped: the
    policy counted requests the SLO leaves out."""
    doc = _slo(model_matcher=f'model_name="Qwen/Qwen3-30B-A3B",{extra}')
    problems = _refusal(doc)
    assert problems[0].startswith(f"document[1].spec.indicator.spec.ratioMetric.good: the matcher {shown} is not "
                                  "read"), problems  # fmt: skip
    assert "only model_name=, le=" in problems[0]


def test_a_threshold_is_read_from_le_alone() -> None:
    doc = _slo(model_matcher='model_name="Qwen/Qwen3-30B-A3B",')
    good = doc["spec"]["indicator"]["spec"]["ratioMetric"]["good"]["metricSource"]["spec"]
    good["query"] = good["query"].replace('le="0.5"', 'le = "0.25"')
    (policy,) = _import(doc).values()
    assert policy.objectives.ttft.threshold_s == 0.25


def test_a_single_quoted_model_is_read_as_the_model() -> None:
    """``model_name='x'`` went unseen: the import onto another model's policy was accepted, and a document naming
    only it had no model."""
    doc = _slo(model_matcher="model_name='Qwen/Qwen3-30B-A3B',")
    (slos,) = parse_openslo(yaml.safe_dump(doc)).values()
    with pytest.raises(ValidationError):
        apply_imported(slos, Policy(name="chat-frontend", target=LocalTarget(model="llama-70b")))
    assert apply_imported(slos, None).model_name == "Qwen/Qwen3-30B-A3B"


def test_an_import_onto_a_policy_of_another_model_is_refused_naming_where_the_model_came_from() -> None:
    """The document's model was dropped onto an existing policy: SLOs written for one model, enforced on
    another."""
    base = Policy(name="chat-frontend", target=LocalTarget(model="llama-70b"))
    for doc, field in ((_slo(), "document[1].spec.indicator.spec"),
                       (_slo(model_matcher="", annotations={"moeslo.io/model": "qwen3-moe"}),
                        "document[1].metadata.annotations.moeslo.io/model")):  # fmt: skip
        (slos,) = parse_openslo(yaml.safe_dump(doc)).values()
        with pytest.raises(ValidationError) as caught:
            apply_imported(slos, base)
        (problem,) = caught.value.problems
        assert problem.startswith(f"{field}: model ") and "policy 'chat-frontend' watches 'llama-70b'" in problem
    same = Policy(name="chat-frontend", target=LocalTarget(model="Qwen/Qwen3-30B-A3B"))
    (slos,) = parse_openslo(yaml.safe_dump(_slo())).values()
    assert apply_imported(slos, same).model_name == "Qwen/Qwen3-30B-A3B"
    (slos,) = parse_openslo(yaml.safe_dump(_slo(model_matcher=""))).values()  # no model said: the policy's own
    assert apply_imported(slos, base).model_name == "llama-70b"


def test_a_problem_names_its_document_as_a_field_path() -> None:
    """``document 1: spec...`` has a space: the API's field list showed every import problem as ``body``."""
    with pytest.raises(ValidationError) as caught:
        parse_openslo(yaml.safe_dump_all([_slo(), {**_slo(name="b"), "kind": "Service"}]))
    assert caught.value.problems == ("document[2].kind: only 'SLO' documents are imported, got 'Service'",)
    body = json.loads(bytes(error_problem(caught.value).body))
    assert [e["field"] for e in body["errors"]] == ["document[2].kind"]


def test_a_policy_problem_of_an_import_names_the_policy_and_its_field_as_a_request_body_would() -> None:
    """They read "policy 'chat-frontend' window: Value error, ...": pydantic's own prefix, and the field run into
    the policy's name."""
    doc = _slo()
    doc["spec"]["timeWindow"][0]["duration"] = "1h"
    with pytest.raises(ValidationError) as caught:
        _import(doc)
    (problem,) = caught.value.problems
    assert problem.startswith("policy 'chat-frontend': window: window '1h' must be between 50h and 366d"), problem
    doc = _slo(model_matcher="", annotations={"moeslo.io/model": "m", "moeslo.io/policy": "chat"})
    ratio = doc["spec"]["indicator"]["spec"]["ratioMetric"]
    ratio["good"]["metricSource"]["spec"]["query"] = ratio["good"]["metricSource"]["spec"]["query"].replace(
        'le="0.5"', 'le="7200"')
    with pytest.raises(ValidationError) as caught:
        _import(doc)
    assert caught.value.problems == ("policy 'chat': objectives.ttft.threshold_s: Input should be less than or equal "
                                     "to 3600",)  # fmt: skip


def _with_query(doc: dict[str, Any], part: str, query: str) -> dict[str, Any]:
    doc["spec"]["indicator"]["spec"]["ratioMetric"][part] = {"metricSource": {"type": "Prometheus",
                                                                              "spec": {"query": query}}}  # fmt: skip
    return doc


ITL_GOOD = 'sum(rate(vllm:inter_token_latency_seconds_bucket{model_name="Qwen/Qwen3-30B-A3B",le="0.5"}[5m]))'
TTFT_BAD = 'sum(rate(vllm:time_to_first_token_seconds_bucket{model_name="Qwen/Qwen3-30B-A3B",le="0.1"}[5m]))'
NORMALIZED_GOOD = ('sum(rate(moeslo_ttft_normalized_seconds_bucket{model_name="Qwen/Qwen3-30B-A3B",'
                   'reference_prompt_tokens="1000",per_1k_prompt_tokens_s="0.05",le="0.5"}[5m]))')


@pytest.mark.parametrize(
    ("doc", "start"),
    [
        # Good counted ITL gaps, total TTFT requests: imported as a TTFT objective, a ratio of two histograms.
        (_with_query(_slo(), "good", ITL_GOOD),
         "document[1].spec.indicator.spec.ratioMetric.total: counts vllm:time_to_first_token_seconds, but good "
         "counts vllm:inter_token_latency_seconds"),
        (_with_query(_slo(), "good", NORMALIZED_GOOD),
         "document[1].spec.indicator.spec.ratioMetric.total: counts vllm:time_to_first_token_seconds, but good "
         "counts moeslo_ttft_normalized_seconds"),
        (_slo(annotations={"moeslo.io/objective": "itl"}),
         "document[1].metadata.annotations.moeslo.io/objective: 'itl', but the queries count "
         "vllm:time_to_first_token_seconds (a ttft objective)"),
        # OpenSLO: target and targetPercent are mutually exclusive; one was silently dropped.
        (_slo(target=0.9, targetPercent=99.9),
         "document[1].spec.objectives[0]: target and targetPercent are mutually exclusive"),
        # OpenSLO: a ratio with good has no bad; bad was dropped and good/total read alone.
        (_with_query(_slo(), "bad", TTFT_BAD),
         "document[1].spec.indicator.spec.ratioMetric.bad: a ratio has good or bad, not both"),
    ],
)
def test_a_self_contradictory_document_is_refused_not_read_one_way(doc: dict[str, Any], start: str) -> None:
    (problem,) = _refusal(doc)
    assert problem.startswith(start), problem


SHORTHAND = re.compile(r"[0-9]+[mhdwMQY]")
"""OpenSLO v1's duration shorthand (timeWindow[].duration, timeSliceWindow): no seconds."""


def _exported(**spec: Any) -> tuple[Policy, list[dict[str, Any]]]:
    policy = Policy.model_validate({"name": "q", "target": {"kind": "model", "model": "m"}, **spec})
    return policy, list(yaml.safe_load_all(export_policy(policy)))


@pytest.mark.parametrize(
    ("spec", "window", "slice_window", "annotations"),
    [
        ({}, "30d", "5m", {}),
        ({"window": "2592000s", "objectives": {"imbalance": {"sustain_s": 45}}}, "30d", "1m",
         {"moeslo.io/sustain-s": "45"}),
        ({"window": "180001s", "objectives": {"imbalance": {"sustain_s": 0}}}, "3001m", "1m",
         {"moeslo.io/window-s": "180001", "moeslo.io/sustain-s": "0"}),
        ({"window": "720h", "objectives": {"imbalance": {"sustain_s": 7200}}}, "720h", "2h", {}),
    ],
)
def test_exported_durations_are_openslo_shorthand_and_import_back_exactly(
    spec: dict[str, Any], window: str, slice_window: str, annotations: dict[str, str]
) -> None:
    """``300s`` and ``2592000s`` were exported as written: OpenSLO has no seconds unit, so every export failed
    OpenSLO validation.  What is not whole minutes is rounded up, its seconds kept in an annotation."""
    policy, docs = _exported(**spec)
    assert [d["spec"]["timeWindow"][0]["duration"] for d in docs] == [window] * 3
    assert docs[2]["spec"]["objectives"][0]["timeSliceWindow"] == slice_window
    assert all(SHORTHAND.fullmatch(value) for value in (window, slice_window))
    kept = {key: value for key, value in docs[2]["metadata"]["annotations"].items() if key.endswith("-s")}
    assert kept == annotations
    (back,) = _import(*docs).values()
    assert parse_duration_s(back.window) == parse_duration_s(policy.window)
    assert back.objectives == policy.objectives


def test_a_time_slice_window_is_read_in_minutes_when_a_bare_number_and_an_annotation_must_agree_with_it() -> None:
    _policy, docs = _exported(objectives={"imbalance": {"sustain_s": 45}})
    docs[2]["spec"]["objectives"][0]["timeSliceWindow"] = "2m"  # edited: the kept 45 s no longer rounds to it
    (problem,) = _refusal(docs[2])
    assert problem.startswith("document[1].metadata.annotations.moeslo.io/sustain-s: 45 s does not round up to "
                              "'2m'"), problem  # fmt: skip
    del docs[2]["metadata"]["annotations"]["moeslo.io/sustain-s"]
    for value, sustain_s in ((5, 300), ("300s", 300), ("2m", 120)):  # the numeric form, and older exports' seconds
        docs[2]["spec"]["objectives"][0]["timeSliceWindow"] = value
        (back,) = _import(*docs).values()
        assert back.objectives.imbalance.sustain_s == sustain_s
