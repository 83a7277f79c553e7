"""The status page's routes: ``/ui/`` (every policy) and ``/ui/policies/{name}`` (one), read-only.

HTML rendered on the server (SVG charts, no JavaScript, nothing fetched from elsewhere),
left out of the OpenAPI schema (the JSON API is the contract; these pages render it).
Each answer carries ``Server-Timing: render;dur=<ms>``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from contracts.errors import NotFoundError
from controller.api.page.html import el
from controller.api.page.layout import page, unreadable_fix, with_refresh
from controller.api.page.overview import OverviewQuery, gather_overview, render_overview
from controller.api.page.policy_data import DEFAULT_RANGE, RANGES, gather_policy
from controller.api.page.policy_html import render_policy
from controller.config import ControllerSettings
from controller.store import UnreadablePolicyError

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

RefreshQuery = Annotated[
    int | None, Query(ge=0, le=3600, description="Seconds between reloads (0: never; default: the tick interval)")
]


def _refresh_s(request: Request, refresh: int | None) -> int | None:
    if refresh is not None:
        return refresh or None
    settings: ControllerSettings = request.app.state.settings
    return max(5, min(60, round(settings.tick_interval_s)))


def _html(body: str, started_s: float, status_code: int = 200) -> HTMLResponse:
    elapsed_ms = (time.perf_counter() - started_s) * 1000
    return HTMLResponse(body, status_code=status_code, headers={"Server-Timing": f"render;dur={elapsed_ms:.1f}",
                                                                "Cache-Control": "no-store"})


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/", response_class=HTMLResponse)
async def overview_page(
    request: Request,
    q: Annotated[str, Query(max_length=100)] = "",
    state: Annotated[str, Query(pattern="^(|page|ticket|blind|stale|budget_spent|no_data|ok)$")] = "",
    sort: Literal["urgency", "name"] = "urgency",
    page_no: Annotated[int, Query(alias="page", ge=1, le=100_000)] = 1,
    per_page: Annotated[int, Query(ge=1, le=500)] = 50,
    refresh: RefreshQuery = None,
) -> HTMLResponse:
    """Every policy, the most urgent first."""
    started_s = time.perf_counter()
    # "stale" is what the page calls the state it filters by as "blind".
    query = OverviewQuery(q=q, state="blind" if state == "stale" else state, sort=sort, page=page_no,
                          per_page=per_page, refresh=refresh)  # fmt: skip
    data = await gather_overview(request, query)
    return _html(render_overview(data, refresh_s=_refresh_s(request, refresh)), started_s)


@router.get("/ui/policies/{name}", response_class=HTMLResponse)
async def policy_page(
    request: Request,
    name: str,
    range_key: Annotated[str, Query(alias="range", pattern="^(" + "|".join(RANGES) + ")$")] = DEFAULT_RANGE,
    refresh: RefreshQuery = None,
) -> HTMLResponse:
    """One policy: objectives, budgets, burn rates, charts, decisions, alerts."""
    started_s = time.perf_counter()
    try:
        data = await gather_policy(request, name, range_key)
    except NotFoundError:
        home = with_refresh("/ui/", refresh)
        body = [el("h1", "No such policy"), el("p", "There is no policy named ", el("b", name), ". ",
                                                el("a", "All policies", href=home))]
        return _html(page(f"no policy {name}", body, refresh_s=None, now=datetime.now(UTC), refresh_asked=refresh),
                     started_s, 404)  # fmt: skip
    except UnreadablePolicyError as exc:  # the controller's own stored data: a 500, as on /v1/policies/{name}
        body = [el("h1", f"This controller cannot read policy {name}"),
                el("p", f"As stored (version {exc.version}) it no longer validates: ", el("code", exc.problem),
                   ". It was written before a rule was tightened, or by a newer version; this controller does not "
                   "run it."),
                el("p", unreadable_fix(name, exc.version), " ",
                   el("a", "All policies", href=with_refresh("/ui/", refresh)))]  # fmt: skip
        return _html(page(f"cannot read policy {name}", body, refresh_s=None, now=datetime.now(UTC),
                          refresh_asked=refresh), started_s, 500)  # fmt: skip
    return _html(render_policy(data, refresh_s=_refresh_s(request, refresh), refresh_asked=refresh), started_s)
