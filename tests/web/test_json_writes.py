"""The JSON API's create, update and delete routes, on both databases: each runs its RPC (the same
validation, roles and audit as gRPC), a PATCH's update mask is the fields it gives, bad input names the
field in the API's words, and a viewer is refused without anything written."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from rackflow.api.audit import AuditInterceptor
from rackflow.domain.approvals import ApprovalPolicy
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.tasks.backends.redfish.backend import RedfishBackend
from rackflow.tasks.backends.redfish.config import RedfishConfig
from rackflow.web.app import build_app
from rackflow.web.security import HttpSecurity
from tests.api.secured import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN
from tests.api.test_approvals_api import LEAD_TOKEN
from tests.api.test_approvals_api import TOKENS as APPROVAL_TOKENS
from tests.conftest import table_counts
from tests.web.conftest import BASE_URL, make_racks, make_schedule

API = "/api/v1"

CREATE_SCHEDULE: dict[str, Any] = {
    "schedule": {
        "name": "web-made",
        "spec": {"type": "SCHEDULE_SPEC_TYPE_CRON", "spec": "0 3 * * *", "timezone": "Europe/Berlin"},
        "overlap_policy": "OVERLAP_POLICY_SKIP",
    },
    "operation": {"power_on": {"target_spec": {"racks": {"targets": [{"name": "r1"}, {"name": "r2"}]}}}},
}
CREATE_WINDOW: dict[str, Any] = {
    "window": {
        "name": "sat-night",
        "kind": "WINDOW_KIND_ALLOW",
        "recurring": {"cron": "0 22 * * 6", "duration": "6h", "timezone": "Europe/Berlin"},
        "racks": [{"name": "r1"}],
        "reason": "agreed with the tenants",
    }
}
CREATE_BUDGET: dict[str, Any] = {
    "budget": {"name": "fw", "operations": ["upgrade_firmware"], "max_running": 4}
}


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def refused(response: httpx.Response, status: int, field: str | None, words: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["field"] == field and words in body["message"], body
    assert "Available Fields" not in body["message"]
    return str(body["message"])


async def audit_rows(http: httpx.AsyncClient) -> list[tuple[str, str]]:
    """(method, outcome) of every audit event, sorted (the fake clock stands still, so time orders none)."""
    events = ok(await http.get(f"{API}/audit"))["events"]
    return sorted((e["method"], e["outcome"]) for e in events)


def mask_of(event: dict[str, Any]) -> str:
    """The update mask the audited request carried (protobuf JSON: a comma-separated string)."""
    request = json.loads(event["request_json"])
    return str(request.get("updateMask", request.get("update_mask")))


@pytest.fixture
async def viewer(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    """The same app with tokens, as the `viewer` role."""
    app = build_app(services, AuditInterceptor(services.audit), TOKENS, services.clock, HttpSecurity())
    headers = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=headers) as client:
        yield client


async def viewer_is_refused(
    viewer: httpx.AsyncClient, db: Database, method: str, path: str, body: Any = None
) -> None:
    before = await table_counts(db)
    response = await viewer.request(method, API + path, json=body)
    assert response.status_code == 403 and response.json()["code"] == "PERMISSION_DENIED", response.text
    assert "needs the operator role" in response.json()["message"]
    counts = await table_counts(db)
    # Nothing changed but the trail, which records the refusal by role, as over gRPC (test_auth.py).
    assert counts.pop("audit_events") == before.pop("audit_events") + 1
    assert counts == before


# --- schedules -----------------------------------------------------------------------------------


async def test_create_update_and_delete_a_schedule(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2")
    made = ok(await http.post(f"{API}/schedules", json=CREATE_SCHEDULE))
    assert made["name"] == "web-made" and made["operation_type"] == "power_on" and made["enabled"] is True
    scopes = ok(await http.get(f"{API}/schedules/web-made/scopes"))["scopes"]
    assert len(scopes) == 2

    # Only the fields given change: the name, and the zone alone (schedule.spec.timezone).
    patch = {"schedule": {"name": "web-renamed", "spec": {"timezone": "UTC"}}}
    changed = ok(await http.patch(f"{API}/schedules/web-made", json=patch))
    assert changed["name"] == "web-renamed" and changed["spec"]["spec"] == "0 3 * * *"
    assert changed["spec"]["timezone"] == "UTC" and changed["overlap_policy"] == "OVERLAP_POLICY_SKIP"
    rollout = {"schedule": {"rollout": {"max_concurrent_racks": 1}, "windowPolicy": "WINDOW_POLICY_DEFER"}}
    changed = ok(await http.patch(f"{API}/schedules/web-renamed", json=rollout))
    assert (
        changed["rollout"]["max_concurrent_racks"] == 1 and changed["window_policy"] == "WINDOW_POLICY_DEFER"
    )
    assert not ok(await http.patch(f"{API}/schedules/web-renamed", json={"schedule": {"rollout": None}})).get(
        "rollout"
    )

    assert ok(await http.delete(f"{API}/schedules/web-renamed")) == {}
    refused(await http.get(f"{API}/schedules/web-renamed"), 404, "id", "no task schedule named 'web-renamed'")
    assert await audit_rows(http) == [
        ("CreateTaskSchedule", "OK"),
        ("DeleteTaskSchedule", "OK"),
        ("UpdateTaskSchedule", "OK"),
        ("UpdateTaskSchedule", "OK"),
        ("UpdateTaskSchedule", "OK"),
    ]
    events = ok(await http.get(f"{API}/audit", params={"method": "UpdateTaskSchedule", "limit": 3}))["events"]
    masks = sorted(mask_of(e) for e in events)
    assert masks == sorted(
        [
            "schedule.name,schedule.spec.timezone",
            "schedule.rollout,schedule.windowPolicy",  # protobuf JSON: camelCase
            "schedule.rollout",
        ]
    )


async def test_a_bake_without_canaries_is_refused_on_create_and_update(
    http: httpx.AsyncClient, services: Services
) -> None:
    """The web form's rollout fields post this JSON: a bake time with no canary racks did nothing (the bake
    is the wait after the canaries), yet was stored, and the operator believed the rollout paused."""
    await make_racks(services, "r1", "r2")
    body = json.loads(json.dumps(CREATE_SCHEDULE))
    body["schedule"]["rollout"] = {"bake_time": "15m", "max_concurrent_racks": 1}
    field = "schedule.rollout.bake_time"
    refused(await http.post(f"{API}/schedules", json=body), 400, field, "applies with canary_racks")
    body["schedule"]["rollout"]["canary_racks"] = 1
    assert ok(await http.post(f"{API}/schedules", json=body))["rollout"]["canary_racks"] == 1
    patch = {"schedule": {"rollout": {"bake_time": "20m"}}}
    words = "applies with canary_racks"
    refused(await http.patch(f"{API}/schedules/web-made", json=patch), 400, field, words)
    assert ok(await http.get(f"{API}/schedules/web-made"))["rollout"]["bake_time"] == "15m"


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (
            lambda b: b["schedule"]["spec"].update(type="SCHEDULE_SPEC_TYPE_WEEKLY"),
            "schedule.spec.type",
            "expected one of SCHEDULE_SPEC_TYPE_UNSPECIFIED",
        ),
        (
            lambda b: b["schedule"]["spec"].update(spek="x"),
            "schedule.spec.spek",
            "schedule.spec.spek: unknown field (schedule.spec takes: type, spec, timezone)",
        ),
        (lambda b: b["schedule"]["spec"].update(spec="0 3 * *"), "schedule.spec.spec", "0 3 * *"),
        (
            lambda b: b["schedule"]["spec"].update(timezone="Mars/Olympus"),
            "schedule.spec.timezone",
            "Mars/Olympus",
        ),
        (lambda b: b["schedule"].update(name=7), "schedule.name", "schedule.name: expected a string, got 7"),
        (lambda b: b["operation"].update(power_off={}), "operation.power_off", "only one of"),
        (
            lambda b: b["operation"]["power_on"]["target_spec"]["racks"].update(targets={"name": "r1"}),
            "operation.power_on.target_spec.racks.targets",
            "expected a list",
        ),
        (
            lambda b: b.update(
                operation={
                    "upgrade_firmware": {
                        "target_spec": {"racks": {"targets": [{"name": "r1"}]}},
                        "target_version": "2.1",
                        "end_time": "2026-03-01T00:00:00Z",
                    }
                }
            ),
            "operation.upgrade_firmware.end_time",
            "has passed (now 2026-03-02T12:00:02Z): every firing's upgrade would be too late to start",
        ),
    ],
)
async def test_a_bad_schedule_names_the_field_and_writes_nothing(
    http: httpx.AsyncClient, services: Services, db: Database, change: Any, field: str, words: str
) -> None:
    await make_racks(services, "r1", "r2")
    body: dict[str, Any] = {
        "schedule": {**CREATE_SCHEDULE["schedule"], "spec": dict(CREATE_SCHEDULE["schedule"]["spec"])},
        "operation": {"power_on": {"target_spec": {"racks": {"targets": [{"name": "r1"}]}}}},
    }
    change(body)
    before = await table_counts(db)
    refused(await http.post(f"{API}/schedules", json=body), 400, field, words)
    counts = await table_counts(db)
    assert counts.pop("audit_events") - before.pop("audit_events") <= 1  # a refused RPC is audited
    assert counts == before


async def test_a_firmware_schedule_the_backend_cannot_run_is_refused(
    http: httpx.AsyncClient, services: Services, db: Database
) -> None:
    await make_racks(services, "r1")
    services.tasks.backend = RedfishBackend(RedfishConfig())  # no RACKFLOW_REDFISH_IMAGE_URI
    firmware = {"target_spec": {"racks": {"targets": [{"name": "r1"}]}}, "target_version": "2.1"}
    body = {"schedule": CREATE_SCHEDULE["schedule"], "operation": {"upgrade_firmware": firmware}}
    before = await table_counts(db)
    field = "operation.upgrade_firmware.target_version"
    refused(await http.post(f"{API}/schedules", json=body), 412, field, "RACKFLOW_REDFISH_IMAGE_URI")
    counts = await table_counts(db)
    assert counts.pop("audit_events") - before.pop("audit_events") <= 1  # a refused RPC is audited
    assert counts == before


async def test_a_patch_names_what_it_may_change(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")
    path = f"{API}/schedules/nightly"
    refused(await http.patch(path, json={}), 400, "schedule", "schedule: give the fields to change")
    refused(
        await http.patch(path, json={"schedule": {"colour": "red"}}), 400, "schedule.colour", "unknown field"
    )
    refused(
        await http.patch(path, json={"schedule": {"name": "x"}, "update_mask": "schedule.spec"}),
        400,
        "update_mask",
        "update_mask: set by the URL path",
    )
    refused(await http.patch(path, json={"schedule": {"name": ""}}), 400, "schedule.name", "schedule.name")
    refused(await http.patch(f"{API}/schedules/ghost", json={"schedule": {"name": "x"}}), 404, "id", "ghost")


async def test_a_viewer_may_not_create_change_or_delete_a_schedule(
    http: httpx.AsyncClient, viewer: httpx.AsyncClient, services: Services, db: Database
) -> None:
    await make_racks(services, "r1", "r2")
    await make_schedule(services, "nightly", "r1")
    await viewer_is_refused(viewer, db, "POST", "/schedules", CREATE_SCHEDULE)
    await viewer_is_refused(viewer, db, "PATCH", "/schedules/nightly", {"schedule": {"name": "x"}})
    await viewer_is_refused(viewer, db, "DELETE", "/schedules/nightly")
    await viewer_is_refused(viewer, db, "POST", "/schedules/nightly/scopes", {"target_spec": {}})
    await viewer_is_refused(viewer, db, "PUT", "/schedules/nightly/scopes", {"desired_scope": {}})


@pytest.fixture
async def tokened(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    """The same app with tokens of every role (tests/api/test_approvals_api.py's: `oncall` is an operator,
    `lead` an approver); each request gives its own."""
    app = build_app(
        services, AuditInterceptor(services.audit), APPROVAL_TOKENS, services.clock, HttpSecurity()
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as client:
        yield client


async def test_only_an_approver_may_remove_lower_or_delete_a_schedule_s_approval_policy(
    tokened: httpx.AsyncClient, services: Services, db: Database
) -> None:
    """The console's edit form and its Delete post these: an operator's removal, lowering or delete of a
    gated schedule is refused 403 naming the field, writes nothing but its audit row; an approver's goes."""
    await make_racks(services, "r1")
    await make_schedule(services, "gated", "r1", approval=ApprovalPolicy(timedelta(hours=4), min_approvers=2))
    oncall = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    lead = {"Authorization": f"Bearer {LEAD_TOKEN}"}
    lower = {"schedule": {"approval": {"required": True, "timeout": "4h", "min_approvers": 1}}}
    path = f"{API}/schedules/gated"
    before = await table_counts(db)
    messages = [
        refused(
            await tokened.patch(path, json={"schedule": {"approval": None}}, headers=oncall),
            403,
            "schedule.approval",
            "removing the approval policy (2 approvers within 4h) of schedule 'gated' needs the approver",
        ),
        refused(
            await tokened.patch(path, json=lower, headers=oncall),
            403,
            "schedule.approval",
            "lowering the approvers schedule 'gated' needs from 2 to 1 needs the approver role",
        ),
        refused(
            await tokened.delete(path, headers=oncall),
            403,
            "id",
            "deleting schedule 'gated', whose runs need approval (2 approvers within 4h), needs the approver",
        ),
    ]
    counts = await table_counts(db)
    assert counts.pop("audit_events") == before.pop("audit_events") + 3
    assert counts == before
    events = ok(await tokened.get(f"{API}/audit", headers=oncall))["events"]
    assert sorted((e["principal"], e["method"], e["outcome"], e["error"]) for e in events) == sorted(
        ("oncall", method, "PERMISSION_DENIED", message)
        for method, message in zip(
            ("UpdateTaskSchedule", "UpdateTaskSchedule", "DeleteTaskSchedule"), messages, strict=True
        )
    )

    assert ok(await tokened.patch(path, json=lower, headers=lead))["approval"]["min_approvers"] == 1
    assert ok(await tokened.delete(path, headers=lead)) == {}


async def test_scopes_are_added_replaced_and_removed(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2", "r3")
    await make_schedule(services, "nightly", "r1")
    add = {
        "target_spec": {"racks": {"targets": [{"name": "r2", "component_types": ["COMPONENT_TYPE_COMPUTE"]}]}}
    }
    added = ok(await http.post(f"{API}/schedules/nightly/scopes", json=add))["scopes"]
    assert [s["types"]["types"] for s in added if "types" in s] == [["COMPONENT_TYPE_COMPUTE"]]
    assert len(ok(await http.get(f"{API}/schedules/nightly/scopes"))["scopes"]) == 2

    desired = {"desired_scope": {"racks": {"targets": [{"name": "r2"}, {"name": "r3"}]}}}
    replaced = ok(await http.put(f"{API}/schedules/nightly/scopes", json=desired))
    assert (replaced["added"], replaced["removed"], replaced["updated"]) == (1, 1, 1)
    scopes = {s["rack_id"]["id"]: s["id"]["id"] for s in replaced["scopes"]}
    assert len(scopes) == 2

    scope_id = next(iter(scopes.values()))
    assert ok(await http.delete(f"{API}/schedules/nightly/scopes/{scope_id}")) == {}
    assert len(ok(await http.get(f"{API}/schedules/nightly/scopes"))["scopes"]) == 1
    assert await audit_rows(http) == [
        ("AddTaskScheduleScope", "OK"),
        ("RemoveTaskScheduleScope", "OK"),
        ("UpdateTaskScheduleScope", "OK"),
    ]


async def test_a_bad_scope_names_the_field(http: httpx.AsyncClient, services: Services, db: Database) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")
    await make_schedule(services, "other", "r1")
    other_scope = ok(await http.get(f"{API}/schedules/other/scopes"))["scopes"][0]["id"]["id"]
    before = await table_counts(db)
    bad = {"target_spec": {"racks": {"targets": [{"name": "r9"}]}}}
    refused(
        await http.post(f"{API}/schedules/nightly/scopes", json=bad),
        404,
        "target_spec.racks[0]",
        "no rack with name 'r9'",
    )
    bad = {"target_spec": {"racks": {"targets": [{"name": "r1", "component_types": ["GPU"]}]}}}
    refused(
        await http.post(f"{API}/schedules/nightly/scopes", json=bad),
        400,
        "target_spec.racks.targets[0].component_types[0]",
        "expected one of COMPONENT_TYPE_",
    )
    refused(
        await http.put(f"{API}/schedules/nightly/scopes", json={"target_spec": {}}),
        400,
        "target_spec",
        "unknown field (the request body takes: desired_scope)",
    )
    refused(
        await http.delete(f"{API}/schedules/nightly/scopes/{other_scope}"),
        404,
        "scope_id",
        "is not a scope of schedule 'nightly'",
    )
    counts = await table_counts(db)
    # Each refusal is recorded: the first by its RPC's audit, the others refused before their RPC ran.
    assert counts.pop("audit_events") - before.pop("audit_events") == 4
    assert counts == before


# --- maintenance windows -------------------------------------------------------------------------


async def test_create_update_and_delete_a_window(
    http: httpx.AsyncClient, viewer: httpx.AsyncClient, services: Services, db: Database
) -> None:
    await make_racks(services, "r1", "r2")
    made = ok(await http.post(f"{API}/windows", json=CREATE_WINDOW))
    assert made["name"] == "sat-night" and made["kind"] == "WINDOW_KIND_ALLOW"
    one_off = {"window": {"one_off": {"start": "2030-01-01T00:00:00Z", "end": "2030-01-01T06:00:00Z"}}}
    changed = ok(await http.patch(f"{API}/windows/sat-night", json=one_off))
    assert changed["one_off"]["start"] == "2030-01-01T00:00:00Z" and not changed.get("recurring")
    assert changed["reason"] == "agreed with the tenants"  # not given, not changed
    changed = ok(
        await http.patch(f"{API}/windows/{made['id']['id']}", json={"window": {"racks": [{"name": "r2"}]}})
    )
    assert [r["name"] for r in changed["racks"]] == ["r2"]

    await viewer_is_refused(
        viewer, db, "POST", "/windows", {**CREATE_WINDOW, "window": {**CREATE_WINDOW["window"], "name": "v"}}
    )
    await viewer_is_refused(viewer, db, "PATCH", "/windows/sat-night", {"window": {"reason": "x"}})
    await viewer_is_refused(viewer, db, "DELETE", "/windows/sat-night")

    assert ok(await http.delete(f"{API}/windows/sat-night")) == {}
    refused(await http.get(f"{API}/windows/sat-night"), 404, "id", "sat-night")
    assert await audit_rows(http) == [
        ("CreateMaintenanceWindow", "OK"),
        ("CreateMaintenanceWindow", "PERMISSION_DENIED"),  # the viewer's, refused by role
        ("DeleteMaintenanceWindow", "OK"),
        ("DeleteMaintenanceWindow", "PERMISSION_DENIED"),
        ("UpdateMaintenanceWindow", "OK"),
        ("UpdateMaintenanceWindow", "OK"),
        ("UpdateMaintenanceWindow", "PERMISSION_DENIED"),
    ]
    events = ok(await http.get(f"{API}/audit", params={"method": "UpdateMaintenanceWindow"}))["events"]
    assert sorted(mask_of(e) for e in events if e["outcome"] == "OK") == ["window.racks", "window.when"]


@pytest.mark.parametrize(
    ("window", "field", "words"),
    [
        ({"kind": "WINDOW_KIND_OPEN"}, "window.kind", "expected one of WINDOW_KIND_"),
        (
            {"recurring": {"cron": "0 22 * * 6", "duration": "6 hours", "timezone": "UTC"}},
            "window.recurring.duration",
            "6 hours",
        ),
        (
            {"one_off": {"start": "2030-01-01", "end": "2030-01-02T00:00:00Z"}},
            "window.one_off.start",
            "RFC 3339",
        ),
        ({"racks": "r1"}, "window.racks", 'window.racks: expected a list, got "r1"'),
        (
            {"rack": [{"name": "r1"}]},
            "window.rack",
            "window.rack: unknown field (window takes: id, name, reason",
        ),
    ],
)
async def test_a_bad_window_names_the_field(
    http: httpx.AsyncClient, services: Services, db: Database, window: dict[str, Any], field: str, words: str
) -> None:
    await make_racks(services, "r1")
    body = {"window": {**{k: v for k, v in CREATE_WINDOW["window"].items() if k != "recurring"}, **window}}
    if "one_off" not in window and "recurring" not in window:
        body["window"]["recurring"] = CREATE_WINDOW["window"]["recurring"]
    before = await table_counts(db)
    refused(await http.post(f"{API}/windows", json=body), 400, field, words)
    counts = await table_counts(db)
    assert counts.pop("audit_events") - before.pop("audit_events") <= 1
    assert counts == before


# --- operation budgets ---------------------------------------------------------------------------


async def test_create_read_update_and_delete_a_budget(
    http: httpx.AsyncClient, viewer: httpx.AsyncClient, db: Database
) -> None:
    made = ok(await http.post(f"{API}/budgets", json=CREATE_BUDGET))
    assert made["name"] == "fw" and made["max_running"] == 4 and "max_running_per_domain" not in made
    assert [b["name"] for b in ok(await http.get(f"{API}/budgets"))["budgets"]] == ["fw"]
    assert ok(await http.get(f"{API}/budgets/fw")) == ok(await http.get(f"{API}/budgets/{made['id']['id']}"))
    assert ok(await viewer.get(f"{API}/budgets/fw"))["name"] == "fw"  # a viewer reads

    changed = ok(await http.patch(f"{API}/budgets/fw", json={"budget": {"max_running_per_domain": 1}}))
    assert changed["max_running_per_domain"] == 1 and changed["max_running"] == 4
    changed = ok(await http.patch(f"{API}/budgets/fw", json={"budget": {"max_running_per_domain": None}}))
    assert "max_running_per_domain" not in changed  # unset: the per-domain cap is removed

    await viewer_is_refused(
        viewer, db, "POST", "/budgets", {"budget": {**CREATE_BUDGET["budget"], "name": "v"}}
    )
    await viewer_is_refused(viewer, db, "PATCH", "/budgets/fw", {"budget": {"max_running": 9}})
    await viewer_is_refused(viewer, db, "DELETE", "/budgets/fw")

    assert ok(await http.delete(f"{API}/budgets/fw")) == {}
    refused(await http.get(f"{API}/budgets/fw"), 404, "id", "no operation budget named 'fw'")
    assert await audit_rows(http) == [
        ("CreateOperationBudget", "OK"),
        ("CreateOperationBudget", "PERMISSION_DENIED"),  # the viewer's, refused by role
        ("DeleteOperationBudget", "OK"),
        ("DeleteOperationBudget", "PERMISSION_DENIED"),
        ("UpdateOperationBudget", "OK"),
        ("UpdateOperationBudget", "OK"),
        ("UpdateOperationBudget", "PERMISSION_DENIED"),
    ]


@pytest.mark.parametrize(
    ("budget", "field", "words"),
    [
        ({"max_running": 0}, "budget.max_running", "budget.max_running"),
        (
            {"max_running": "four"},
            "budget.max_running",
            'budget.max_running: expected an integer, got "four"',
        ),
        ({"operations": ["reboot"]}, "budget.operations[0]", "reboot"),
        ({"operations": "upgrade_firmware"}, "budget.operations", "expected a list"),
    ],
)
async def test_a_bad_budget_names_the_field(
    http: httpx.AsyncClient, db: Database, budget: dict[str, Any], field: str, words: str
) -> None:
    before = await table_counts(db)
    body = {"budget": {**CREATE_BUDGET["budget"], **budget}}
    refused(await http.post(f"{API}/budgets", json=body), 400, field, words)
    counts = await table_counts(db)
    assert counts.pop("audit_events") - before.pop("audit_events") <= 1
    assert counts == before


# --- previews of what is not saved --------------------------------------------------------------


async def test_an_unsaved_schedule_is_previewed_with_its_decisions_and_validated_as_you_type(
    http: httpx.AsyncClient, db: Database, services: Services
) -> None:
    await make_racks(services, "r1", "r2")
    ok(await http.post(f"{API}/windows", json=CREATE_WINDOW))  # r1 opens only on Saturday nights
    before = await table_counts(db)
    draft = {**CREATE_SCHEDULE, "schedule": {**CREATE_SCHEDULE["schedule"], "name": ""}}
    body = {"draft": draft, "count": 2, "after": "2026-12-01T00:00:00Z"}  # a Tuesday
    firings = ok(await http.post(f"{API}/schedules:preview", json=body))["firings"]
    assert [f["at"] for f in firings] == ["2026-12-01T02:00:00Z", "2026-12-02T02:00:00Z"]
    decisions = {s["rack_name"]: (s["decision"], s["window_name"]) for s in firings[0]["scopes"]}
    assert decisions == {"r1": ("skip_window", "sat-night"), "r2": ("fire", "")}

    def with_schedule(**fields: Any) -> dict[str, Any]:
        return {"draft": {**draft, "schedule": {**draft["schedule"], **fields}}}

    spec = draft["schedule"]["spec"]
    cases = [
        (with_schedule(spec={**spec, "spec": "0 2 * *"}), "draft.schedule.spec.spec", "0 2 * *"),
        (with_schedule(spec={**spec, "timezone": "Mars/Olympus"}), "draft.schedule.spec.timezone", "Mars"),
        (with_schedule(name=" padded"), "draft.schedule.name", "whitespace"),
        (with_schedule(rollout={"bake_time": "soon"}), "draft.schedule.rollout.bake_time", "soon"),
        ({"draft": {**draft, "operation": {}}}, "draft.operation", "required"),
        ({"count": 2}, "draft", "required"),
        ({**body, "count": 500}, "count", "count"),
    ]
    for bad, field, words in cases:
        refused(await http.post(f"{API}/schedules:preview", json=bad), 400, field, words)
    unknown = {"racks": {"targets": [{"name": "r9"}]}}
    bad = {"draft": {**draft, "operation": {"power_on": {"target_spec": unknown}}}}
    refused(await http.post(f"{API}/schedules:preview", json=bad), 404, "draft.target_spec.racks[0]", "r9")
    assert await table_counts(db) == before  # a preview writes nothing, not even an audit row


async def test_an_edit_is_previewed_with_the_saved_racks_last_tasks(
    http: httpx.AsyncClient, services: Services
) -> None:
    """With `id`, a rack the schedule already has keeps its last task: still active, it is skipped for
    overlap; a rack the edit adds fires."""
    await make_racks(services, "r1", "r2", "r3")
    schedule = ok(await http.post(f"{API}/schedules", json=CREATE_SCHEDULE))
    ok(await http.post(f"{API}/schedules/web-made:trigger", json={}))
    target = {"racks": {"targets": [{"name": "r1"}, {"name": "r2"}, {"name": "r3"}]}}
    draft = {**CREATE_SCHEDULE, "operation": {"power_on": {"target_spec": target}}}
    body = {"id": schedule["id"], "draft": draft, "count": 1}
    firings = ok(await http.post(f"{API}/schedules:preview", json=body))["firings"]
    decisions = {s["rack_name"]: s["decision"] for s in firings[0]["scopes"]}
    assert decisions == {"r1": "skip_overlap", "r2": "skip_overlap", "r3": "fire"}
    missing = {**body, "id": {"id": "00000000-0000-4000-8000-000000000000"}}
    refused(await http.post(f"{API}/schedules:preview", json=missing), 404, "id", "00000000")


async def test_a_queue_timeout_takes_a_duration_as_the_cli_does(
    http: httpx.AsyncClient, services: Services
) -> None:
    """`--queue-timeout 30m` in the CLI; `"queue_timeout_seconds": "30m"` (or 1800) here."""
    await make_racks(services, "r1", "r2")
    body = {
        "schedule": {**CREATE_SCHEDULE["schedule"], "overlap_policy": "OVERLAP_POLICY_QUEUE"},
        "operation": {
            "power_on": {
                **CREATE_SCHEDULE["operation"]["power_on"],
                "queue_options": {"queue_timeout_seconds": "30m"},
            }
        },
    }
    made = ok(await http.post(f"{API}/schedules", json=body))
    assert made["operation"]["power_on"]["queue_options"]["queue_timeout_seconds"] == 1800
    field = "operation.power_on.queue_options.queue_timeout_seconds"
    for bad in ("30 minutes", "1.5s"):
        body["schedule"]["name"] = "again"
        body["operation"]["power_on"]["queue_options"]["queue_timeout_seconds"] = bad
        refused(
            await http.post(f"{API}/schedules", json=body),
            400,
            field,
            "whole seconds, or a duration like 30m",
        )
