"""Maintenance windows: every window, what it covers, and when it next opens or closes (docs/WINDOWS.md);
below them the operation budgets, with how many of their tasks run now (docs/ROLLOUTS.md, "Budgets"), and
the pre-flight checks (docs/CHECKS.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.domain.checks import PreflightCheck
from rackflow.domain.windows import MaintenanceWindow, Occurrence, Recurring
from rackflow.web.pages import Site


def routes(site: Site) -> list[Route]:
    async def window_list(request: Request) -> Response:
        return await site.page(request, "windows.html", "Windows", lambda _: _list(site))

    return [Route("/windows", window_list)]


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
    return ", ".join(names) or "no rack (its racks were deleted)"


def current_or_next(window: MaintenanceWindow, now: datetime) -> Occurrence | None:
    """The occurrence open at `now`, or else the next one."""
    return next(window.occurrences(now), None)


async def _list(site: Site) -> Mapping[str, Any]:
    return {
        "windows": await site.services.windows.list_windows(),
        "when_text": when_text,
        "covers_text": covers_text,
        "current_or_next": current_or_next,
        "budgets": await site.services.budgets.with_running(),
        "checks": await site.services.checks.list_checks(),
    }
