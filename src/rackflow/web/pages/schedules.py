"""Schedules: the list (filtered, sorted, paged on the server, with a strip of recent firings per row),
one schedule (configuration, scope, upcoming firings, the runs grid, actions), and the form that creates
or edits one (`/schedules/new`, `/schedules/{ref}/edit`).

The form is plain HTML filled in here; `static/forms.js` turns it into JSON API calls: as you type it
asks `POST /previews/schedule` (`_preview`: `POST /api/v1/schedules:preview`'s answer, with its names as
the pages show them) for the draft's next firings and each rack's decision (or the first error, shown
next to the field it names), and Save creates it (`POST /api/v1/schedules`) or changes
it (`PATCH /api/v1/schedules/{id}`, then `PUT …/scopes` for its racks). An operation cannot be changed
after create (UpdateTaskSchedule has no such path), so the edit form shows it fixed. The form lists no racks
or domains (20,000 of each were 1.1 MB of `<option>`s): its picker asks `/names/{kind}` (`_names`) for a
few names holding what is typed."""

from __future__ import annotations

import functools
import uuid
import zoneinfo
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from markupsafe import Markup, escape
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.api.auth import authorize
from rackflow.api.convert import message_json, page_from, page_token
from rackflow.api.convert.tasks import operation_kind_from
from rackflow.config import SEARCH_WALK
from rackflow.domain.approvals import may_weaken
from rackflow.domain.inventory import ComponentsFilter, ComponentType, TypesFilter, short_search
from rackflow.domain.schedules import Run, Schedule
from rackflow.domain.tasks import OperationKind
from rackflow.errors import InvalidArgument
from rackflow.rollouts.service import RunSummary
from rackflow.schedules.service import parse_order
from rackflow.security import Principal
from rackflow.timespec import SpecType
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import shown
from rackflow.web import refs
from rackflow.web.bodies import parse_into, read_json
from rackflow.web.pages import PAGE_SIZE, Site, offset_of, page_number, pages_of, query_url, utc_text
from rackflow.web.pages.runs import RACKS_PER_PAGE, progress_bar
from rackflow.web.views import (
    LOOKS,
    TASK_LOOKS,
    Look,
    outcome_verdict,
    tallied_verdict,
)
from rackflow.words import counted

STRIP_RUNS = 12  # firings in a list row's strip
GRID_RUNS = 20  # firings (columns) in a schedule's runs grid
UPCOMING = 8
STATES = ("all", "enabled", "paused")
SORTS = ("name", "next_run_at", "last_run_at", "created_at")


@dataclass(frozen=True)
class Pip:
    """One firing in a list row's strip: its colour and glyph, what hovering says, and its run's page."""

    look: Look
    title: str
    run_id: uuid.UUID


@dataclass(frozen=True)
class Strip:
    """A row's recent firings, oldest first, and how they ended in words (for screen readers)."""

    pips: list[Pip]
    summary: str


def strip_of(summaries: list[RunSummary]) -> Strip:
    """Made here, not in the template: a page has hundreds of pips. Each run's verdict is counted
    (`tallied_verdict`), from its racks by outcome and its tasks by status."""
    pips = []
    for one in reversed(summaries):
        run = one.run
        look = LOOKS[tallied_verdict(run.state, one.tally, one.task_counts)]
        pips.append(Pip(look, f"{utc_text(run.fired_at)} · {run.trigger} · {look.label}", run.id))
    counts = Counter(pip.look.label for pip in pips)
    tally = ", ".join(f"{n} {label}" for label, n in counts.most_common())
    summary = f"last {counted(len(pips), 'firing')}: {tally}"
    return Strip(pips, summary)


@dataclass(frozen=True)
class Cell:
    """One rack in one firing of the runs grid."""

    look: Look
    task_id: uuid.UUID | None
    title: str


# A grid row's cells are made here as HTML, not in the template: a page has 2,000 of them, and Jinja's
# attribute lookups and escapes per cell (six values each) took about 100 ms of a 270 ms page
# (docs/PERFORMANCE.md, issue 29). Every part but a task's id is escaped once per look and title.
EMPTY_CELL = Markup(
    '<td class="cell none" data-testid="grid-cell-empty"><span class="sr">not in this firing</span></td>'
)


@functools.lru_cache(maxsize=4096)
def _cell_parts(look: Look, title: str, tasked: bool) -> tuple[str, str]:
    """A cell's HTML before and after its task's id (a cell without a task: all of it before)."""
    css, label, glyph, title = escape(look.css), escape(look.label), escape(look.glyph), escape(title)
    if tasked:
        return (
            f'<td class="cell"><a class="{css}" href="/tasks/',
            f'" title="{title}" data-testid="grid-cell" data-status="{label}"><span aria-hidden="true">'
            f'{glyph}</span><span class="sr">{label}</span></a></td>',
        )
    return (
        f'<td class="cell"><span class="{css}" title="{title}" data-testid="grid-cell" data-status="{label}" '
        f'tabindex="0"><span aria-hidden="true">{glyph}</span><span class="sr">{label}: {title}</span></span>'
        "</td>",
        "",
    )


def row_html(cells: Mapping[uuid.UUID, Cell], columns: list[Run]) -> Markup:
    """One rack's cells of the runs grid, a column per run (a run without the rack: an empty cell)."""
    parts: list[str] = []
    for run in columns:
        cell = cells.get(run.id)
        if cell is None:
            parts.append(EMPTY_CELL)
            continue
        before, after = _cell_parts(cell.look, cell.title, cell.task_id is not None)
        parts.append(f"{before}{cell.task_id}{after}" if cell.task_id else before)
    return Markup("".join(parts))


def routes(site: Site) -> list[Route]:
    async def schedule_list(request: Request) -> Response:
        return await site.page(request, "schedules.html", "Schedules", lambda _: _list(site, request))

    async def schedule_page(request: Request) -> Response:
        ref = request.path_params["ref"]
        return await site.page(request, "schedule.html", ref, lambda who: _one(site, request, who, ref))

    async def new_schedule(request: Request) -> Response:
        return await site.page(
            request, "schedule_form.html", "New schedule", lambda who: _form(site, who, None)
        )

    async def edit_schedule(request: Request) -> Response:
        ref = request.path_params["ref"]
        return await site.page(
            request, "schedule_form.html", f"Edit {ref}", lambda who: _form(site, who, ref)
        )

    async def names(request: Request) -> Response:
        return await site.data(request, lambda principal: _names(site, principal, request))

    async def preview(request: Request) -> Response:
        return await site.data(request, lambda principal: _preview(site, principal, request))

    return [
        Route("/names/{kind}", names),
        Route(PREVIEW_PATH, preview, methods=["POST"]),
        Route("/schedules", schedule_list),
        Route("/schedules/new", new_schedule),
        Route("/schedules/{ref}/edit", edit_schedule),
        Route("/schedules/{ref}", schedule_page),
    ]


# The zones a form's time-zone field suggests (any IANA name is accepted).
ZONES = sorted(zoneinfo.available_timezones() - {"localtime", "Factory"})
COMPONENT_TYPES = [t for t in ComponentType if t is not ComponentType.UNKNOWN]


# How many names the form's picker offers at once, and the RPC whose role may read each kind of them.
PICKED_NAMES = 20
PICKED_BY = {"racks": "ListRacks", "nvl_domains": "ListNVLDomains"}


async def _names(site: Site, principal: Principal, request: Request) -> Mapping[str, Any]:
    """`GET /names/{racks|nvl_domains}?contains=TEXT[&after=NAME]`: the names the schedule form's picker
    offers as the operator types (`InventoryService.names_holding`), to a caller whose role may list them,
    each as the page writes it (`shown`); `after`, the name to ask on after for more (null: there are no
    more); `walk`, how many names a request of that text looks through at most (a text of one or two
    characters, which no index answers), or null."""
    kind, query = request.path_params["kind"], request.query_params
    if kind in PICKED_BY:  # any other is NotFound
        authorize(principal, PICKED_BY[kind])
    contains = query.get("contains", "")
    names, after = await site.services.inventory.names_holding(
        kind, contains, PICKED_NAMES, query.get("after", "")
    )
    walk = SEARCH_WALK if short_search(contains) else None
    return {"names": names, "shown": [shown(name) for name in names], "after": after, "walk": walk}


# The schedule form's preview (`_preview`).
PREVIEW_PATH = "/previews/schedule"
PREVIEW_RPC = "PreviewTaskSchedule"


async def _preview(site: Site, principal: Principal, request: Request) -> Mapping[str, Any]:
    """`POST /previews/schedule`, what the schedule form shows as it is typed: the answer of
    `POST /api/v1/schedules:preview` to the same body (the same RPC, run as the caller), with `shown`: each
    name of a rack and of a window in it, as the pages write a name (`validation.shown`). The script writes
    every name of the preview from it, so a name stored before today's rules is shown escaped there too
    (the racks of a chosen domain, the windows that close a rack, which the page has nowhere else), by the
    one rule, written once."""
    data = read_json(await request.body()) or {}
    sent = parse_into(data, pb.PreviewTaskScheduleRequest(), site.clock.now())
    answer = cast(pb.PreviewTaskScheduleResponse, await site.caller(PREVIEW_RPC, sent, principal))
    names = {name for f in answer.firings for s in f.scopes for name in (s.rack_name, s.window_name) if name}
    return {**message_json(answer), "shown": {name: shown(name) for name in sorted(names)}}


def gate_held(schedule: Schedule, principal: Principal) -> bool:
    """Whether the page offers `principal` no weaker approval gate than `schedule` has: it has a policy,
    and the caller's role may not weaken it (`may_weaken`). The edit form then keeps approval on with its
    approvers needed no fewer than now, and the schedule's Delete is disabled, each saying why, rather
    than offer what the service refuses on save (`check_may_weaken`, which stays the final word)."""
    return schedule.approval is not None and not may_weaken(principal)


async def _form(site: Site, principal: Principal, ref: str | None) -> Mapping[str, Any]:
    """What the schedule form offers (operations, zones; racks and domains are looked up by name as they
    are typed: `_names`) and, to edit, the schedule with its racks by name and the component types its
    scopes share (none: all components), and whether its approval gate is held (`gate_held`)."""
    services = site.services
    context: dict[str, Any] = {
        "operations": list(OperationKind),
        "component_types": COMPONENT_TYPES,
        "zones": ZONES,
        "schedule": None,
        "scope_racks": [],
        "scope_types": [],
        "mixed_filters": False,
        "gate_held": False,
    }
    if ref is None:
        return context
    schedule = await services.schedules.get(await refs.schedule_id(services, ref, "id"))
    scopes = await services.schedules.list_scopes(schedule.id)
    names = await services.inventory.rack_names({s.rack_id for s in scopes})
    filters = {s.filter for s in scopes}
    (shared,) = filters if len(filters) == 1 else (None,)
    context.update(
        schedule=schedule,
        scope_racks=sorted(names[s.rack_id] for s in scopes if s.rack_id in names),
        scope_types=sorted(t.value for t in shared.types) if isinstance(shared, TypesFilter) else [],
        mixed_filters=len(filters) > 1 or isinstance(shared, ComponentsFilter),
        gate_held=gate_held(schedule, principal),
    )
    return context


def _state(value: str) -> str:
    """The list's `state` filter ("" or none: all); any other value is refused, as the tasks list refuses
    an unknown `status`, rather than list every state as if it were not there."""
    if not value:
        return "all"
    if value not in STATES:
        raise InvalidArgument(f"state: {value!r} is not a schedule state ({', '.join(STATES)})")
    return value


async def _list(site: Site, request: Request) -> Mapping[str, Any]:
    q = request.query_params
    state = _state(q.get("state", ""))
    sort, direction = q.get("sort", "name"), q.get("dir", "asc")
    search = q.get("search", "")
    order = parse_order(f"{sort} {direction}", "sort")
    page = page_number(request)
    searching = short_search(search)
    # A short search pages on by the list's keyset tokens (`after`), where its walk stopped: page numbers
    # would have to count the matches before them, which is the read of every name it avoids.
    listing = f"/schedules:{order.name}"
    after = (
        page_from(pb.Pagination(page_token=q.get("after", "")), listing, "after").after if searching else None
    )
    schedules: list[Schedule] = []
    listed = await site.services.schedules.each_schedule_chunk(
        schedules.extend,
        enabled_only=state == "enabled",
        paused_only=state == "paused",
        name_contains=search,
        operation=operation_kind_from(q.get("op", ""), "op"),
        order=order,
        offset=0 if searching else offset_of(page),
        limit=PAGE_SIZE,
        after=after,
    )
    runs = await site.services.schedules.recent_runs([s.id for s in schedules], STRIP_RUNS)
    summaries = await site.services.rollouts.summaries([run for found in runs.values() for run in found])
    by_run = {summary.run.id: summary for summary in summaries}
    strips = {schedule_id: strip_of([by_run[run.id] for run in found]) for schedule_id, found in runs.items()}
    search_on = None
    if len(schedules) == PAGE_SIZE:
        search_on = page_token(listing, order.key_of(schedules[-1])) if searching else None
    elif listed.searched_to is not None:
        search_on = page_token(listing, listed.searched_to)
    return {
        "schedules": schedules,
        "strips": strips,
        "live_rollouts": await site.services.rollouts.live([s.id for s in schedules]),
        "filters": {"search": search, "state": state, "op": q.get("op", "")},
        "sort": sort,
        "direction": direction,
        "states": STATES,
        "operations": list(OperationKind),
        "pager": pages_of(listed.total, 1 if searching else page, capped=listed.count_bounded),
        # A short search: where the next page searches on from (None: the list's end), and whether this
        # is its first page, for the words that say how far it has looked.
        "searching": {
            "on": search_on,
            "first": after is None,
            "short": len(schedules) < PAGE_SIZE,
            "walk": SEARCH_WALK,
        }
        if searching
        else None,
        "url": lambda **changes: query_url(request, **changes),
    }


def upcoming(site: Site, schedule: Schedule) -> list[Any]:
    """The schedule's next firings from its own next run (interval schedules count from their last)."""
    if schedule.next_run_at is None:
        return []
    if schedule.spec.type is SpecType.ONE_TIME:
        return [schedule.next_run_at]
    later = site.services.schedules.preview(schedule.spec, schedule.next_run_at, UPCOMING - 1)
    return [schedule.next_run_at, *later]


async def _one(site: Site, request: Request, principal: Principal, ref: str) -> Mapping[str, Any]:
    """The schedule, and its runs grid a page of racks at a time (RACKS_PER_PAGE rows: the scope's racks
    by name, then racks that have left it or the inventory), whose cells are read from the outcomes of
    those racks only and whose column verdicts are counted in the database (`grid_outcomes`): the grid of
    10,000 racks × 20 firings parsed and rendered 200,000 cells (docs/PERFORMANCE.md, issue 29). The
    scope table shows the same page's racks. Its Delete is disabled where the gate is held (`gate_held`)."""
    services = site.services
    schedule = await services.schedules.get(await refs.schedule_id(services, ref, "id"))
    page = page_number(request)
    first = offset_of(page, RACKS_PER_PAGE)
    scopes, scope_total = await services.schedules.scope_page(schedule.id, first, RACKS_PER_PAGE)
    runs, total_runs = await services.schedules.run_heads(schedule.id, GRID_RUNS)
    columns = list(reversed(runs))  # oldest left, newest right, as time runs
    scoped = {scope.rack_id for scope, _ in scopes}
    found, task_counts = await services.schedules.grid_outcomes(schedule.id, [run.id for run in runs], scoped)
    # Racks that have left the scope follow it: by name, then those gone from the inventory too.
    left = found.left
    names = {scope.rack_id: name for scope, name in scopes} | await services.inventory.rack_names(left)
    left_in_order = [
        *sorted(left & names.keys(), key=names.__getitem__),
        *sorted(left - names.keys(), key=str),
    ]
    past_scope = max(0, first - scope_total)
    shown_racks = [
        *(scope.rack_id for scope, _ in scopes),
        *left_in_order[past_scope : past_scope + RACKS_PER_PAGE - len(scopes)],
    ]
    on_page = set(shown_racks)
    shown = [(run, o) for run in columns for o in found.shown[run.id] if o.rack_id in on_page]
    statuses = found.statuses
    grid: dict[uuid.UUID, dict[uuid.UUID, Cell]] = {rack: {} for rack in shown_racks}
    for run, outcome in shown:
        verdict = outcome_verdict(outcome, statuses)
        status = statuses.get(outcome.task_id) if outcome.task_id else None
        look = TASK_LOOKS[status] if status is not None else LOOKS[verdict]
        title = outcome.error or (f"task {look.label}" if outcome.task_id else verdict.value)
        grid[outcome.rack_id][run.id] = Cell(look, outcome.task_id, title)
    # The newest rollout among the shown runs, with its progress (the rollout panel).
    rollout_run = next((run for run in runs if run.rollout is not None), None)
    rollout = await services.rollouts.get(rollout_run.id) if rollout_run else None
    live = await services.rollouts.live([schedule.id])
    return {
        "schedule": schedule,
        "gate_held": gate_held(schedule, principal),
        "default_start_deadline": services.schedules.default_start_deadline,
        "live_rollout": live.get(schedule.id),
        "rollout": rollout,
        "rollout_bar": progress_bar(rollout.progress) if rollout and rollout.progress else None,
        "scopes": [scope for scope, _ in scopes],
        "scope_total": scope_total,
        "scoped": scoped,
        "rack_names": names,
        "rack_ids": shown_racks,
        "rack_pager": pages_of(scope_total + len(left), page, RACKS_PER_PAGE, exact=True),
        "url": lambda **changes: query_url(request, **changes),
        "columns": columns,
        "verdicts": {
            run.id: LOOKS[tallied_verdict(run.state, found.tallies[run.id], task_counts[run.id])]
            for run in columns
        },
        "rows": {rack: row_html(cells, columns) for rack, cells in grid.items()},
        "total_runs": total_runs,
        "upcoming": upcoming(site, schedule),
    }
