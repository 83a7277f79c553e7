"""The Alertmanager configuration that goes with the generated rules (pure data).

Pages go to the paging receiver, tickets to the ticket receiver; alerts are
grouped per SLO (``policy`` + ``slo``), and a firing page silences the ticket
of the same SLO, so one incident notifies once, at its highest severity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.errors import ValidationError
from contracts.urls import http_url_problem

PAGE_RECEIVER = "moeslo-page"
TICKET_RECEIVER = "moeslo-ticket"
GROUP_BY = ("policy", "slo")


@dataclass(frozen=True, kw_only=True, slots=True)
class ReceiverOptions:
    """Where notifications go; webhook URLs are placeholders to replace per installation."""

    page_webhook_url: str = "http://moeslo-alert-receiver.moeslo.svc:8080/page"
    ticket_webhook_url: str = "http://moeslo-alert-receiver.moeslo.svc:8080/ticket"
    group_wait: str = "30s"
    group_interval: str = "5m"
    page_repeat_interval: str = "1h"
    ticket_repeat_interval: str = "12h"
    resolve_timeout: str = "5m"

    def __post_init__(self) -> None:
        urls = (("page_webhook_url", self.page_webhook_url), ("ticket_webhook_url", self.ticket_webhook_url))
        bad = [problem for name, url in urls if (problem := http_url_problem(name, url)) is not None]
        if bad:
            raise ValidationError(bad)  # Alertmanager would refuse the file at load


def build_alertmanager_config(options: ReceiverOptions | None = None) -> dict[str, Any]:
    """An Alertmanager 0.25 configuration as a mapping (render with YAML)."""
    options = options or ReceiverOptions()
    return {
        "global": {"resolve_timeout": options.resolve_timeout},
        "route": {
            # Alerts with neither severity (none are generated) still reach someone.
            "receiver": TICKET_RECEIVER,
            "group_by": list(GROUP_BY),
            "group_wait": options.group_wait,
            "group_interval": options.group_interval,
            "repeat_interval": options.ticket_repeat_interval,
            "routes": [
                {
                    "receiver": PAGE_RECEIVER,
                    "matchers": ['severity="page"'],
                    "repeat_interval": options.page_repeat_interval,
                },
                {"receiver": TICKET_RECEIVER, "matchers": ['severity="ticket"']},
            ],
        },
        "inhibit_rules": [
            {
                "source_matchers": ['severity="page"'],
                "target_matchers": ['severity="ticket"'],
                "equal": list(GROUP_BY),
            }
        ],
        "receivers": [
            {
                "name": PAGE_RECEIVER,
                "webhook_configs": [{"url": options.page_webhook_url, "send_resolved": True}],
            },
            {
                "name": TICKET_RECEIVER,
                "webhook_configs": [{"url": options.ticket_webhook_url, "send_resolved": True}],
            },
        ],
    }


__all__ = ["GROUP_BY", "PAGE_RECEIVER", "TICKET_RECEIVER", "ReceiverOptions", "build_alertmanager_config"]
