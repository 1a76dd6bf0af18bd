"""Pages offer an action only to a role that may do it: a viewer sees no Pause, Resume, Trigger or Cancel
button (each would end in a 403); an operator sees them all. The rule is the API's (`authorize`). Nor is an
operator offered a weaker approval gate for a schedule that has one (`check_may_weaken`)."""

from __future__ import annotations

import re
from datetime import timedelta

import httpx
import pytest

from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import TaskStatus
from rackflow.security import TokenTable
from rackflow.services import Services
from tests.api.secured import OPERATOR_TOKEN, VIEWER_TOKEN
from tests.api.test_approvals_api import LEAD_TOKEN, TOKENS
from tests.web.conftest import end_task, make_racks, make_schedule
from tests.web.test_pages import FRAGMENT, attribute, tagged, tagged_text

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
    """A viewer's, an operator's (`oncall`) and approvers' (`lead`, `second`)."""
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


def disabled(tag: str) -> bool:
    return re.search(r"\sdisabled[\s>]", tag) is not None


async def test_an_operator_is_offered_no_weaker_approval_gate(
    http: httpx.AsyncClient, services: Services
) -> None:
    """An operator's edit form of a schedule with an approval policy keeps approval on and its approvers
    needed no fewer than now, and its page's Delete is disabled, each saying why; an approver is offered
    all of it, and so is an operator for a schedule without a policy (the server refuses the rest anyway:
    tests/web/test_json_writes.py)."""
    await make_racks(services, "r1")
    await make_schedule(services, "gated", "r1", approval=ApprovalPolicy(timedelta(hours=4), min_approvers=2))
    await make_schedule(services, "open", "r1")

    async def shown(path: str, token: str) -> str:
        page = await http.get(path, headers={"Authorization": f"Bearer {token}", **FRAGMENT})
        assert page.status_code == 200, page.text
        return page.text

    why = "Only the approver role may remove or lower this schedule's approval (docs/SAFETY.md)"
    form = await shown("/schedules/gated/edit", OPERATOR_TOKEN)
    (box,) = tagged(form, "form-approval-on")
    assert "checked" in box and disabled(box)
    (needed,) = tagged(form, "form-approval-min_approvers")
    assert [attribute(needed, name) for name in ("type", "min", "value")] == ["number", "2", "2"]
    assert why in tagged_text(form, "approval-locked")
    page = await shown("/schedules/gated", OPERATOR_TOKEN)
    (delete,) = tagged(page, "action-delete")
    assert disabled(delete) and "data-post" not in delete
    assert "Only the approver role may delete this schedule" in tagged_text(page, "delete-locked")

    for path, token in (("/schedules/gated", LEAD_TOKEN), ("/schedules/open", OPERATOR_TOKEN)):
        form = await shown(f"{path}/edit", token)
        (box,) = tagged(form, "form-approval-on")
        (needed,) = tagged(form, "form-approval-min_approvers")
        assert not disabled(box) and "min=" not in needed and not tagged(form, "approval-locked")
        page = await shown(path, token)
        (delete,) = tagged(page, "action-delete")
        assert not disabled(delete) and "data-post" in delete and not tagged(page, "delete-locked")


async def test_an_operator_s_preview_of_a_weaker_gate_is_refused_beside_the_field(
    http: httpx.AsyncClient, services: Services
) -> None:
    """The edit form's preview (`POST /previews/schedule` with the schedule's id) of approvers needed typed
    lower than now is refused to an operator as its save would be, naming `schedule.approval`, which the
    form has a place for beside the approval fields; an approver's is answered."""
    await make_racks(services, "r1")
    gated = await make_schedule(
        services, "gated", "r1", approval=ApprovalPolicy(timedelta(hours=4), min_approvers=2)
    )
    draft = {
        "schedule": {
            "name": "gated",
            "spec": {"type": "SCHEDULE_SPEC_TYPE_INTERVAL", "spec": "6h"},
            "approval": {"required": True, "timeout": "4h", "min_approvers": 1},
        },
        "operation": {"power_reset": {"target_spec": {"racks": {"targets": [{"name": "r1"}]}}}},
    }
    body = {"id": {"id": str(gated.id)}, "draft": draft, "count": 1}

    def as_(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    answer = await http.post("/previews/schedule", json=body, headers=as_(OPERATOR_TOKEN))
    assert answer.status_code == 403, answer.text
    assert answer.json() == {
        "code": "PERMISSION_DENIED",
        "message": "schedule.approval: lowering the approvers schedule 'gated' needs from 2 to 1 needs the "
        "approver role: the operator role of 'oncall' may not weaken the approval of runs it may not approve",
        "field": "schedule.approval",
    }
    form = await http.get("/schedules/gated/edit", headers={**as_(OPERATOR_TOKEN), **FRAGMENT})
    assert tagged(form.text, "error-schedule.approval")
    answer = await http.post("/previews/schedule", json=body, headers=as_(LEAD_TOKEN))
    assert answer.status_code == 200, answer.text
    assert [f["needs_approval"] for f in answer.json()["firings"]] == [True]
