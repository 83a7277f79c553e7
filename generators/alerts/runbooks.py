"""``runbook_url`` annotations: each alert links to its section of the runbooks (docs/runbooks.md).

Alertmanager's templates, Grafana's alert list and most paging tools show a ``runbook_url``
annotation as a link; the kube-prometheus rules carry one on every alert.  The runbooks live
where the user publishes them (a wiki, a Git host, an internal docs site), so the generator takes
the page's URL and adds each alert's section as the fragment, spelt as Markdown renderers spell
a heading's anchor (lower case; the three metric-absent alerts share one section).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from urllib.parse import urlsplit

from contracts.errors import ValidationError
from generators.alerts.model import AlertingRule, RuleGroup

_ABSENT_ALERTS = ("MoesloTTFTMetricAbsent", "MoesloITLMetricAbsent", "MoesloExpertMetricsAbsent")
_SECTION_HEADINGS = {alert: ", ".join(_ABSENT_ALERTS) for alert in _ABSENT_ALERTS}
"""Alerts whose runbook section's heading is not the alert's own name."""


def heading_anchor(heading: str) -> str:
    """A Markdown heading's anchor as GitHub, GitLab and mkdocs write it: lower case, spaces to
    hyphens, punctuation other than hyphens and underscores dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_anchor(alert: str) -> str:
    """The anchor of ``alert``'s section of the runbooks."""
    return heading_anchor(_SECTION_HEADINGS.get(alert, alert))


def _check_runbook_url(url: str) -> None:
    """ValidationError unless ``url`` is an absolute http(s) URL without a fragment (each alert adds its own)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValidationError([f"runbook URL: expected an absolute http(s) URL, got {url!r}"])
    if parts.fragment or url.endswith("#"):
        raise ValidationError([f"runbook URL: {url!r} has a fragment; give the page, each alert adds its section"])


def with_runbook_urls(groups: Sequence[RuleGroup], url: str) -> tuple[RuleGroup, ...]:
    """``groups`` with a ``runbook_url`` annotation, ``url#<section>``, on every alert."""
    _check_runbook_url(url)

    def linked(rule: AlertingRule) -> AlertingRule:
        return replace(rule, annotations={**rule.annotations, "runbook_url": f"{url}#{runbook_anchor(rule.alert)}"})

    return tuple(
        replace(group, rules=tuple(linked(r) if isinstance(r, AlertingRule) else r for r in group.rules))
        for group in groups
    )


__all__ = ["heading_anchor", "runbook_anchor", "with_runbook_urls"]
