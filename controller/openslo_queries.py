"""What the OpenSLO import reads from an SLO's PromQL queries: the objective (by the metric), the model (the
``model_name`` matcher), the threshold (the good query's ``le`` matcher) and a TTFT allowance (its labels).

Any other matcher would be dropped: the controller counts every series of the model, so an SLO on one engine's
or one role's requests would be read as an SLO on all of them.  Such a matcher is refused, naming it, as is an
operator other than ``=`` on the labels read (``model_name!="x"`` is not the model ``x``).
"""

from __future__ import annotations

import math
import re
from typing import Any

from contracts.catalogue import (
    ITL_HISTOGRAM,
    LAYER_IMBALANCE_CV,
    PER_1K_PROMPT_TOKENS_LABEL,
    REFERENCE_PROMPT_TOKENS_LABEL,
    TTFT_HISTOGRAM,
    TTFT_NORMALIZED_HISTOGRAM,
)
from contracts.errors import ValidationError

HISTOGRAMS = {"ttft": TTFT_HISTOGRAM, "itl": ITL_HISTOGRAM}
OBJECTIVE_ANNOTATION = "moeslo.io/objective"
_MATCHER = re.compile(
    r"(?<![A-Za-z0-9_:])([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"
    r"""(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|`([^`]*)`)"""
)
"""A PromQL label matcher, its label starting at a word's start (``cycle="2"`` is no ``le`` matcher), its value
double-quoted, single-quoted or backquoted (a raw string, without escapes), as PromQL accepts all three."""
_ALLOWANCE_LABELS = (REFERENCE_PROMPT_TOKENS_LABEL, PER_1K_PROMPT_TOKENS_LABEL)


def indicator_queries(indicator_spec: dict[str, Any]) -> dict[str, str]:
    """The PromQL queries of an indicator, by part: good, bad, total (a ratio) or threshold."""
    found: dict[str, str] = {}
    ratio = indicator_spec.get("ratioMetric")
    if isinstance(ratio, dict):
        for part in ("good", "bad", "total"):
            query = ((ratio.get(part) or {}).get("metricSource") or {}).get("spec", {}).get("query")
            if isinstance(query, str):
                found[part] = query
    threshold = indicator_spec.get("thresholdMetric")
    if isinstance(threshold, dict):
        query = (threshold.get("metricSource") or {}).get("spec", {}).get("query")
        if isinstance(query, str):
            found["threshold"] = query
    return found


def _field(part: str) -> str:
    return "thresholdMetric" if part == "threshold" else f"ratioMetric.{part}"


def matchers(query: str) -> list[tuple[str, str, str]]:
    """The query's label matchers as (label, operator, value), the value's escapes undone."""
    return [
        (label, op, re.sub(r"\\(.)", r"\1", double or single) if backquoted == "" else backquoted)
        for label, op, double, single, backquoted in _MATCHER.findall(query)
    ]


def query_models(queries: dict[str, str]) -> set[str]:
    """The models the queries' ``model_name`` matchers name."""
    found = (matcher for query in queries.values() for matcher in matchers(query))
    return {value for label, op, value in found if (label, op) == ("model_name", "=")}


_OBJECTIVE_OF = {TTFT_NORMALIZED_HISTOGRAM: "ttft", TTFT_HISTOGRAM: "ttft", ITL_HISTOGRAM: "itl",
                 LAYER_IMBALANCE_CV: "imbalance"}  # fmt: skip
"""The series the controller reads, by the objective it reads them for."""


def _series(query: str) -> list[str]:
    return [metric for metric in _OBJECTIVE_OF if metric in query]


def objective_from_queries(queries: dict[str, str], annotated: str | None, where: str) -> str | None:
    """The objective of an SLO (``where``: its document): the one its queries' series are read for, else its
    :data:`OBJECTIVE_ANNOTATION` (``annotated``).  A ratio whose good and total count different histograms, or an
    annotation naming another objective than the queries count, is refused: either reading drops half of it."""
    good, total = _series(queries.get("good", "")), _series(queries.get("total", ""))
    if "good" in queries and "total" in queries and (good or total) and (good != total or len(good) > 1):
        said = {part: " and ".join(series) or "no histogram moeslo reads" for part, series in (("good", good),
                                                                                              ("total", total))}
        raise ValidationError(f"{where}.spec.indicator.spec.ratioMetric.total: counts {said['total']}, but good "
                              f"counts {said['good']}; good and total must count one histogram")  # fmt: skip
    found = [metric for query in queries.values() for metric in _series(query)]
    objective = _OBJECTIVE_OF[found[0]] if found else None
    if annotated and objective and annotated != objective:
        raise ValidationError(f"{where}.metadata.annotations.{OBJECTIVE_ANNOTATION}: {annotated!r}, but the queries "
                              f"count {found[0]} (a {objective} objective)")
    return annotated or objective


def check_matchers(queries: dict[str, str], objective: str, where: str) -> None:
    """Refuse a matcher the controller would not read (``where``: the indicator's spec)."""
    for part, query in queries.items():
        if part == "bad":  # a bad/total ratio is refused as such (le_threshold)
            continue
        for label, op, value in matchers(query):
            read = label == "model_name" or (objective == "ttft" and label in _ALLOWANCE_LABELS)
            if label == "le":  # the good query's threshold; a total over the +Inf bucket counts every request
                read = part == "good" or (part == "total" and value == "+Inf")
            if read and op == "=":
                continue
            allowance = f", {'= and '.join(_ALLOWANCE_LABELS)}= (a TTFT allowance)" if objective == "ttft" else ""
            raise ValidationError(
                f'{where}.{_field(part)}: the matcher {label}{op}"{value[:60]}" is not read; only model_name=, le= '
                f"(the good query's threshold){allowance} are (the controller counts every other series of the "
                "model)"
            )


def le_threshold(queries: dict[str, str], where: str) -> float:
    """The threshold of a good/total ratio: the ``le`` matcher of its good query (``where``: the SLO's spec)."""
    if "good" in queries and "bad" in queries:  # OpenSLO: "if good is defined then bad must not be set"
        raise ValidationError(f"{where}.indicator.spec.ratioMetric.bad: a ratio has good or bad, not both; give good "
                              'and total (the good query\'s le="<seconds>" bucket is the threshold)')  # fmt: skip
    if "good" not in queries and "bad" in queries:
        raise ValidationError(f"{where}.indicator.spec.ratioMetric.bad: bad/total ratios are not supported; give "
                              'good (the requests in the le="<seconds>" bucket) and total')  # fmt: skip
    threshold: float | None = None
    le = [value for label, _op, value in matchers(queries.get("good", "")) if label == "le"]
    if len(le) == 1:
        try:
            threshold = float(le[0])
        except ValueError:
            threshold = None
    if threshold is None or not math.isfinite(threshold) or threshold <= 0:
        raise ValidationError(
            f'{where}.indicator.spec.ratioMetric.good: needs one le="<seconds>" matcher naming the threshold'
        )
    return threshold
