"""Pages offer an action only to a role that may do it: a viewer sees no Pause, Resume, Trigger or Cancel
button (each would end in a 403); an operator sees them all. The rule is the API's (`authorize`)."""

from __future__ import annotations

import httpx
import pytest

from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import TaskStatus
from rackflow.security import TokenTable
from rackflow.services import Services
from tests.api.secured import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN
from tests.web.conftest import end_task, make_racks, make_schedule
from tests.web.test_pages import FRAGMENT, tagged

ACTIONS = (
    "action-pause",
    "action-resume",
    "action-trigger",
    "action-cancel",
    "action-resume-run",
    "action-cancel-run",
)


@pytest.fixture
def tokens() -> TokenTable | None:
    return TOKENS


async def pages(http: httpx.AsyncClient, services: Services, token: str) -> dict[str, set[str]]:
    """Which action buttons each page shows to the holder of `token`."""
    await make_racks(services, "r1", "r2", "r3")
    fw = await make_schedule(
        services, "fw", "r1", "r2", rollout=RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1)
    )
    (first,) = await services.schedules.trigger(fw.id)
    await end_task(services, first, TaskStatus.FAILED)
    await services.rollouts.advance()  # halted: Resume and Cancel rollout
    nightly = await make_schedule(services, "nightly", "r3")
    (pending,) = await services.schedules.trigger(nightly.id)  # an active task: Cancel
    runs, _ = await services.schedules.list_runs(fw.id, limit=1)
    headers = {"Authorization": f"Bearer {token}", **FRAGMENT}
    paths = {
        "halted schedule": "/schedules/fw",
        "schedule": "/schedules/nightly",
        "run": f"/runs/{runs[0].id}",
        "tasks": "/tasks",
        "task": f"/tasks/{pending}",
    }
    shown = {}
    for name, path in paths.items():
        page = await http.get(path, headers=headers)
        assert page.status_code == 200, page.text
        shown[name] = {a for a in ACTIONS if tagged(page.text, a)}
    return shown


async def test_a_viewer_sees_no_action(http: httpx.AsyncClient, services: Services) -> None:
    shown = await pages(http, services, VIEWER_TOKEN)
    assert shown == {"halted schedule": set(), "schedule": set(), "run": set(), "tasks": set(), "task": set()}


async def test_an_operator_sees_every_action(http: httpx.AsyncClient, services: Services) -> None:
    shown = await pages(http, services, OPERATOR_TOKEN)
    assert shown["halted schedule"] == {
        "action-resume",
        "action-trigger",
        "action-resume-run",
        "action-cancel-run",
    }
    assert shown["schedule"] == {"action-pause", "action-trigger"}
    assert shown["run"] == {"action-resume-run", "action-cancel-run"}
    assert shown["tasks"] == shown["task"] == {"action-cancel"}
