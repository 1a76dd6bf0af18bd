"""Pre-flight checks over HTTP: the JSON routes (list, one by name, the override of a task's checks with
its bad input), and a task the pre-flight gate holds showing who holds it and why on its page."""

from __future__ import annotations

import uuid
from datetime import timedelta

import httpx

from rackflow.checks.service import CheckInput
from rackflow.domain.checks import WebhookSettings
from rackflow.domain.inventory import RackSelection
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions
from rackflow.services import Services
from rackflow.store import task_runs
from rackflow.tasks.gates import consult
from tests.web.conftest import make_racks
from tests.web.test_json_api import API, error_of
from tests.web.test_pages import tagged


async def test_checks_routes_and_a_held_task_on_its_page(http: httpx.AsyncClient, services: Services) -> None:
    [rack_id] = await make_racks(services, "r1")
    await services.checks.create(
        CheckInput(name="drained", settings=WebhookSettings("http://127.0.0.1:9/", "", ""))
    )
    assert [c["name"] for c in (await http.get(f"{API}/checks")).json()["checks"]] == ["drained"]
    assert (await http.get(f"{API}/checks/drained")).json()["webhook"]["timeout"] == "10s"
    [row] = tagged((await http.get("/windows")).text, "check-row")
    assert 'data-name="drained"' in row
    error_of(await http.get(f"{API}/checks/nope"), 404, "NOT_FOUND", "id")

    [task] = await services.tasks.submit(
        Operation(OperationKind.POWER_ON), [RackSelection(rack_id)], description="", queue=QueueOptions()
    )
    owner = uuid.uuid4()
    async with services.db.transaction() as conn:
        now = services.clock.now()
        claimed = await task_runs.claim(
            services.db,
            conn,
            owner_id=owner,
            lease_ttl=timedelta(seconds=15),
            running_here=(),
            now=now,
            limit=9,
        )
        gated = await consult(services.gates, conn, claimed, owner_id=owner, now=now)
    assert gated.claimed == []
    page = (await http.get(f"/tasks/{task.id}")).text
    [held] = tagged(page, "task-held")
    assert "preflight since" in page and "waits for pre-flight checks &#39;drained&#39;" in page, held

    error_of(
        await http.post(f"{API}/tasks/{task.id}:override-checks", json={}), 400, "INVALID_ARGUMENT", "reason"
    )
    answer = await http.post(f"{API}/tasks/{task.id}:override-checks", json={"reason": "INC-1"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["held_reason"] == "pre-flight checks overridden: INC-1"
