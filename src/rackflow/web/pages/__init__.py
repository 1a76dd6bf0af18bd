"""What every page shares: templates, time and state helpers, authentication, and the page/fragment rule.

A page is requested twice over: a navigation gets the whole document, and the page's script asks for the
same URL again with `X-Rackflow-Fragment: 1` to refresh it (every few seconds, and after an action); the
answer is then only the page's own HTML, whose `data-live` regions the script swaps in place, so scroll
position, focus and filter inputs survive. With bearer tokens configured, a navigation carries no token, so
it gets the empty layout ("shell") and the script fetches the fragment with the token it keeps.

Each page group is a module (`overview`, `schedules`, `runs`, `tasks`, `racks`, `windows`, `audit`) with a
`routes(site)` function and its templates.

A page offers an action only to a caller whose role may do it: every template gets `may(rpc)`, the API's own
rule (`rackflow.api.auth.authorize`), so a viewer sees no button that would end in a 403.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from rackflow import words
from rackflow.api.auth import authorize
from rackflow.api.errors import INTERNAL, INTERNAL_MESSAGE
from rackflow.clock import Clock
from rackflow.config import LIST_COUNT_CAP
from rackflow.domain.firing import late_text
from rackflow.domain.tasks import TaskStatus
from rackflow.errors import PermissionDenied, RackflowError, Unauthenticated
from rackflow.security import Principal, TokenTable
from rackflow.services import Services
from rackflow.timespec import format_go_duration
from rackflow.timespec.words import describe
from rackflow.validation import shown
from rackflow.web import views
from rackflow.web.auth import principal_of
from rackflow.web.calls import RpcCaller, RpcError

log = logging.getLogger(__name__)

FRAGMENT_HEADER = "x-rackflow-fragment"
PAGE_SIZE = 50
# How often an open page refreshes itself (the script reads it from the layout).
REFRESH_SECONDS = 5
NAV = (
    ("/", "Overview"),
    ("/schedules", "Schedules"),
    ("/tasks", "Tasks"),
    ("/racks", "Racks"),
    ("/windows", "Windows"),
    ("/notifications", "Notifications"),
    ("/audit", "Audit"),
)
_STATIC = ("app.css", "app.js", "forms.js")

Load = Callable[[Principal], Awaitable[Mapping[str, Any]]]


def iso(moment: datetime | None) -> str:
    """RFC 3339 in UTC, as `<time datetime>` wants it."""
    if moment is None:
        return ""
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def utc_text(moment: datetime | None) -> str:
    """The text a page shows before its script localises it (and without a script), and in titles."""
    if moment is None:
        return "—"
    return moment.astimezone(UTC).isoformat(sep=" ", timespec="seconds").replace("+00:00", "Z")


def zone_text(moment: datetime | None, zone: str) -> str:
    """`2026-03-03 02:00 CET`: the time in a schedule's own zone (`zone`; empty is UTC), as its cron reads."""
    if moment is None:
        return "—"
    return moment.astimezone(ZoneInfo(zone or "UTC")).strftime("%Y-%m-%d %H:%M %Z")


# How many characters of an id a page shows where the whole would crowd it (a task's link in a table).
SHORT_ID_CHARS = 8


def short_id(value: object) -> str:
    """An id (or a reference typed in a URL) as a page shows it in short: its last characters. Ids are
    version 7 UUIDs (`rackflow.ids`), whose first 8 characters are the top of the millisecond they were
    made, the same for every row made within about a minute (every task of a firing); their last are
    random, so the rows of one table are told apart. The page gives the whole id on hover."""
    return str(value)[-SHORT_ID_CHARS:]


def may_call(principal: Principal) -> Callable[[str], bool]:
    """`may(rpc)`: whether the caller's role may call `rpc`, by the rule the API enforces."""

    def may(rpc: str) -> bool:
        try:
            authorize(principal, rpc)
        except PermissionDenied:
            return False
        return True

    return may


def duration_text(delta: timedelta | None) -> str:
    if delta is None:
        return ""
    seconds = int(delta.total_seconds())
    if seconds < 60:
        return f"{max(seconds, 0)}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


class Site:
    """The page side of the web app: templates and the services the pages read."""

    def __init__(
        self, services: Services, caller: RpcCaller, tokens: TokenTable | None, clock: Clock
    ) -> None:
        self.services = services
        self.caller = caller
        self.tokens = tokens
        self.clock = clock
        self.env = Environment(
            loader=PackageLoader("rackflow.web", "templates"),
            autoescape=select_autoescape(default=True),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        version = hashlib.sha256(
            b"".join(files("rackflow.web").joinpath("static", name).read_bytes() for name in _STATIC)
        ).hexdigest()[:12]
        self.env.globals.update(
            nav=NAV,
            static=lambda name: f"/static/{name}?v={version}",
            refresh_seconds=REFRESH_SECONDS,
            tokens_required=tokens is not None,
            looks=views.LOOKS,
            task_looks=views.TASK_LOOKS,
            schedule_state=views.schedule_state,
            run_verdict=views.run_verdict,
            run_looks=views.RUN_LOOKS,
            task_statuses=list(TaskStatus),
            utc=UTC,
        )
        self.env.filters.update(
            iso=iso,
            utc=utc_text,
            in_zone=zone_text,
            duration=duration_text,
            spec_words=describe,
            go_duration=format_go_duration,
            late=late_text,
            short_id=short_id,
            counted=words.counted,
            shown=shown,
        )

    def render(self, template: str, context: Mapping[str, Any]) -> str:
        return self.env.get_template(template).render(context)

    async def page(self, request: Request, template: str, title: str, load: Load) -> Response:
        """The page (or its fragment): authenticate, load, render; domain errors become an error page."""
        fragment = request.headers.get(FRAGMENT_HEADER) == "1"
        headers = {"Cache-Control": "no-store"}
        if self.tokens is not None and not fragment:
            return HTMLResponse(self._layout(request, title, None), headers=headers)
        status = 200
        try:
            principal = principal_of(request, self.tokens)
            context = {
                "request": request,
                "now": self.clock.now(),
                "may": may_call(principal),
                **(await load(principal)),
            }
            body = self.render(template, context)
        except Unauthenticated as exc:
            error = RpcError.of(exc)
            return JSONResponse(error.to_json(), error.http_status, {"WWW-Authenticate": "Bearer", **headers})
        except (RackflowError, RpcError) as exc:
            error = exc if isinstance(exc, RpcError) else RpcError.of(exc)
            status = error.http_status
            body = self.render("error.html", {"error": error})
        except Exception:
            log.exception("unexpected error rendering %s", request.url.path)
            error = RpcError(INTERNAL.grpc, INTERNAL_MESSAGE)
            status = error.http_status
            body = self.render("error.html", {"error": error})
        if fragment:
            return HTMLResponse(body, status, headers=headers)
        return HTMLResponse(self._layout(request, title, body), status, headers=headers)

    async def data(self, request: Request, load: Callable[[Principal], Awaitable[Any]]) -> Response:
        """What a page's script asks for as JSON (the schedule form's picker and preview): the caller
        authenticated as for a page, and refused as the JSON API refuses (`{"code", "message", "field"}`),
        a refusal of an RPC it runs too."""
        headers = {"Cache-Control": "no-store"}
        try:
            return JSONResponse(await load(principal_of(request, self.tokens)), headers=headers)
        except RpcError as exc:
            return JSONResponse(exc.to_json(), exc.http_status, headers)
        except RackflowError as exc:
            error = RpcError.of(exc)
            if isinstance(exc, Unauthenticated):
                headers["WWW-Authenticate"] = "Bearer"
            return JSONResponse(error.to_json(), error.http_status, headers)

    def _layout(self, request: Request, title: str, main: str | None) -> str:
        return self.render("layout.html", {"request": request, "title": title, "main": main})


def query_url(request: Request, **changes: Any) -> str:
    """This page's URL with some query parameters changed (None removes one; page resets to 1, and a short
    search's `after` to its start)."""
    params = {k: v for k, v in request.query_params.items() if k not in ("page", "after")}
    for key, value in changes.items():
        if value is None or value == "":
            params.pop(key, None)
        else:
            params[key] = str(value)
    query = urlencode(params)
    return f"{request.url.path}?{query}" if query else request.url.path


# The last page a pager goes to: past it a page's offset would not fit the API's 32-bit offset (nor the
# databases' integers), and no list is that long.
MAX_PAGE = 1_000_000


def page_number(request: Request) -> int:
    """The `page` query parameter (1-based, at most MAX_PAGE); anything else (not ASCII digits: `²` is a
    digit to `str.isdigit` and not to `int`) is page 1."""
    raw = request.query_params.get("page", "1")
    return min(max(1, int(raw)), MAX_PAGE) if raw.isascii() and raw.isdigit() else 1


def offset_of(page: int, size: int = PAGE_SIZE) -> int:
    return (page - 1) * size


def capped_count(total: int, *, capped: bool = False) -> int | str:
    """A count made up to LIST_COUNT_CAP (`capped`, or more than the cap: a store count) as shown:
    "10,000+" past the cap."""
    if capped or total > LIST_COUNT_CAP:
        return f"{min(total, LIST_COUNT_CAP):,}+"
    return total


def pages_of(
    total: int, page: int, size: int = PAGE_SIZE, *, capped: bool = False, exact: bool = False
) -> dict[str, Any]:
    """What the pager shows: this page, the last page (and whether this is past it), and which rows of the
    total these are. A total
    counted up to LIST_COUNT_CAP (`capped`, or more than the cap: a store count) shows as "10,000+" and
    pages up to the cap, so the deepest page's OFFSET is bounded too. An `exact` total (a schedule's racks,
    counted from its scope index) pages to its end: a 20,000-rack schedule's last racks have a page."""
    shown = total if exact else capped_count(total, capped=capped)
    if not exact:
        total = min(total, LIST_COUNT_CAP)
    first_row = min(total, offset_of(page, size) + 1)
    last = max(1, -(-total // size))
    return {
        "page": page,
        "last": last,
        # A page past the last of a list counted whole (it shrank under a page refreshed in place, or a
        # number was typed in): it has no rows, so the pager says so and links the last page. Past the
        # pages of a capped count ("10,000+") rows may still be there: the pager is left as it is.
        "past": page > last and not isinstance(shown, str),
        "total": shown,
        "first_row": first_row,
        "last_row": min(total, offset_of(page, size) + size),
    }
