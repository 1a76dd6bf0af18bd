"""The operator console's pages, in process on both databases: a page per run with its racks and a
segmented bar, states shown truthfully (cancelled, rolling, partial, a one-time schedule's halted rollout),
the overview's flags and its timeline of dense schedules, schedules' own zones, and audit targets by name."""

from __future__ import annotations

import re
import uuid
from dataclasses import replace
from datetime import timedelta

import httpx
from sqlalchemy import delete, update

from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import TaskStatus
from rackflow.services import Services
from rackflow.store.tables import task_schedule_run, tasks
from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.web.pages import overview
from tests.web.conftest import START, end_task, make_racks, make_schedule
from tests.web.test_pages import FRAGMENT, attribute, legend, segments, tagged


def badge_text(html: str, testid: str) -> str:
    """The label of the badge with data-testid `testid` (its glyph left out)."""
    match = re.search(
        rf'data-testid="{testid}"><span class="glyph" aria-hidden="true">.</span>([^<]*)<', html
    )
    assert match, testid
    return match.group(1)


async def only_run(services: Services, schedule_id: uuid.UUID) -> str:
    runs, _ = await services.schedules.list_runs(schedule_id, limit=1)
    return str(runs[0].id)


async def test_a_run_page_shows_each_rack_its_task_and_error(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1", "r2", "r3")
    schedule = await make_schedule(services, "nightly", "r1", "r2", "r3")
    done, failed, running = await services.schedules.trigger(schedule.id)
    await end_task(services, done, TaskStatus.COMPLETED)
    await end_task(services, failed, TaskStatus.FAILED)
    run_id = await only_run(services, schedule.id)

    page = (await http.get(f"/runs/{run_id}")).text
    assert badge_text(page, "run-verdict") == "waiting" and badge_text(page, "run-state") == "completed"
    assert [attribute(t, "data-rack") for t in tagged(page, "run-rack")] == ["r1", "r2", "r3"]
    assert sorted(attribute(t, "data-status") for t in tagged(page, "run-rack")) == [
        "completed",
        "failed",
        "pending",
    ]
    assert {attribute(t, "href") for t in tagged(page, "run-task-link")} == {
        f"/tasks/{t}" for t in (done, failed, running)
    }
    assert segments(page) == {"succeeded": 1, "failed": 1, "running": 1}
    for kind in ("succeeded", "failed", "running", "pending", "not_started", "skipped"):
        assert f'data-kind="{kind}"' in legend(page)
    assert 'href="/schedules/' in page and "nightly" in page
    assert not tagged(page, "action-resume-run") and not tagged(page, "action-cancel-run")  # not a rollout

    await end_task(services, running, TaskStatus.COMPLETED)
    ended = (await http.get(f"/runs/{run_id}", headers=FRAGMENT)).text
    assert badge_text(ended, "run-verdict") == "partial"  # 1 of 3 failed: not the ✗ of all failed
    schedule_page = (await http.get("/schedules/nightly")).text
    (column,) = tagged(schedule_page, "grid-column")
    assert attribute(column, "data-verdict") == "partial"
    (link,) = tagged(schedule_page, "grid-run-link")
    assert attribute(link, "href") == f"/runs/{run_id}"
    listing = (await http.get("/schedules")).text
    assert [attribute(t, "href") for t in tagged(listing, "strip-run-link")] == [f"/runs/{run_id}"]
    # The strip's pip, counted from the run's outcome counts and its tasks by status, says what its page
    # says.
    assert "last 1 firing: 1 partial" in listing

    task_page = (await http.get(f"/tasks/{failed}")).text
    assert [attribute(t, "href") for t in tagged(task_page, "task-run-link")] == [f"/runs/{run_id}"]
    assert not tagged(task_page, "task-run-pruned")

    assert (await http.get("/runs/nope")).status_code == 400
    missing = await http.get(f"/runs/{schedule.id}")
    assert missing.status_code == 404 and tagged(missing.text, "page-error")

    # Its run pruned, the task keeps the run's id on PostgreSQL (migration 0036): its page says so rather
    # than link to a page that is gone. SQLite's foreign key unlinks the task instead: no firing shown.
    async with services.db.transaction() as conn:
        await conn.execute(delete(task_schedule_run).where(task_schedule_run.c.id == uuid.UUID(run_id)))
    task_page = (await http.get(f"/tasks/{failed}")).text
    assert not tagged(task_page, "task-run-link")
    assert len(tagged(task_page, "task-run-pruned")) == (1 if services.db.is_postgres else 0)


async def test_a_cancelled_rollout_and_a_resumed_one_are_not_failed(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1", "r2", "r3", "r4")
    policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1)
    schedule = await make_schedule(services, "fw", "r1", "r2", "r3", "r4", rollout=policy)
    (first,) = await services.schedules.trigger(schedule.id)
    await end_task(services, first, TaskStatus.FAILED)
    await services.rollouts.advance()
    run_id = await only_run(services, schedule.id)
    halted = (await http.get(f"/runs/{run_id}")).text
    assert badge_text(halted, "run-verdict") == "halted" and badge_text(halted, "run-state") == "halted"
    assert tagged(halted, "action-resume-run") and tagged(halted, "action-cancel-run")
    assert "rollout halted: 1 of 4 racks failed (limit 1)" in halted
    assert segments(halted) == {"failed": 1, "not_started": 3}  # not a full green bar
    outcomes = sorted(attribute(t, "data-outcome") for t in tagged(halted, "run-rack"))
    assert outcomes == ["not_started", "not_started", "not_started", "submitted"]

    await services.rollouts.resume(uuid.UUID(run_id))
    rolling = (await http.get(f"/runs/{run_id}")).text
    assert badge_text(rolling, "run-verdict") == "rolling"  # a failure before the resume does not mark it
    grid = (await http.get("/schedules/fw")).text
    assert attribute(tagged(grid, "grid-column")[0], "data-verdict") == "rolling"
    assert badge_text(grid, "rollout-state") == "rolling"

    await services.rollouts.cancel(uuid.UUID(run_id))
    cancelled = (await http.get(f"/runs/{run_id}")).text
    assert (
        badge_text(cancelled, "run-verdict") == "cancelled"
        and badge_text(cancelled, "run-state") == "cancelled"
    )
    assert not tagged(cancelled, "action-resume-run") and not tagged(cancelled, "action-cancel-run")
    grid = (await http.get("/schedules/fw")).text
    assert attribute(tagged(grid, "grid-column")[0], "data-verdict") == "cancelled"


async def test_a_one_time_schedule_whose_rollout_halted_is_not_finished(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1", "r2")
    policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1)
    once = ScheduleSpec(SpecType.ONE_TIME, (START + timedelta(hours=1)).isoformat().replace("+00:00", "Z"))
    schedule = await make_schedule(services, "once", "r1", "r2", spec=once, rollout=policy)
    (first,) = await services.schedules.trigger(schedule.id)
    page = (await http.get("/schedules/once")).text
    assert badge_text(page, "schedule-state") == "rolling"
    await end_task(services, first, TaskStatus.FAILED)
    await services.rollouts.advance()
    page = (await http.get("/schedules/once")).text
    assert badge_text(page, "schedule-state") == "halted"
    assert "halted" in re.sub(r"<[^>]+>", " ", (await http.get("/schedules")).text)
    await services.rollouts.cancel(uuid.UUID(await only_run(services, schedule.id)))
    assert badge_text((await http.get("/schedules/once")).text, "schedule-state") == "finished"


async def test_the_overview_flags_halted_rollouts_held_tasks_and_paused_schedules(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1", "r2", "r3")
    quiet = (await http.get("/")).text
    assert (
        not tagged(quiet, "halted-row") and not tagged(quiet, "held-row") and not tagged(quiet, "paused-row")
    )

    policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1)
    fw = await make_schedule(services, "fw", "r1", "r2", rollout=policy)
    (first,) = await services.schedules.trigger(fw.id)
    await end_task(services, first, TaskStatus.FAILED)
    await services.rollouts.advance()
    weekly = await make_schedule(services, "weekly", "r3")
    await services.schedules.pause(weekly.id, reason="PSU swap")
    held_schedule = await make_schedule(services, "held", "r3")
    (held,) = await services.schedules.trigger(held_schedule.id)
    async with services.db.transaction() as conn:
        await conn.execute(
            update(tasks)
            .where(tasks.c.id == held)
            .values(not_before=START + timedelta(hours=2), message="waits for freeze 'xmas' to end")
        )

    page = (await http.get("/")).text
    (halted,) = tagged(page, "halted-link")
    assert attribute(halted, "href") == f"/runs/{await only_run(services, fw.id)}"
    assert "rollout halted: 1 of 2 racks failed" in page
    assert len(tagged(page, "held-row")) == 1 and "waits for freeze &#39;xmas&#39; to end" in page
    held_row = re.sub(r"<[^>]+>", " ", page[page.index('data-testid="held-row"') :])
    assert "held at most until" in held_row  # the hold's end (`not_before`), no start time
    paused = re.sub(r"<[^>]+>", " ", page[page.index('data-testid="flag-paused"') :])
    assert "weekly" in paused and "PSU swap" in paused and "fw" in paused  # the halt paused fw too


async def test_the_timeline_counts_a_dense_schedule_to_the_end_of_its_horizon(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "every-2m", "r1", spec=ScheduleSpec(SpecType.INTERVAL, "2m"))
    await make_schedule(services, "daily", "r1", spec=ScheduleSpec(SpecType.INTERVAL, "24h"))
    page = (await http.get("/")).text
    rows = {attribute(t, "data-name"): int(attribute(t, "data-firings")) for t in tagged(page, "axis-row")}
    assert rows == {"every-2m": 720, "daily": 1}
    marks = [int(attribute(t, "data-count")) for t in tagged(page, "axis-mark")]
    assert len(marks) == overview.SLOTS + 1 and sum(marks) == 721  # every slot, to the end: not 96 firings
    last = re.findall(r'<circle cx="([\d.]+)"', page)
    assert max(float(x) for x in last) > overview.AXIS_WIDTH * 0.99


async def test_firings_show_in_the_schedules_zone(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")  # 02:00 Europe/Berlin
    page = (await http.get("/schedules/nightly")).text
    own = re.findall(r'data-testid="zone-own" title="Europe/Berlin">([^<]*)<', page)
    assert own[0] == "2026-03-03 02:00 CET"  # the next run; the viewer's zone is filled in beside it
    assert all(text.endswith("02:00 CET") for text in own[1:9])  # the upcoming firings
    assert 'data-mode="beside" data-zone="Europe/Berlin"' in page
    listing = (await http.get("/schedules")).text
    assert "2026-03-03 02:00 CET" in listing


async def test_audit_targets_are_names_with_links(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1")
    schedule = await make_schedule(services, "nightly", "r1")
    await http.post("/api/v1/schedules/nightly:pause", json={"reason": "PSU"})
    (task_id,) = (await http.post("/api/v1/schedules/nightly:trigger")).json()["task_ids"]
    page = (await http.get("/audit")).text
    targets = {(attribute(t, "data-kind"), attribute(t, "href")) for t in tagged(page, "audit-target")}
    assert ("schedule", f"/schedules/{schedule.id}") in targets
    assert ("task", f"/tasks/{task_id['id']}") in targets
    text = re.sub(r"<[^>]+>", " ", page)
    assert "schedule  nightly" in text and "Power Reset on r1" in text
    assert str(schedule.id)[:8] + "<" not in page  # never an 8-character prefix


async def test_a_held_task_is_flagged_when_deferred_to_a_window_too(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1")
    schedule = await make_schedule(services, "deferred", "r1")
    (task_id,) = await services.schedules.trigger(schedule.id)
    (task,) = await services.tasks.get_tasks([task_id])
    opening = replace(task.operation, window_start=START + timedelta(hours=5))
    async with services.db.transaction() as conn:
        await conn.execute(update(tasks).where(tasks.c.id == task_id).values(parameters=opening.to_json()))
    page = (await http.get("/")).text
    (row,) = tagged(page, "held-row")
    assert f'href="/tasks/{task_id}"' in page[page.index('data-testid="flag-held"') :]
    assert row


def link_texts(html: str, testid: str) -> list[str]:
    """The text of each link with data-testid `testid`, in page order."""
    return re.findall(rf'<a [^>]*data-testid="{testid}"[^>]*>([^<]*)</a>', html)


async def test_the_tasks_of_one_firing_are_told_apart_by_their_short_ids(
    http: httpx.AsyncClient, services: Services
) -> None:
    """Ids are version 7 UUIDs, which start with the millisecond they were made: the first 8 characters
    of every task of a firing are the same, so a short id is the end of the id, and the whole on hover."""
    await make_racks(services, "r1", "r2", "r3")
    schedule = await make_schedule(services, "nightly", "r1", "r2", "r3")
    task_ids = [str(t) for t in await services.schedules.trigger(schedule.id)]
    run_id = await only_run(services, schedule.id)
    assert len({t[:8] for t in task_ids}) == 1  # what a prefix would show, for each of them

    run_page = (await http.get(f"/runs/{run_id}")).text
    tasks_page = (await http.get("/tasks")).text
    for page, testid in ((run_page, "run-task-link"), (tasks_page, "task-link")):
        shown = link_texts(page, testid)
        assert sorted(shown) == sorted(t[-8:] for t in task_ids), (testid, shown)
        assert {attribute(t, "title") for t in tagged(page, testid)} == set(task_ids)
    cancels = [attribute(t, "data-confirm-title") for t in tagged(tasks_page, "action-cancel")]
    named = {re.sub(r"^Cancel the power reset task (\w{8}) on r\d\?$", r"\1", c) for c in cancels}
    assert named == {t[-8:] for t in task_ids}, cancels
    task_page = (await http.get(f"/tasks/{task_ids[0]}")).text
    assert f"<title>Task {task_ids[0][-8:]} · rackflow</title>" in task_page
