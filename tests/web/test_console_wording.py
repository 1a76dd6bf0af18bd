"""The console's words (both databases): a list page refuses a filter value it does not know, as the tasks
list does, rather than list everything; and a count of one is said in the singular everywhere."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import httpx

from rackflow.domain.tasks import TaskStatus
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.services import Services
from rackflow.windows.service import WindowInput
from tests.web.conftest import end_task, make_racks, make_schedule
from tests.web.test_pages import tagged


def words(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def test_counted_says_one_in_the_singular() -> None:
    from rackflow.words import counted  # the one helper every page's counts go through

    assert [counted(n, "rack") for n in (0, 1, 2)] == ["0 racks", "1 rack", "2 racks"]
    assert counted(1, "delivery", "deliveries") == "1 delivery"
    assert counted(3, "delivery", "deliveries") == "3 deliveries"
    assert counted("10,000+", "event") == "10,000+ events"  # a capped count is many


async def test_an_unknown_filter_value_is_refused_as_the_tasks_list_refuses_one(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")
    tasks = await http.get("/tasks?status=bogus")
    assert tasks.status_code == 400 and tagged(tasks.text, "page-error")
    schedules = await http.get("/schedules?state=bogus")
    assert schedules.status_code == 400 and tagged(schedules.text, "page-error")
    assert "state: &#39;bogus&#39; is not a schedule state (all, enabled, paused)" in schedules.text
    assert (await http.get("/schedules?op=bogus")).status_code == 400  # as the other filters already were
    backwards = await http.get("/schedules?dir=sideways")
    assert backwards.status_code == 400 and tagged(backwards.text, "page-error")
    for state in ("", "all", "enabled", "paused"):
        assert (await http.get(f"/schedules?state={state}")).status_code == 200


async def test_a_count_of_one_is_singular_on_every_page(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1")
    now = services.clock.now()
    await services.windows.create(
        WindowInput(
            name="launch",
            kind=WindowKind.FREEZE,
            when=OneOff(now + timedelta(days=1), now + timedelta(days=2)),
        )
    )
    schedule = await make_schedule(services, "nightly", "r1")
    [task] = await services.schedules.trigger(schedule.id)
    await end_task(services, task, TaskStatus.FAILED)
    [run] = (await services.schedules.recent_runs([schedule.id], 1))[schedule.id]
    pages = {
        "/racks": ["1 rack"],
        "/windows": ["1 window"],
        f"/schedules/{schedule.id}": ["1 rack"],
        f"/runs/{run.id}": ["1 rack:"],
        "/audit": [],
        "/notifications": ["0 channels", "0 dead deliveries"],
        "/": ["1 failed task"],
        "/schedules": ["last 1 firing:"],
    }
    for url, expected in pages.items():
        page = await http.get(url)
        assert page.status_code == 200, url
        text = words(page.text)
        for phrase in expected:
            assert phrase in text, (url, phrase, text)
        many = r"(?<![\d,.])1 (racks|windows|events|channels|firings|schedules|tasks)\b"
        assert not re.search(many, text), (url, text)
        assert "(s)" not in text, (url, text)
