"""The console's words (both databases): a list page refuses a filter value it does not know, as the tasks
list does, rather than list everything."""

from __future__ import annotations

import html
import re

import httpx

from rackflow.services import Services
from tests.web.conftest import make_racks, make_schedule
from tests.web.test_pages import tagged


def words(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


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
