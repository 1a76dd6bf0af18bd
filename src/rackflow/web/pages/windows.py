"""Maintenance windows: every window, what it covers, and when it next opens or closes (docs/WINDOWS.md);
below them the operation budgets, with how many of their tasks run now (docs/ROLLOUTS.md, "Budgets"), and
the pre-flight checks (docs/CHECKS.md), an Alertmanager check stored with no matcher marked: it matches
every alert. Windows and budgets are created and edited in a form (`/windows/new`, `/windows/{ref}/edit`,
`/budgets/new`, `/budgets/{ref}/edit`) that `static/forms.js` sends to the JSON API, and deleted from the
list."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.domain.checks import EVERY_ALERT_WHY, MATCHES_EVERY_ALERT, PreflightCheck
from rackflow.domain.tasks import OperationKind
from rackflow.domain.windows import NO_RACK_LEFT, MaintenanceWindow, Occurrence, Recurring
from rackflow.web import refs
from rackflow.web.pages import Site
from rackflow.web.pages.schedules import ZONES


def routes(site: Site) -> list[Route]:
    async def window_list(request: Request) -> Response:
        return await site.page(request, "windows.html", "Windows", lambda _: _list(site))

    async def window_form(request: Request) -> Response:
        ref = request.path_params.get("ref")
        title = f"Edit {ref}" if ref else "New window"
        return await site.page(request, "window_form.html", title, lambda _: _window_form(site, ref))

    async def budget_form(request: Request) -> Response:
        ref = request.path_params.get("ref")
        title = f"Edit {ref}" if ref else "New budget"
        return await site.page(request, "budget_form.html", title, lambda _: _budget_form(site, ref))

    return [
        Route("/windows", window_list),
        Route("/windows/new", window_form),
        Route("/windows/{ref}/edit", window_form),
        Route("/budgets/new", budget_form),
        Route("/budgets/{ref}/edit", budget_form),
    ]


async def _window_form(site: Site, ref: str | None) -> Mapping[str, Any]:
    window = None
    if ref is not None:
        window = await site.services.windows.get(await refs.window_id(site.services, ref, "id"))
    return {
        "window": window,
        "operations": list(OperationKind),
        "zones": ZONES,
    }


async def _budget_form(site: Site, ref: str | None) -> Mapping[str, Any]:
    budget = None
    if ref is not None:
        budget = await site.services.budgets.get(await refs.budget_id(site.services, ref, "id"))
    return {"budget": budget, "operations": list(OperationKind)}


def when_text(window: MaintenanceWindow) -> str:
    """`cron "0 22 * * 6" Europe/Berlin for 6h`, or `one off` (the times are shown as times)."""
    when = window.when
    if isinstance(when, Recurring):
        return f'cron "{when.cron}" {when.timezone or "UTC"} for {when.duration}'
    return "one off"


def covers_text(window: MaintenanceWindow | PreflightCheck) -> str:
    if window.all_racks:
        return "all racks"
    names = [name for _, name in window.racks] + [f"domain {name}" for _, name in window.domains]
    return ", ".join(names) or NO_RACK_LEFT


def current_or_next(window: MaintenanceWindow, now: datetime) -> Occurrence | None:
    """The occurrence open at `now`, or else the next one."""
    return next(window.occurrences(now), None)


async def _list(site: Site) -> Mapping[str, Any]:
    return {
        "windows": await site.services.windows.list_windows(),
        "when_text": when_text,
        "covers_text": covers_text,
        "current_or_next": current_or_next,
        "budgets": await site.services.budgets.with_usage(),
        "checks": await site.services.checks.list_checks(),
        "every_alert": MATCHES_EVERY_ALERT,
        "every_alert_why": EVERY_ALERT_WHY,
    }
