"""The pages as the server renders them (in process, both databases): what each shows, its filters and
sorting, the runs grid, refresh fragments, and error pages. The browser tests (tests/browser) drive them
for real; these check the content cheaply."""

from __future__ import annotations

import html
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import insert, update

from rackflow.api.audit import AuditInterceptor
from rackflow.api.servicer import FlowServicer
from rackflow.clock import FakeClock
from rackflow.domain.firing import late_text
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import OperationKind, TaskStatus
from rackflow.ids import new_id
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.security import Principal, Role
from rackflow.services import Services
from rackflow.store import dispatch, paging
from rackflow.store import schedules as schedule_store
from rackflow.store.tables import audit_events, task_schedule
from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.v1 import flow_pb2 as pb
from rackflow.web import pages
from rackflow.web.calls import RpcCaller
from rackflow.web.pages import overview
from rackflow.web.pages import runs as runs_page
from rackflow.web.pages import schedules as schedules_page
from tests.web.conftest import end_task, make_racks, make_schedule

FRAGMENT = {"X-Rackflow-Fragment": "1"}


def tagged(html: str, name: str) -> list[str]:
    """The tags carrying data-testid=`name`, in page order."""
    return re.findall(rf'<[^>]*data-testid="{name}"[^>]*>', html)


def row(html: str, name: str) -> str:
    """The text of the schedule row named `name`, tags stripped."""
    match = re.search(rf'<tr data-testid="schedule-row" data-name="{name}">(.*?)</tr>', html, re.S)
    assert match, name
    return re.sub(r"<[^>]+>", " ", match.group(1))


def segments(html: str) -> dict[str, int]:
    """The first progress bar's segments: kind -> racks."""
    bar = html[html.index('data-testid="progress-bar"') :]
    bar = bar[: bar.index("</svg>")]
    return {attribute(t, "data-kind"): int(attribute(t, "data-count")) for t in tagged(bar, "bar-segment")}


def legend(html: str) -> str:
    match = re.search(r'data-testid="bar-legend">(.*?)</p>', html, re.S)
    assert match
    return match.group(1)


def tagged_text(html: str, name: str) -> str:
    """What the first element with data-testid=`name` holds, up to its closing tag."""
    match = re.search(rf'<(\w+)[^>]*data-testid="{name}"[^>]*>(.*?)</\1>', html, re.S)
    assert match, name
    return match.group(2)


def attribute(tag: str, name: str) -> str:
    match = re.search(rf'{name}="([^"]*)"', tag)
    assert match, tag
    return match.group(1)


async def test_a_short_search_says_it_searches_on_until_it_has_looked_through_every_schedule(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search of one or two characters looks through SEARCH_WALK schedules a page (here 2, by name): a
    page that found nothing says so of those schedules and links on; only the page whose walk reached the
    list's end says the search is over. A forged `after` is refused; a sort link starts from the top."""
    monkeypatch.setattr(paging, "SEARCH_WALK", 2)
    monkeypatch.setattr(schedules_page, "SEARCH_WALK", 2)
    await make_racks(services, "r1")
    for name in ("a-1", "b-1", "c-1", "d-qx", "e-1"):
        await make_schedule(services, name, "r1")

    def names(html: str) -> list[str]:
        return [attribute(tag, "data-name") for tag in tagged(html, "schedule-row")]

    seen: list[list[str]] = []
    path = "/schedules?search=QX"
    while True:
        page = await http.get(path)
        assert page.status_code == 200, page.text
        seen.append(names(page.text))
        if not tagged(page.text, "search-on"):
            assert tagged(page.text, "search-done") and not tagged(page.text, "pager")
            break
        assert not tagged(page.text, "search-done")
        path = attribute(tagged(page.text, "search-on")[0], "href").replace("&amp;", "&")
        assert "after=" in path and len(seen) <= 5
    assert seen == [[], ["d-qx"], []]  # a-1 b-1 | c-1 d-qx | e-1, the list's end
    first = (await http.get("/schedules?search=QX")).text
    assert "No match in the first 2 schedules — searching on" in first
    assert "No match yet: the search goes on." in first and "0+ matching in the first 2" in first
    assert "after=" not in attribute(tagged(first, "sort-name")[0], "href")
    forged = await http.get("/schedules?search=QX&after=not-a-token")
    assert forged.status_code == 400 and "after" in forged.text
    assert tagged((await http.get("/schedules?search=qx-")).text, "pager")  # three characters: pages


@pytest.mark.parametrize("path", ["/", "/schedules", "/tasks", "/racks", "/windows", "/audit"])
async def test_every_page_renders_empty_and_as_a_fragment(http: httpx.AsyncClient, path: str) -> None:
    page = await http.get(path)
    assert page.status_code == 200
    assert page.headers["cache-control"] == "no-store"
    assert "<!doctype html>" in page.text and 'aria-current="page"' in page.text
    fragment = await http.get(path, headers=FRAGMENT)
    assert fragment.status_code == 200 and "<html" not in fragment.text and "data-live=" in fragment.text


@pytest.mark.parametrize("path", ["/schedules", "/tasks", "/racks", "/audit"])
@pytest.mark.parametrize("page", ["99999999999999999999", "50000000", "%C2%B2", "0", "-3", "x"])
async def test_any_page_number_renders_a_page(http: httpx.AsyncClient, path: str, page: str) -> None:
    """A page number past any list (whose offset would overflow the API's or the database's integers), or
    not a number at all, is a page: the last one a pager goes to, or the first, never an error."""
    answer = await http.get(f"{path}?page={page}")
    assert answer.status_code == 200, answer.text


async def test_schedule_list_rows_filters_and_sorting(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2")
    await make_schedule(services, "nightly-reset", "r1")
    ingest = await make_schedule(
        services, "hourly-ingest", "r2", spec=ScheduleSpec(SpecType.INTERVAL, "1h"), kind=OperationKind.INGEST
    )
    await services.schedules.pause(ingest.id)

    def names(html: str) -> list[str]:
        return [attribute(tag, "data-name") for tag in tagged(html, "schedule-row")]

    page = (await http.get("/schedules")).text
    assert names(page) == ["hourly-ingest", "nightly-reset"]  # by name
    assert "every day at 02:00 Europe/Berlin" in page and "every 1h" in page
    assert "Power Reset" in page and "Ingest" in page
    assert "paused" in row(page, "hourly-ingest") and "enabled" in row(page, "nightly-reset")
    assert names((await http.get("/schedules?sort=name&dir=desc")).text) == ["nightly-reset", "hourly-ingest"]
    assert names((await http.get("/schedules?state=paused")).text) == ["hourly-ingest"]
    assert names((await http.get("/schedules?search=RESET")).text) == ["nightly-reset"]
    assert names((await http.get("/schedules?op=ingest")).text) == ["hourly-ingest"]
    empty = (await http.get("/schedules?search=nothing-like-it")).text
    assert names(empty) == [] and tagged(empty, "empty")
    assert (await http.get("/schedules?search=%00")).status_code == 400  # PostgreSQL cannot compare a NUL
    bad = await http.get("/schedules?sort=colour")
    assert bad.status_code == 400 and "sort" in bad.text and tagged(bad.text, "page-error")


async def test_schedule_list_pages_through_many(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1")
    for i in range(53):
        await make_schedule(services, f"s{i:02d}", "r1", spec=ScheduleSpec(SpecType.INTERVAL, f"{i + 1}h"))
    first = (await http.get("/schedules")).text
    assert len(tagged(first, "schedule-row")) == 50 and "1–50 of 53" in first
    second = (await http.get("/schedules?page=2")).text
    assert [attribute(t, "data-name") for t in tagged(second, "schedule-row")] == ["s50", "s51", "s52"]
    assert tagged(second, "pager-prev") and not tagged(second, "pager-next")


@pytest.mark.parametrize("count", [53, 0])
async def test_a_page_past_the_end_of_a_list_says_so_and_links_the_last(
    http: httpx.AsyncClient, services: Services, count: int
) -> None:
    """A page that was there when it was opened and is past the end now (tasks ended, schedules deleted,
    refreshed in place), or a page number typed in: it says it is past the end and links the last page,
    not "53–53 of 53" over no rows with a Previous link to a page just as empty."""
    await make_racks(services, "r1")
    for i in range(count):
        await make_schedule(services, f"s{i:02d}", "r1", spec=ScheduleSpec(SpecType.INTERVAL, f"{i + 1}h"))
    page = (await http.get("/schedules?state=all&page=7")).text
    assert not tagged(page, "schedule-row") and f"{count}–{count} of {count}" not in page
    assert tagged_text(page, "pager-past") == f"page 7 is past the end: {count} in all"
    last = 2 if count else 1
    links = [attribute(t, "href") for t in tagged(page, "pager-last")]
    assert links == [f"/schedules?state=all&amp;page={last}"]
    assert not tagged(page, "pager-prev") and not tagged(page, "pager-next")


async def test_a_schedule_page_shows_its_runs_grid(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2")
    schedule = await make_schedule(services, "nightly", "r1", "r2")
    first = await services.schedules.trigger(schedule.id)
    for task_id in first:
        await end_task(services, task_id, TaskStatus.COMPLETED)
    failed, running = await services.schedules.trigger(schedule.id)
    await end_task(services, failed, TaskStatus.FAILED)

    page = (await http.get("/schedules/nightly")).text
    assert len(tagged(page, "grid-column")) == 2
    assert [attribute(t, "data-rack") for t in tagged(page, "grid-row")] == ["r1", "r2"]
    statuses = sorted(attribute(t, "data-status") for t in tagged(page, "grid-cell"))
    assert statuses == ["completed", "completed", "failed", "pending"]
    assert f'href="/tasks/{failed}"' in page and f'href="/tasks/{running}"' in page
    assert (
        tagged(page, "action-pause") and tagged(page, "action-trigger") and not tagged(page, "action-resume")
    )
    assert len(tagged(page, "upcoming")) == 1

    await services.schedules.pause(schedule.id)
    paused = (await http.get(f"/schedules/{schedule.id}", headers=FRAGMENT)).text
    assert tagged(paused, "action-resume") and not tagged(paused, "action-pause")
    assert tagged(paused, "paused-note")


async def test_the_runs_grid_pages_its_racks(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows are the scope's racks by name, then the racks that left it, RACKS_PER_PAGE at a time (two
    here); each page's cells are its own racks', and the column verdicts count every rack of the run. The
    pager goes to the last rack whatever the list cap (4 here)."""
    monkeypatch.setattr(schedules_page, "RACKS_PER_PAGE", 2)
    monkeypatch.setattr(pages, "LIST_COUNT_CAP", 4)
    names = ["r1", "r2", "r3", "r4", "r5"]
    rack_ids = dict(zip(names, await make_racks(services, *names), strict=True))
    schedule = await make_schedule(services, "wide", "r5", "r4", "r3", "r2", "r1")
    for task_id in await services.schedules.trigger(schedule.id):
        await end_task(services, task_id, TaskStatus.COMPLETED)
    assert isinstance(services.clock, FakeClock)
    services.clock.advance(timedelta(minutes=1))
    second = await services.schedules.trigger(schedule.id)
    task_of = {t.rack_id: t.id for t in await services.tasks.get_tasks(second)}
    for rack, task_id in task_of.items():
        await end_task(
            services, task_id, TaskStatus.FAILED if rack == rack_ids["r4"] else TaskStatus.COMPLETED
        )
    (r3_scope,) = [
        s for s in await services.schedules.list_scopes(schedule.id) if s.rack_id == rack_ids["r3"]
    ]
    await services.schedules.remove_scope(r3_scope.id)

    first_page = (await http.get("/schedules/wide")).text
    assert [attribute(t, "data-rack") for t in tagged(first_page, "grid-row")] == ["r1", "r2"]
    assert "1–2 of 5" in first_page and tagged(first_page, "pager-next")
    # r4 failed in the second firing: its column is partial on every page, though not a cell of page 1 is.
    verdicts = [attribute(t, "data-verdict") for t in tagged(first_page, "grid-column")]
    assert verdicts == ["succeeded", "partial"]
    assert {attribute(t, "data-status") for t in tagged(first_page, "grid-cell")} == {"completed"}
    assert first_page.count('data-testid="scope-row"') == 2

    page_2 = (await http.get("/schedules/wide?page=2")).text
    assert [attribute(t, "data-rack") for t in tagged(page_2, "grid-row")] == ["r4", "r5"]
    statuses = [attribute(t, "data-status") for t in tagged(page_2, "grid-cell")]
    assert statuses == ["completed", "failed", "completed", "completed"]  # r4's two firings, then r5's
    assert f'href="/tasks/{task_of[rack_ids["r4"]]}"' in page_2
    assert f'href="/tasks/{task_of[rack_ids["r1"]]}"' not in page_2
    assert "3–4 of 5" in page_2 and tagged(page_2, "pager-prev") and tagged(page_2, "pager-next")

    page_3 = (await http.get("/schedules/wide?page=3", headers=FRAGMENT)).text
    (row,) = tagged(page_3, "grid-row")
    assert attribute(row, "data-rack") == "r3" and "(left)" in page_3
    assert len(tagged(page_3, "grid-cell")) == 2 and not tagged(page_3, "pager-next")


async def test_a_runs_page_pages_its_racks(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rack list is paged to its end whatever the list cap (2 here); the summary and the bar are the
    whole run's."""
    monkeypatch.setattr(runs_page, "RACKS_PER_PAGE", 2)
    monkeypatch.setattr(pages, "LIST_COUNT_CAP", 2)
    await make_racks(services, "r1", "r2", "r3")
    schedule = await make_schedule(services, "three", "r3", "r2", "r1")
    task_ids = await services.schedules.trigger(schedule.id)
    tasks = {t.rack_id: t for t in await services.tasks.get_tasks(task_ids)}
    (run,), _ = await services.schedules.list_runs(schedule.id)
    names = await services.inventory.rack_names(tasks)
    last = next(t for rack, t in tasks.items() if names[rack] == "r3")
    await end_task(services, last.id, TaskStatus.FAILED)

    first = (await http.get(f"/runs/{run.id}")).text
    assert [attribute(t, "data-rack") for t in tagged(first, "run-rack")] == ["r1", "r2"]
    assert "3 racks: 1 failed, 2 running" in first and segments(first) == {"failed": 1, "running": 2}
    second = (await http.get(f"/runs/{run.id}?page=2")).text
    (row,) = tagged(second, "run-rack")
    assert attribute(row, "data-rack") == "r3" and attribute(row, "data-status") == "failed"
    assert "3–3 of 3" in second and tagged(second, "pager-prev") and segments(second) == segments(first)


async def test_a_rollouts_progress_and_actions_on_its_schedule_page(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1", "r2", "r3", "r4")
    policy = RolloutPolicy(max_concurrent_racks=2, halt_after_failures=1)
    schedule = await make_schedule(services, "fw", "r1", "r2", "r3", "r4", rollout=policy)
    plain = (await http.get("/schedules/fw")).text
    assert "max 2, halt after 1, pause on halt" in plain and not tagged(plain, "rollout-panel")

    first, _second = await services.schedules.trigger(schedule.id)
    page = (await http.get("/schedules/fw")).text
    (panel,) = tagged(page, "rollout-panel")
    assert attribute(panel, "data-state") == "rolling"
    assert "0 of 4 succeeded, 2 active, 2 waiting their turn" in page
    statuses = sorted(attribute(t, "data-status") for t in tagged(page, "grid-cell"))
    assert statuses == ["pending", "pending", "waiting its turn", "waiting its turn"]
    assert tagged(page, "action-cancel-run") and not tagged(page, "action-resume-run")

    await end_task(services, first, TaskStatus.FAILED)
    await services.rollouts.advance()
    halted = (await http.get("/schedules/fw", headers=FRAGMENT)).text
    assert "rollout halted: 1 of 4 racks failed (limit 1)" in halted
    assert re.search(
        r'data-testid="rollout-state"><span class="glyph" aria-hidden="true">‖</span>halted<', halted
    )
    assert tagged(halted, "action-resume-run") and tagged(halted, "action-cancel-run")
    cells = sorted(attribute(t, "data-status") for t in tagged(halted, "grid-cell"))
    assert cells == ["failed", "not started", "not started", "pending"]
    assert segments(halted) == {"failed": 1, "running": 1, "not_started": 2}  # not all green: 0 succeeded
    assert 'data-kind="not_started"' in legend(halted)
    (link,) = tagged(halted, "rollout-link")
    run_page = (await http.get(attribute(link, "href"))).text
    assert segments(run_page) == {"failed": 1, "running": 1, "not_started": 2}


async def test_tasks_page_filters_and_task_page(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2")
    schedule = await make_schedule(services, "nightly", "r1", "r2")
    failed, pending = await services.schedules.trigger(schedule.id)
    await end_task(services, failed, TaskStatus.FAILED)

    def rows(html: str) -> list[str]:
        return [attribute(tag, "data-status") for tag in tagged(html, "task-row")]

    assert sorted(rows((await http.get("/tasks")).text)) == ["failed", "pending"]
    assert rows((await http.get("/tasks?status=failed")).text) == ["failed"]
    assert sorted(rows((await http.get("/tasks?schedule=nightly")).text)) == ["failed", "pending"]
    only_pending = (await http.get("/tasks?status=pending")).text
    assert len(tagged(only_pending, "action-cancel")) == 1  # only an active task can be cancelled
    assert (await http.get("/tasks?rack=r9")).status_code == 404

    task = (await http.get(f"/tasks/{failed}")).text
    assert "Power Reset" in task and "nightly" in task and not tagged(task, "action-cancel")
    assert tagged(task, "steps-table")
    assert (await http.get(f"/tasks/{pending}")).text.count('data-testid="action-cancel"') == 1
    assert (await http.get("/tasks/nope")).status_code == 400
    assert (await http.get(f"/tasks/{schedule.id}")).status_code == 404


async def test_rack_pages(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2")
    await make_schedule(services, "nightly", "r1")
    listing = (await http.get("/racks")).text
    assert [attribute(t, "data-name") for t in tagged(listing, "rack-row")] == ["r1", "r2"]
    rack = (await http.get("/racks/r1")).text
    assert "nightly" in rack and "r1-compute" in rack and tagged(rack, "components-table")
    assert (await http.get("/racks/r9")).status_code == 404


async def test_overview_counts_and_failures(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2")
    schedule = await make_schedule(services, "nightly", "r1", "r2")
    paused = await make_schedule(services, "weekly", "r1", spec=ScheduleSpec(SpecType.CRON, "0 3 * * SUN"))
    await services.schedules.pause(paused.id)
    failed, _ = await services.schedules.trigger(schedule.id)
    await end_task(services, failed, TaskStatus.FAILED)
    page = (await http.get("/")).text
    assert re.search(r"1 <span>enabled</span>", page) and "1 paused" in page
    assert "1 failed" in page and tagged(page, "failure-row") and "nightly" in page
    assert tagged(page, "time-axis")


async def test_overview_state_counts_past_their_cap_say_at_least(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each state is counted up to the list cap (a million schedules are not counted one by one)."""
    monkeypatch.setattr(paging, "LIST_COUNT_CAP", 2)
    monkeypatch.setattr(pages, "LIST_COUNT_CAP", 2)
    await make_racks(services, "r1")
    for name in ("a", "b", "c"):
        await make_schedule(services, name, "r1")
    paused = await make_schedule(services, "d", "r1")
    await services.schedules.pause(paused.id)
    page = (await http.get("/")).text
    assert re.search(r"2\+ <span>enabled</span>", page) and "1 paused" in page, page


async def test_overview_task_counts_past_their_cap_say_at_least(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks by status are counted up to the list cap too (a busy day holds hundreds of thousands)."""
    monkeypatch.setattr(paging, "LIST_COUNT_CAP", 2)
    monkeypatch.setattr(pages, "LIST_COUNT_CAP", 2)
    await make_racks(services, "r1", "r2", "r3", "r4")
    schedule = await make_schedule(services, "nightly", "r1", "r2", "r3", "r4")
    *failed, last = await services.schedules.trigger(schedule.id)
    for task_id in failed:
        await end_task(services, task_id, TaskStatus.FAILED)
    await end_task(services, last, TaskStatus.COMPLETED)
    page = (await http.get("/")).text
    assert "2+ failed" in page and re.search(r"1 <span>completed</span>", page), page


async def test_overview_backlog_at_its_cap_says_at_least(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_racks(services, "r1")
    schedule = await make_schedule(services, "nightly", "r1")
    async with services.db.transaction() as conn:  # overdue by either database's clock
        await conn.execute(
            update(task_schedule)
            .where(task_schedule.c.id == schedule.id)
            .values(next_run_at=datetime(2000, 1, 1, tzinfo=UTC))
        )
    assert "1 <span>due" in (await http.get("/")).text
    for module in (dispatch, overview):
        monkeypatch.setattr(module, "DUE_COUNT_CAP", 1)
    assert "1+ <span>due" in (await http.get("/")).text


async def test_audit_page_lists_changes(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")
    await http.post("/api/v1/schedules/nightly:pause")
    page = (await http.get("/audit")).text
    assert [attribute(t, "data-method") for t in tagged(page, "audit-row")] == ["PauseTaskSchedule"]
    assert (await http.get("/audit?method=Reboot")).status_code == 400


async def test_audit_page_shows_the_schedules_a_rack_deletion_changed(
    http: httpx.AsyncClient, services: Services
) -> None:
    """A deletion by any front end (here the HTTP API's way to the servicer) names each schedule whose
    scope it changed, linked, and says what went."""
    (rack_id,) = await make_racks(services, "r1")
    schedule = await make_schedule(services, "nightly", "r1")
    caller = RpcCaller(FlowServicer(services), AuditInterceptor(services.audit))
    oncall = Principal("oncall", Role.OPERATOR, "token")
    await caller("DeleteRack", pb.DeleteRackRequest(id=pb.UUID(id=str(rack_id))), oncall)
    page = (await http.get("/audit?method=DeleteRack")).text
    assert [attribute(t, "data-kind") for t in tagged(page, "audit-target")] == ["gone", "schedule"]
    assert f'href="/schedules/{schedule.id}"' in tagged(page, "audit-target")[1]
    (changes,) = re.findall(r'<pre data-testid="audit-changes">(.*?)</pre>', page, re.S)
    assert "&#34;scope_entry&#34;: &#34;removed&#34;" in changes and "nightly" in changes


async def test_audit_page_filters_by_target_and_pages_on_by_token(
    http: httpx.AsyncClient, services: Services
) -> None:
    """A schedule's history: its own changes and the rack deletion that changed its scope, not another
    schedule's; by target the page goes on by page tokens (on SQLite a page walks a bounded range)."""
    (rack_id,) = await make_racks(services, "r1")
    schedule = await make_schedule(services, "nightly", "r1")
    await make_schedule(services, "weekly", "r1")
    await http.post("/api/v1/schedules/weekly:pause")
    await http.post("/api/v1/schedules/nightly:pause")
    caller = RpcCaller(FlowServicer(services), AuditInterceptor(services.audit))
    oncall = Principal("oncall", Role.OPERATOR, "token")
    await caller("DeleteRack", pb.DeleteRackRequest(id=pb.UUID(id=str(rack_id))), oncall)

    page = (await http.get("/audit", params={"target": str(schedule.id)})).text
    methods = [attribute(t, "data-method") for t in tagged(page, "audit-row")]
    assert methods == ["DeleteRack", "PauseTaskSchedule"]
    assert f'value="{schedule.id}"' in tagged(page, "filter-target")[0]
    assert tagged(page, "target-done") and not tagged(page, "pager")
    page = (await http.get("/audit", params={"target": "nightly"})).text  # by name: the same history
    assert [attribute(t, "data-method") for t in tagged(page, "audit-row")] == methods
    assert 'value="nightly"' in tagged(page, "filter-target")[0]


async def test_audit_page_goes_on_by_token_past_a_page_its_bytes_ended_early(
    http: httpx.AsyncClient, services: Services
) -> None:
    """Rows a release before the cap stored whole (megabytes each) fill a page's bytes before its 50
    events: the page ends early and goes on by its token (`after`), not by page number, whose offset would
    skip the events between; every event is shown once, newest first."""
    methods = ["CreateRack", "DeleteRack", "PauseTaskSchedule", "ResumeTaskSchedule", "DeleteTaskSchedule"]
    at = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    rows = [
        {
            "id": new_id(),
            "at": at - timedelta(seconds=i),
            "principal": "oncall",
            "method": method,
            "target_ids": [],
            "outcome": "INVALID_ARGUMENT",
            "error": "too long",
            "request": {"description": "y" * (1024 * 1024)},
            "schedule_before": None,
            "schedule_after": None,
            "changes": None,
        }
        for i, method in enumerate(methods)
    ]
    async with services.db.transaction() as conn:
        await conn.execute(insert(audit_events), rows)
    shown: list[str] = []
    page = (await http.get("/audit")).text
    while True:
        found = [attribute(t, "data-method") for t in tagged(page, "audit-row")]
        assert 0 < len(found) < len(methods) or shown, "the first page ends early"
        shown += found
        if not (following := tagged(page, "target-next")):
            break
        assert not tagged(page, "pager")  # no page numbers: page 2 (offset 50) would skip what is between
        page = (await http.get(html.unescape(attribute(following[0], "href")))).text
    assert shown == methods
    assert tagged(page, "target-done")


async def test_audit_page_finds_a_target_by_name_of_any_kind_and_refuses_one_two_kinds_use(
    http: httpx.AsyncClient, services: Services
) -> None:
    """A name is looked up among every kind with unique names (here a budget, found in its list); one that a
    rack and a schedule share is refused with both ids to choose from; one nothing has is NOT_FOUND."""
    (rack_id,) = await make_racks(services, "db-01")
    schedule = await make_schedule(services, "db-01", "db-01")
    created = await http.post(
        "/api/v1/budgets",
        json={"budget": {"name": "fw", "operations": ["upgrade_firmware"], "max_running": 2}},
    )
    assert created.status_code == 200, created.text
    page = (await http.get("/audit", params={"target": "fw"})).text
    assert [attribute(t, "data-method") for t in tagged(page, "audit-row")] == ["CreateOperationBudget"]

    shared = await http.get("/audit", params={"target": "db-01"})
    assert shared.status_code == 400
    assert (
        f"target: &#39;db-01&#39; names a rack and a schedule; give the id (rack {rack_id}, schedule "
        f"{schedule.id})"
    ) in shared.text
    unknown = await http.get("/audit", params={"target": "no-such"})
    assert unknown.status_code == 404
    assert "target: no rack, schedule, window, domain, budget, check or channel is named" in unknown.text


async def test_an_unexpected_failure_is_an_error_page_without_details(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken() -> None:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(services.schedules, "state_counts", broken)
    page = await http.get("/", headers=FRAGMENT)
    assert page.status_code == 500 and tagged(page.text, "page-error")
    assert "internal error (logged on the server)" in page.text and "secret detail" not in page.text


async def test_a_missed_run_shows_its_slot_and_how_late(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1")
    schedule = await make_schedule(services, "guarded", "r1")
    async with services.db.transaction() as conn:
        slot = await services.db.now(conn) - timedelta(hours=2, milliseconds=400)
        late = replace(
            schedule, next_run_at=slot, start_deadline=timedelta(minutes=15), pause_after_failed_runs=3
        )
        await schedule_store.save_schedule(conn, late)

    await Dispatcher(services.schedules, services.audit).poll_once()
    (run,), _ = await services.schedules.list_runs(schedule.id)

    page = (await http.get("/schedules/guarded")).text
    assert tagged(page, "schedule-start-deadline") and "15m" in page and "3 consecutive failing runs" in page
    assert 'title="missed: open this firing"' in page
    run_page = await http.get(f"/runs/{run.id}")
    assert run_page.status_code == 200, run_page.text
    assert tagged(run_page.text, "run-slot") and "late, past its start deadline" in run_page.text
    # In whole seconds, as its reason says it (the run keeps it to the microsecond).
    assert run.late_by is not None and f"found {late_text(run.late_by)} late," in run_page.text
