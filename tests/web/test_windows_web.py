"""Maintenance windows over HTTP (both databases): the JSON API endpoints and the dashboard's windows page
and schedule page."""

from __future__ import annotations

import html
import re
import uuid
from datetime import timedelta

import httpx

from rackflow.budgets.service import BudgetInput
from rackflow.domain.inventory import RackSelection
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions
from rackflow.domain.windows import OneOff, Recurring, WindowKind, WindowPolicy
from rackflow.services import Services
from rackflow.store import task_runs
from rackflow.windows.service import Ref, WindowInput
from tests.web.conftest import make_racks, make_schedule

API = "/api/v1"


async def make_windows(services: Services) -> None:
    now = services.clock.now()
    await services.windows.create(
        WindowInput(
            name="sat-night",
            kind=WindowKind.ALLOW,
            when=Recurring("0 22 * * 6", "6h", "Europe/Berlin"),
            racks=(Ref(name="r1"),),
            reason="agreed with the tenants",
        )
    )
    await services.windows.create(
        WindowInput(
            name="launch",
            kind=WindowKind.FREEZE,
            when=OneOff(now - timedelta(hours=1), now + timedelta(hours=2)),
        )
    )


async def test_json_api_lists_gets_and_previews_windows(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2")
    await make_windows(services)
    listed = (await http.get(f"{API}/windows")).json()
    assert [w["name"] for w in listed["windows"]] == ["launch", "sat-night"]
    on_r2 = (await http.get(f"{API}/windows", params={"rack": "r2"})).json()
    assert [w["name"] for w in on_r2["windows"]] == ["launch"]
    one = (await http.get(f"{API}/windows/sat-night")).json()
    assert one["kind"] == "WINDOW_KIND_ALLOW" and one["recurring"]["duration"] == "6h"
    assert one["racks"][0]["name"] == "r1"
    events = (await http.get(f"{API}/racks/r1/windows", params={"count": 3})).json()["events"]
    assert [(e["window_name"], e["change"]) for e in events] == [
        ("launch", "closes"),
        ("sat-night", "opens"),
        ("sat-night", "closes"),
    ]
    missing = await http.get(f"{API}/windows/nope")
    assert missing.status_code == 404 and missing.json()["field"] == "id"
    bad = await http.get(f"{API}/windows", params={"colour": "red"})
    assert bad.status_code == 400 and bad.json()["field"] == "colour"


async def test_json_api_schedule_decisions(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2")
    await make_windows(services)
    await make_schedule(services, "nightly", "r1", "r2")
    firings = (await http.get(f"{API}/schedules/nightly/decisions", params={"count": 2})).json()["firings"]
    assert len(firings) == 2
    assert {d["rack_name"] for f in firings for d in f["scopes"]} == {"r1", "r2"}
    assert all(d["decision"] in ("fire", "skip_window") for f in firings for d in f["scopes"])


async def test_windows_page_and_the_schedule_page_show_windows(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1", "r2")
    await make_windows(services)
    schedule = await make_schedule(services, "nightly", "r1")
    await services.schedules.update(schedule.id, ["schedule.window_policy"], window_policy=WindowPolicy.DEFER)
    page = (await http.get("/windows")).text
    rows = re.findall(r'<tr data-testid="window-row" data-name="([^"]+)">(.*?)</tr>', page, re.S)
    text = {name: html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))) for name, body in rows}
    assert list(text) == ["launch", "sat-night"]
    assert "freeze" in text["launch"] and "open until" in text["launch"] and "all racks" in text["launch"]
    assert 'cron "0 22 * * 6" Europe/Berlin for 6h' in text["sat-night"] and "r1" in text["sat-night"]
    assert 'href="/windows"' in page  # in the navigation
    schedule_page = (await http.get(f"/schedules/{schedule.id}")).text
    policy = re.search(r'data-testid="schedule-window-policy">(.*?)</dd>', schedule_page, re.S)
    assert policy is not None and policy.group(1).startswith("defer")


async def test_a_rack_page_lists_the_windows_covering_it(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2")
    await make_windows(services)
    for rack, names in (("r1", ["launch", "sat-night"]), ("r2", ["launch"])):
        page = (await http.get(f"/racks/{rack}")).text
        section = re.search(r'data-testid="rack-windows">(.*?)</ul>', page, re.S)
        assert section is not None
        assert re.findall(r'<li data-name="([^"]+)">', section.group(1)) == names
    assert "<strong>open</strong> until" in (await http.get("/racks/r2")).text


async def test_the_windows_page_lists_operation_budgets_with_what_runs(
    http: httpx.AsyncClient, services: Services
) -> None:
    empty = (await http.get("/windows")).text
    assert "No operation budgets" in empty
    r1, r2 = await make_racks(services, "r1", "r2")
    await services.budgets.create(BudgetInput("power", (OperationKind.POWER_OFF,), 2, 1))
    await services.budgets.create(BudgetInput("fw", (OperationKind.UPGRADE_FIRMWARE,), 8))
    tasks = await services.tasks.submit(
        Operation(OperationKind.POWER_OFF),
        [RackSelection(r1), RackSelection(r2)],
        description="",
        queue=QueueOptions(),
    )
    async with services.db.transaction() as conn:
        await task_runs.mark_running(conn, tasks[0].id, owner_id=uuid.uuid4(), now=services.clock.now())
    page = (await http.get("/windows")).text
    rows = re.findall(r'<tr data-testid="budget-row" data-name="([^"]+)">(.*?)</tr>', page, re.S)
    text = {name: html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))) for name, body in rows}
    assert list(text) == ["fw", "power"]
    assert (
        "power_off" in text["power"]
        and "1 of 2" in text["power"]
        and "1 of 1 in the fullest" in text["power"]
    )
    assert "upgrade_firmware" in text["fw"] and "0 of 8" in text["fw"] and "—" in text["fw"]
