"""OpenSLO v1 import and export of a policy's SLO part.

Export writes one ``kind: SLO`` document per objective, its ``service`` the
policy's name and its names within 63 characters (a long policy name is cut
and hashed; the annotations below name the policy whole):

- TTFT and ITL as ``ratioMetric`` SLOs (good = requests in the histogram
  bucket whose upper edge is the threshold, total = all requests),
  ``budgetingMethod: Occurrences``, over the policy's rolling window.  A TTFT
  objective with a long-prompt allowance counts from
  ``moeslo_ttft_normalized_seconds`` with the allowance's label matchers
  (``reference_prompt_tokens``, ``per_1k_prompt_tokens_s``), which import
  reads back; the flat one from ``vllm:time_to_first_token_seconds``;
- expert imbalance as a ``thresholdMetric`` SLO (``op: lte``,
  ``value: max_cv``) with ``budgetingMethod: Timeslices`` and
  ``timeSliceWindow`` = ``sustain_s``.  OpenSLO needs a ``target`` there;
  moeslo acts on sustained violations instead, so the exported ``target``
  (0.99) is informational and ignored on import.

Durations are OpenSLO's shorthand, which has no seconds: a window or ``sustain_s`` that is no whole number of
minutes is rounded up, its seconds kept in ``moeslo.io/window-s`` / ``moeslo.io/sustain-s``, which import reads
first (if the duration is their rounding); a bare number ``timeSliceWindow`` is minutes.

Import reads such documents back (ours or hand-written ones): the policy is
named by the ``moeslo.io/policy`` annotation (else the SLO's ``service``),
the objective by the histogram its good and total queries both count (else by ``moeslo.io/objective``; one
naming another objective is refused),
the threshold by the ``le`` matcher of the good query (:mod:`controller.openslo_queries`; a matcher on
any other label, or with another operator than ``=``, is refused: the controller would count the series it
leaves out).  A new policy watches
the model of the queries' ``model_name="..."`` matcher, else of the ``moeslo.io/model`` annotation (never the
``service``, which names a service, not a model); without either, or with both naming different models, it is
refused.  What moeslo would read otherwise
than the document means is refused by field: a budgeting method other than the
one above (or none: OpenSLO requires it), a bad/total ratio (or bad beside good), both ``target`` and
``targetPercent``, an ``op`` or a
``value`` other than the ``le`` threshold on a ratio objective, a calendar
window (a ``calendar`` without ``isRolling: true`` is calendar-aligned).  Every
problem of every document is reported at once.  YAML aliases (``*name``) are refused
as the text is read, and a refused value is shown cut short (:mod:`controller.client_yaml`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import yaml
from pydantic import ValidationError as PydanticValidationError

from contracts.catalogue import (
    LAYER_IMBALANCE_CV,
    TTFT_HISTOGRAM,
    TTFT_NORMALIZED_HISTOGRAM,
    format_le,
)
from contracts.errors import ValidationError
from controller.client_yaml import load_documents, shown
from controller.openslo_queries import (
    HISTOGRAMS,
    OBJECTIVE_ANNOTATION,
    check_matchers,
    indicator_queries,
    le_threshold,
    matchers,
    objective_from_queries,
    query_models,
)
from controller.policy import LatencyObjective, Policy, TtftObjective, parse_duration_s
from controller.ttft_series import allowance_from_labels, ttft_matchers, ttft_metric

API_VERSION = "openslo/v1"
POLICY_ANNOTATION = "moeslo.io/policy"
MODEL_ANNOTATION = "moeslo.io/model"
WINDOW_ANNOTATION, SUSTAIN_ANNOTATION = "moeslo.io/window-s", "moeslo.io/sustain-s"
"""The exact seconds of a window or ``sustain_s`` that OpenSLO's minutes round up (import reads them first)."""
IMBALANCE_TARGET_INFORMATIONAL = 0.99
MAX_NAME_LENGTH = 63
"""OpenSLO names (``metadata.name``) are DNS labels, as Kubernetes object names: at most 63 characters."""



def _selector(model: str, extra: str = "") -> str:
    escaped = model.replace("\\", "\\\\").replace('"', '\\"')
    return f'model_name="{escaped}"' + (f",{extra}" if extra else "")


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
"""What OpenSLO takes as ``metadata.name``: an RFC 1123 label (its length is checked apart)."""


def _label_value(text: str) -> str:
    """A policy name from a service's (never cut short: a name over 63 characters is refused, not shortened);
    empty where the service has no letter or digit."""
    return re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")


def _object_name(policy: str, suffix: str) -> str:
    """``<policy>-<suffix>`` within :data:`MAX_NAME_LENGTH`: a long policy name is cut, and a hash of it keeps
    the names of two policies that share the first characters apart."""
    name = f"{policy}-{suffix}"
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(policy.encode()).hexdigest()[:8]
    return f"{policy[:MAX_NAME_LENGTH - len(suffix) - 10].rstrip('-')}-{digest}-{suffix}"


def _shorthand(seconds: int) -> str:
    """``seconds`` in OpenSLO's duration shorthand (it has no seconds unit): whole minutes, rounded up, at least 1."""
    minutes = max(1, -(-seconds // 60))
    unit, size = next((unit, size) for unit, size in (("d", 1440), ("h", 60), ("m", 1)) if minutes % size == 0)
    return f"{minutes // size}{unit}"


def _exported_duration(spelled: str, annotations: dict[str, str], key: str) -> str:
    """A duration as OpenSLO reads it: as spelled unless in seconds; where the shorthand is not exact, the seconds
    are kept in ``annotations[key]``."""
    seconds = parse_duration_s(spelled)
    shorthand = spelled if spelled[-1] in "mhdw" else _shorthand(seconds)
    if parse_duration_s(shorthand) != seconds:
        annotations[key] = str(seconds)
    return shorthand


def export_policy(policy: Policy) -> str:
    """The policy's SLOs as a multi-document OpenSLO v1 YAML string."""
    docs = [_latency_slo(policy, "ttft", policy.objectives.ttft), _latency_slo(policy, "itl", policy.objectives.itl),
            _imbalance_slo(policy)]
    return yaml.safe_dump_all(docs, sort_keys=False)


def _slo(policy: Policy, key: str, display_name: str, indicator: dict[str, Any], budgeting: str,
         objective: dict[str, Any]) -> dict[str, Any]:
    """One OpenSLO v1 SLO document of ``policy`` (``key``: ttft, itl or imbalance)."""
    annotations = {POLICY_ANNOTATION: policy.name, OBJECTIVE_ANNOTATION: key}
    window = _exported_duration(policy.window, annotations, WINDOW_ANNOTATION)
    return {
        "apiVersion": API_VERSION,
        "kind": "SLO",
        "metadata": {"name": _object_name(policy.name, key), "displayName": display_name, "annotations": annotations},
        "spec": {
            "description": policy.description,
            "service": policy.name,  # a Service's name (a DNS label); the model is in the queries
            "indicator": indicator,
            "timeWindow": [{"duration": window, "isRolling": True}],
            "budgetingMethod": budgeting,
            "objectives": [objective],
        },
    }


def _latency_slo(policy: Policy, key: str, objective: LatencyObjective) -> dict[str, Any]:
    """A good-ratio SLO: requests (TTFT) or gaps (ITL) within the threshold, from the histogram's buckets."""
    metric, extra = HISTOGRAMS[key], ""
    if isinstance(objective, TtftObjective):
        metric, extra = ttft_metric(objective.allowance), ttft_matchers(objective.allowance)
    selector = _selector(policy.model_name, extra)
    good = f'sum(rate({metric}_bucket{{{selector},le="{format_le(objective.threshold_s)}"}}[5m]))'
    total = f"sum(rate({metric}_count{{{selector}}}[5m]))"
    indicator = {
        "metadata": {"name": _object_name(policy.name, f"{key}-good-ratio")},
        "spec": {
            "ratioMetric": {
                "counter": True,
                "good": {"metricSource": {"type": "Prometheus", "spec": {"query": good}}},
                "total": {"metricSource": {"type": "Prometheus", "spec": {"query": total}}},
            }
        },
    }
    display = f"{key.upper()} <= {objective.threshold_s * 1000:g} ms for {objective.target:.4%} of requests"
    if isinstance(objective, TtftObjective) and not objective.allowance.flat:
        display += (f" (+{objective.per_1k_prompt_tokens_s * 1000:g} ms per 1k prompt tokens beyond "
                    f"{objective.reference_prompt_tokens})")  # fmt: skip
    return _slo(policy, key, display, indicator, "Occurrences",
                {"displayName": f"{key} good ratio", "target": objective.target})


def _imbalance_slo(policy: Policy) -> dict[str, Any]:
    """A threshold SLO on the worst layer's CV, over time slices of the policy's ``sustain_s``."""
    imbalance = policy.objectives.imbalance
    query = f"max({LAYER_IMBALANCE_CV}{{{_selector(policy.model_name)}}})"
    indicator = {
        "metadata": {"name": _object_name(policy.name, "imbalance-cv")},
        "spec": {"thresholdMetric": {"metricSource": {"type": "Prometheus", "spec": {"query": query}}}},
    }
    objective = {
        "displayName": "imbalance CV",
        "op": "lte",
        "value": imbalance.max_cv,
        "target": IMBALANCE_TARGET_INFORMATIONAL,
        "timeSliceTarget": IMBALANCE_TARGET_INFORMATIONAL,
    }
    doc = _slo(policy, "imbalance", f"expert imbalance CV <= {imbalance.max_cv:g}", indicator, "Timeslices",
               objective)
    objective["timeSliceWindow"] = _exported_duration(f"{imbalance.sustain_s}s", doc["metadata"]["annotations"],
                                                      SUSTAIN_ANNOTATION)  # fmt: skip
    return doc


@dataclass
class ImportedSlos:
    """The SLO part of one policy, as read from OpenSLO documents."""

    policy: str
    model: str | None = None
    """The ``model_name`` the SLIs count (a new policy watches it); None when no document names one."""
    model_field: str = ""
    """Where :attr:`model` was first read (an annotation, or the queries), for a message that refuses it."""
    objectives: dict[str, dict[str, Any]] = field(default_factory=dict)
    window: str | None = None
    description: str | None = None


def parse_openslo(text: str) -> dict[str, ImportedSlos]:
    """OpenSLO v1 SLO documents grouped by policy name; :class:`ValidationError` lists every problem."""
    problems: list[str] = []
    documents = load_documents(text)
    if len(documents) == 1 and isinstance(documents[0], list):
        documents = documents[0]  # a JSON array of documents (``moeslo policy get --openslo --json``)
    if not documents:
        raise ValidationError("body: no OpenSLO documents")
    result: dict[str, ImportedSlos] = {}
    names: dict[str, int] = {}
    for index, doc in enumerate(documents, start=1):
        where = f"document[{index}]"
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None  # a malformed one is refused below
        if isinstance(name, str) and name in names:  # two SLOs of one name: the later would replace the earlier
            problems.append(f"{where}.metadata.name: {name!r} is used by document[{names[name]}] too")
            continue
        if isinstance(name, str):
            names[name] = index
        try:
            _read_document(doc, where, result)
        except ValidationError as exc:
            problems.extend(exc.problems)
        except (AttributeError, TypeError, OverflowError, RecursionError) as exc:
            # A part of the document of the wrong shape where a mapping or a number belongs (the readers above
            # name the common cases; this catches the rest): still the client's document, never a 500.
            problems.append(f"{where}: malformed OpenSLO SLO ({type(exc).__name__}: {exc})")
    if problems:
        raise ValidationError(problems)
    return result


def _text(mapping: dict[str, Any], key: str, where: str) -> str | None:
    """A string field, or None when absent: anything else is refused by its type, never rendered with ``str()``
    (a structure as large as the request would be a message as large)."""
    value = mapping.get(key)
    if value is None or isinstance(value, str):
        return value
    raise ValidationError(f"{where}.{key}: must be a string, got {type(value).__name__}")


def _need(mapping: Any, key: str, where: str, kind: type | tuple[type, ...] = dict) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise ValidationError(f"{where}.{key}: required")
    value = mapping[key]
    if not isinstance(value, kind):
        raise ValidationError(f"{where}.{key}: wrong type {type(value).__name__}")
    return value


SLO_SPEC_FIELDS = frozenset(
    ("description", "service", "indicator", "indicatorRef", "timeWindow", "budgetingMethod", "objectives",
     "alertPolicies")
)
"""The fields of an OpenSLO v1 ``SLO`` spec; any other is refused by name."""


def _read_document(doc: Any, where: str, result: dict[str, ImportedSlos]) -> None:
    if not isinstance(doc, dict):
        raise ValidationError(f"{where}: must be a mapping")
    if doc.get("apiVersion") != API_VERSION:
        raise ValidationError(f"{where}.apiVersion: must be {API_VERSION!r}, got {shown(doc.get('apiVersion'))}")
    if doc.get("kind") != "SLO":
        raise ValidationError(f"{where}.kind: only 'SLO' documents are imported, got {shown(doc.get('kind'))}")
    metadata = _need(doc, "metadata", where)
    spec = _need(doc, "spec", where)
    unknown = sorted(str(key) for key in spec if key not in SLO_SPEC_FIELDS)
    if unknown:  # a misspelt field would otherwise be dropped without a word
        raise ValidationError(f"{where}.spec.{unknown[0]}: not an OpenSLO v1 SLO field "
                              f"(known: {', '.join(sorted(SLO_SPEC_FIELDS))})")  # fmt: skip
    annotations = metadata.get("annotations") or {}
    service = _text(spec, "service", f"{where}.spec") or ""
    name = _text(metadata, "name", f"{where}.metadata") or ""
    if len(name) > MAX_NAME_LENGTH:
        raise ValidationError(f"{where}.metadata.name: {len(name)} characters; OpenSLO names are at most "
                              f"{MAX_NAME_LENGTH}")  # fmt: skip
    if not _DNS_LABEL.fullmatch(name):  # required by OpenSLO; without it, a policy was called "slo"
        raise ValidationError(f"{where}.metadata.name: {name!r} is not an OpenSLO name (required: lowercase "
                              f"letters, digits and '-', a letter or digit at each end)")
    annotated = f"{where}.metadata.annotations"
    policy_name = _text(annotations, POLICY_ANNOTATION, annotated) or _label_value(service) or name
    indicator_spec = _need(_need(spec, "indicator", f"{where}.spec"), "spec", f"{where}.spec.indicator")
    queries = indicator_queries(indicator_spec)
    objective = objective_from_queries(queries, _text(annotations, OBJECTIVE_ANNOTATION, annotated), where)
    if objective not in ("ttft", "itl", "imbalance"):
        raise ValidationError(
            f"{where}: cannot tell the objective; annotate {OBJECTIVE_ANNOTATION} with ttft, itl or imbalance"
        )
    _budgeting(spec, objective, f"{where}.spec")
    check_matchers(queries, objective, f"{where}.spec.indicator.spec")
    objectives = _need(spec, "objectives", f"{where}.spec", list)
    if len(objectives) != 1 or not isinstance(objectives[0], dict):
        raise ValidationError(f"{where}.spec.objectives: exactly one objective per SLO is supported")
    entry = objectives[0]
    slos = result.setdefault(policy_name, ImportedSlos(policy=policy_name))
    annotated_model = _text(annotations, MODEL_ANNOTATION, annotated)
    slos.model = _model(annotated_model, queries, where, slos.model)
    if slos.model is not None and not slos.model_field:
        slos.model_field = f"{where}." + (f"metadata.annotations.{MODEL_ANNOTATION}" if annotated_model
                                          else "spec.indicator.spec")  # fmt: skip
    if objective in slos.objectives:
        raise ValidationError(f"{where}: a second {objective} SLO for policy {policy_name!r}")
    if objective == "imbalance":
        slos.objectives[objective] = _imbalance(entry, annotations, where)
    else:
        slos.objectives[objective] = _latency(entry, queries, f"{where}.spec")
    slos.window = _window(spec, annotations, where, slos.window)
    description = _text(spec, "description", f"{where}.spec")
    if description:
        slos.description = description


def _model(annotated: str | None, queries: dict[str, str], where: str, previous: str | None) -> str | None:
    """The model an SLO counts: the ``model_name`` matcher of its queries (one model), else its annotation; an
    annotation naming another is refused (the policy would watch one model, its SLIs count another)."""
    found = query_models(queries)
    if annotated and found and found != {annotated}:
        raise ValidationError(f"{where}.metadata.annotations.{MODEL_ANNOTATION}: {annotated!r}, but the queries "
                              f"count model_name {', '.join(map(repr, sorted(found)))}; make them one")  # fmt: skip
    if annotated:
        found = {annotated}
    elif len(found) > 1:
        raise ValidationError(f"{where}: the queries name several models ({', '.join(map(repr, sorted(found)))}); "
                              f"annotate {MODEL_ANNOTATION}")  # fmt: skip
    model = next(iter(found), None)
    if previous is not None and model is not None and model != previous:
        raise ValidationError(f"{where}: model {model!r} differs from {previous!r} of the policy's other SLOs")
    return model or previous


def _target(entry: dict[str, Any], where: str) -> float:
    if "target" in entry and "targetPercent" in entry:  # OpenSLO: mutually exclusive; one would be dropped
        raise ValidationError(f"{where}: target and targetPercent are mutually exclusive; give one")
    if "target" in entry:
        value = entry["target"]
    elif "targetPercent" in entry:
        percent = entry["targetPercent"]
        # bool is an int to Python: ``targetPercent: true`` would read as 1 %.
        # In decimal, so 99.9 % is 0.999 (not the float quotient 0.9990000000000001).
        value = (float(Decimal(str(percent)) / 100) if isinstance(percent, (int, float))
                 and not isinstance(percent, bool) else percent)  # fmt: skip
    else:
        raise ValidationError(f"{where}.target: required")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValidationError(f"{where}.target: must be a number in (0, 1), got {shown(value)}")
    return float(value)


def _budgeting(spec: dict[str, Any], objective: str, where: str) -> None:
    """The budgeting method moeslo reads an objective's SLO with: any other would be read as this one."""
    method = _text(spec, "budgetingMethod", where)
    expected = "Timeslices" if objective == "imbalance" else "Occurrences"
    if method != expected:
        said = "required" if method is None else f"{method!r} is not supported"
        raise ValidationError(f"{where}.budgetingMethod: {said}; a {objective} SLO is imported with {expected} only")


def _latency(entry: dict[str, Any], queries: dict[str, str], where: str) -> dict[str, Any]:
    target = _target(entry, f"{where}.objectives[0]")
    threshold = le_threshold(queries, where)
    if "op" in entry:
        raise ValidationError(f"{where}.objectives[0].op: a ratioMetric objective has none (op and value compare "
                              "a thresholdMetric; here the threshold is the good query's le matcher)")  # fmt: skip
    value = entry.get("value")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value != threshold):
        raise ValidationError(f"{where}.objectives[0].value: {shown(value)} is not the good query's "
                              f"le=\"{threshold:g}\" (a ratioMetric SLO's threshold is its le matcher; value "
                              "belongs to thresholdMetric objectives)")  # fmt: skip
    out: dict[str, Any] = {"threshold_s": threshold, "target": target}
    good = queries.get("good", "")
    if TTFT_NORMALIZED_HISTOGRAM in good:
        allowance = allowance_from_labels({label: value for label, _op, value in matchers(good)})
        if allowance is None:
            raise ValidationError(
                f"{where}.indicator.spec.ratioMetric.good: {TTFT_NORMALIZED_HISTOGRAM} needs "
                'reference_prompt_tokens="<tokens>" and per_1k_prompt_tokens_s="<seconds>" matchers'
            )
        out |= {"reference_prompt_tokens": allowance.reference_prompt_tokens,
                "per_1k_prompt_tokens_s": allowance.per_1k_prompt_tokens_s}  # fmt: skip
    elif TTFT_HISTOGRAM in good:
        out["per_1k_prompt_tokens_s"] = 0.0  # the flat objective, whatever the policy had before
    return out


def _imbalance(entry: dict[str, Any], annotations: dict[str, Any], document: str) -> dict[str, Any]:
    where = f"{document}.spec.objectives[0]"
    if entry.get("op", "lte") not in ("lte", "lt"):
        raise ValidationError(f"{where}.op: imbalance objectives must be lte, got {shown(entry.get('op'))}")
    value = entry.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 10:
        raise ValidationError(f"{where}.value: must be a CV in (0, 10], got {shown(value)}")
    out: dict[str, Any] = {"max_cv": float(value)}
    slice_window = entry.get("timeSliceWindow")
    if isinstance(slice_window, int) and not isinstance(slice_window, bool):
        slice_window = f"{slice_window}m"  # OpenSLO's numeric form counts minutes
    else:
        slice_window = _text(entry, "timeSliceWindow", where)
    if slice_window is not None:
        try:
            parse_duration_s(slice_window)
        except ValueError as exc:
            raise ValidationError(f"{where}.timeSliceWindow: {exc}") from exc
    sustain = _kept_seconds(annotations, SUSTAIN_ANNOTATION, slice_window, document)
    return out if sustain is None else out | {"sustain_s": parse_duration_s(sustain)}


def _kept_seconds(annotations: dict[str, Any], key: str, duration: str | None, document: str) -> str | None:
    """``duration``, or the exact seconds ``annotations[key]`` keeps of it where export rounded them up to
    OpenSLO's minutes.  One the duration is not the rounding of (the duration edited since) is refused."""
    kept = annotations.get(key)
    if kept is None:
        return duration
    where = f"{document}.metadata.annotations.{key}"
    if not isinstance(kept, str) or not re.fullmatch(r"[0-9]{1,9}", kept):
        raise ValidationError(f"{where}: must be a whole number of seconds (a string), got {shown(kept)}")
    if duration is None or parse_duration_s(_shorthand(int(kept))) != parse_duration_s(duration):
        raise ValidationError(f"{where}: {kept} s does not round up to {duration!r} (OpenSLO's whole minutes); "
                              "drop the annotation or make them agree")  # fmt: skip
    return f"{int(kept)}s"


def _window(spec: dict[str, Any], annotations: dict[str, Any], document: str, previous: str | None) -> str | None:
    where, windows = f"{document}.spec", spec.get("timeWindow")
    if windows is None:
        return previous
    if not isinstance(windows, list) or len(windows) != 1 or not isinstance(windows[0], dict):
        raise ValidationError(f"{where}.timeWindow: exactly one window is supported")
    duration = _text(windows[0], "duration", f"{where}.timeWindow[0]")
    # OpenSLO: isRolling, when omitted, is false where a calendar is given (a calendar-aligned window).
    if windows[0].get("isRolling", "calendar" not in windows[0]) is not True:
        raise ValidationError(f"{where}.timeWindow[0].isRolling: only rolling windows are supported"
                              + (" (a window with a calendar is calendar-aligned unless isRolling: true)"
                                 if "calendar" in windows[0] else ""))  # fmt: skip
    try:
        parse_duration_s(str(duration))
    except ValueError as exc:
        raise ValidationError(f"{where}.timeWindow[0].duration: {exc}") from exc
    window = _kept_seconds(annotations, WINDOW_ANNOTATION, str(duration), document)
    if previous is not None and previous != window:
        raise ValidationError(f"{where}.timeWindow[0].duration: {window!r} differs from {previous!r}")
    return window


def apply_imported(slos: ImportedSlos, base: Policy | None) -> Policy:
    """A policy with the imported SLO part over ``base`` (or a new model-name policy)."""
    if base is None and slos.model is None:
        raise ValidationError(
            f"policy {slos.policy!r}: cannot tell which model a new policy watches; give the SLI queries a "
            f'model_name="<model>" matcher or annotate {MODEL_ANNOTATION}'
        )
    if base is not None and slos.model is not None and slos.model != base.model_name:
        # The documents' SLIs count another model than the one the policy watches: SLOs written for one model
        # would be enforced on another.
        raise ValidationError(
            f"{slos.model_field}: model {slos.model!r}, but policy {slos.policy!r} watches {base.model_name!r}; "
            "import under another policy name, or change the policy's target first (PUT or PATCH)"
        )
    spec: dict[str, Any] = (
        base.model_dump(mode="json")
        if base is not None
        else {"name": slos.policy, "target": {"kind": "model", "model": slos.model}}
    )
    objectives = dict(spec.get("objectives") or {})
    for key, values in slos.objectives.items():
        objectives[key] = {**(objectives.get(key) or {}), **values}
    spec["objectives"] = objectives
    if slos.window is not None:
        spec["window"] = slos.window
    if slos.description is not None:
        spec["description"] = slos.description
    try:
        return Policy.model_validate(spec)
    except PydanticValidationError as exc:
        from controller.api.errors import validation_problems  # the fields and words a request body's 422 has

        problems = validation_problems(exc.errors())
        raise ValidationError([f"policy {slos.policy!r}: {p.field}: {p.message}" for p in problems]) from exc
