"""The JSON API, endpoint by endpoint, on both databases: the same messages and errors as gRPC, actions
audited, bad input refused with the field named and nothing written."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import grpc
import httpx
import pytest

from rackflow.api.convert import message_json
from rackflow.api.servicer import FlowServicer
from rackflow.clock import FakeClock
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import OperationKind, TaskStatus
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.v1 import flow_pb2 as pb
from tests.conftest import table_counts
from tests.web.conftest import end_task, make_racks, make_schedule

API = "/api/v1"
JSON = {"Content-Type": "application/json"}


def error_of(response: httpx.Response, status: int, code: str, field: str | None) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert (body["code"], body["field"]) == (code, field), body
    return str(body["message"])


async def audit_rows(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    return list((await http.get(f"{API}/audit")).json()["events"])


class _Context:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AssertionError(f"{code}: {details}")


async def test_a_schedule_is_the_grpc_message_in_proto3_json(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1", "r2")
    schedule = await make_schedule(services, "nightly", "r1", "r2")
    by_name = await http.get(f"{API}/schedules/nightly")
    by_id = await http.get(f"{API}/schedules/{schedule.id}")
    over_grpc = await FlowServicer(services).GetTaskSchedule(
        pb.GetTaskScheduleRequest(id=pb.UUID(id=str(schedule.id))), _Context()
    )
    assert by_name.status_code == by_id.status_code == 200
    assert by_name.json() == by_id.json() == message_json(over_grpc)
    assert by_name.json()["spec"] == {
        "type": "SCHEDULE_SPEC_TYPE_CRON",
        "spec": "0 2 * * *",
        "timezone": "Europe/Berlin",
    }
    assert by_name.json()["enabled"] is True and by_name.json()["operation_type"] == "power_reset"


async def test_list_schedules_filters_sorts_and_pages(
    http: httpx.AsyncClient, services: Services, clock: FakeClock
) -> None:
    (r1,) = await make_racks(services, "r1")
    await make_racks(services, "r2")
    await make_schedule(services, "b-reset", "r1")
    clock.advance(timedelta(seconds=1))
    await make_schedule(services, "a-ingest", "r2", kind=OperationKind.INGEST)
    clock.advance(timedelta(seconds=1))
    paused = await make_schedule(services, "c-RESET-weekly", "r1", spec=ScheduleSpec(SpecType.INTERVAL, "1h"))
    await services.schedules.pause(paused.id)

    async def names(**params: Any) -> tuple[list[str], int]:
        response = await http.get(f"{API}/schedules", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        return [s["name"] for s in body["task_schedules"]], body["total"]

    assert await names() == (["b-reset", "a-ingest", "c-RESET-weekly"], 3)  # creation order
    assert await names(order_by="name") == (["a-ingest", "b-reset", "c-RESET-weekly"], 3)
    assert await names(order_by="name desc", limit=2) == (["c-RESET-weekly", "b-reset"], 3)
    assert await names(order_by="name", offset=2, limit=2) == (["c-RESET-weekly"], 3)
    assert await names(name_contains="reset") == (["b-reset", "c-RESET-weekly"], 2)
    assert await names(paused_only="true") == (["c-RESET-weekly"], 1)
    assert await names(enabled_only="true") == (["b-reset", "a-ingest"], 2)
    assert await names(operation_type="ingest") == (["a-ingest"], 1)
    assert await names(rack="r1") == (["b-reset", "c-RESET-weekly"], 2)
    assert await names(rack=str(r1), order_by="next_run_at desc") == (["b-reset", "c-RESET-weekly"], 2)


@pytest.mark.parametrize(
    ("query", "status", "code", "field"),
    [
        ("limit=abc", 400, "INVALID_ARGUMENT", "limit"),
        ("limit=5000", 400, "INVALID_ARGUMENT", "pagination.limit"),
        ("offset=-1", 400, "INVALID_ARGUMENT", "pagination.offset"),
        ("limit=99999999999", 400, "INVALID_ARGUMENT", "limit"),
        ("enabled_only=maybe", 400, "INVALID_ARGUMENT", "enabled_only"),
        ("enabled_only=true&paused_only=true", 400, "INVALID_ARGUMENT", "paused_only"),
        ("order_by=color", 400, "INVALID_ARGUMENT", "order_by"),
        ("name_contains=%00", 400, "INVALID_ARGUMENT", "name_contains"),
        ("operation_type=reboot", 400, "INVALID_ARGUMENT", "operation_type"),
        ("rack=no-such-rack", 404, "NOT_FOUND", "rack_id"),
        ("limt=5", 400, "INVALID_ARGUMENT", "limt"),
    ],
)
async def test_bad_list_parameters_name_the_field(
    http: httpx.AsyncClient, query: str, status: int, code: str, field: str
) -> None:
    error_of(await http.get(f"{API}/schedules?{query}"), status, code, field)


async def test_runs_scopes_and_preview_of_a_schedule(
    http: httpx.AsyncClient, services: Services, clock: FakeClock
) -> None:
    await make_racks(services, "r1", "r2")
    schedule = await make_schedule(services, "hourly", "r1", "r2", spec=ScheduleSpec(SpecType.INTERVAL, "1h"))
    await services.schedules.trigger(schedule.id)

    runs = (await http.get(f"{API}/schedules/hourly/runs", params={"limit": 5})).json()
    assert runs["total"] == 1
    (run,) = runs["runs"]
    assert run["trigger"] == "manual"
    assert sorted(o["outcome"] for o in run["outcomes"]) == ["submitted", "submitted"]
    (basic,) = (await http.get(f"{API}/schedules/hourly/runs", params={"view": "basic"})).json()["runs"]
    assert basic["outcomes"] == [] and basic["id"] == run["id"]
    assert basic["outcome_counts"] == [{"outcome": "submitted", "racks": 2, "with_task": 2}]
    error_of(await http.get(f"{API}/schedules/hourly/runs?view=all"), 400, "INVALID_ARGUMENT", "view")

    scopes = (await http.get(f"{API}/schedules/{schedule.id}/scopes")).json()["scopes"]
    assert len(scopes) == 2 and all(s["schedule_id"]["id"] == str(schedule.id) for s in scopes)
    page = (await http.get(f"{API}/schedules/hourly/scopes", params={"limit": 1})).json()
    assert len(page["scopes"]) == 1 and page["total"] == 2 and page["next_page_token"]
    rest = await http.get(f"{API}/schedules/hourly/scopes", params={"page_token": page["next_page_token"]})
    assert [s["id"] for s in page["scopes"] + rest.json()["scopes"]] == [s["id"] for s in scopes]

    preview = (await http.get(f"{API}/schedules/hourly/preview", params={"count": 3})).json()["times"]
    next_run = datetime.fromisoformat((await http.get(f"{API}/schedules/hourly")).json()["next_run_at"])
    assert [datetime.fromisoformat(t) for t in preview] == [next_run + timedelta(hours=h) for h in range(3)]
    after = await http.get(f"{API}/schedules/hourly/preview?count=1&after=2026-04-01T00:00:00Z")
    assert after.json() == {"times": ["2026-04-01T01:00:00Z"]}
    error_of(await http.get(f"{API}/schedules/hourly/preview?count=500"), 400, "INVALID_ARGUMENT", "count")
    error_of(
        await http.get(f"{API}/schedules/hourly/preview?after=yesterday"), 400, "INVALID_ARGUMENT", "after"
    )
    error_of(await http.get(f"{API}/schedules/nope/runs"), 404, "NOT_FOUND", "schedule_id")
    error_of(await http.get(f"{API}/schedules/nope/scopes"), 404, "NOT_FOUND", "schedule_id")
    missing = "00000000-0000-4000-8000-000000000000"
    error_of(await http.get(f"{API}/schedules/{missing}"), 404, "NOT_FOUND", "id")


async def test_tasks_by_status_rack_and_schedule(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1", "r2")
    schedule = await make_schedule(services, "reset", "r1", "r2")
    first, second = await services.schedules.trigger(schedule.id)
    await end_task(services, first, TaskStatus.FAILED)

    async def ids(query: str) -> set[str]:
        response = await http.get(f"{API}/tasks?{query}")
        assert response.status_code == 200, response.text
        return {t["id"]["id"] for t in response.json()["tasks"]}

    assert await ids("") == {str(first), str(second)}
    assert await ids("status=failed") == {str(first)}
    assert await ids("status=FAILED&status=pending") == {str(first), str(second)}
    assert await ids("status=completed,running") == set()
    assert await ids("active_only=true") == {str(second)}
    assert await ids("schedule=reset&limit=1") <= {str(first), str(second)}
    task = (await http.get(f"{API}/tasks/{first}")).json()
    assert (task["status"], task["schedule_id"]["id"]) == ("TASK_STATUS_FAILED", str(schedule.id))
    rack_of_first = task["rack_id"]["id"]
    assert await ids(f"rack={rack_of_first}") == {str(first)}

    error_of(await http.get(f"{API}/tasks?status=lost"), 400, "INVALID_ARGUMENT", "status")
    error_of(await http.get(f"{API}/tasks?rack=nowhere"), 404, "NOT_FOUND", "rack_id")
    error_of(await http.get(f"{API}/tasks?schedule=nothing"), 404, "NOT_FOUND", "schedule_id")
    error_of(await http.get(f"{API}/tasks/not-a-uuid"), 400, "INVALID_ARGUMENT", "task_ids[0]")
    error_of(await http.get(f"{API}/tasks/{schedule.id}"), 404, "NOT_FOUND", "task_ids[0]")


async def test_racks_and_one_rack_by_name_or_id(http: httpx.AsyncClient, services: Services) -> None:
    r1, _ = await make_racks(services, "r1", "r2")
    listed = (await http.get(f"{API}/racks?limit=1")).json()
    assert listed["total"] == 2 and [r["name"] for r in listed["racks"]] == ["r1"]
    by_name, by_id = (await http.get(f"{API}/racks/r1")).json(), (await http.get(f"{API}/racks/{r1}")).json()
    assert by_name == by_id
    assert sorted(c["type"] for c in by_name["components"]) == [
        "COMPONENT_TYPE_COMPUTE",
        "COMPONENT_TYPE_NVSWITCH",
        "COMPONENT_TYPE_POWERSHELF",
    ]
    error_of(await http.get(f"{API}/racks/r9"), 404, "NOT_FOUND", "id")
    domain = await services.inventory.create_domain("nvl-a", [r1])
    in_domain = (await http.get(f"{API}/racks", params={"nvl_domain_id": str(domain.id)})).json()
    assert [r["name"] for r in in_domain["racks"]] == ["r1"]
    error_of(await http.get(f"{API}/racks?nvl_domain_id=nope"), 400, "INVALID_ARGUMENT", "nvl_domain_id")
    held = (await http.get(f"{API}/racks", params={"name_contains": "R2", "limit": 20})).json()
    assert ([r["name"] for r in held["racks"]], held["total"]) == (["r2"], 1)
    error_of(await http.get(f"{API}/racks?name_contains=%00"), 400, "INVALID_ARGUMENT", "name_contains")


async def test_racks_are_listed_in_the_view_asked(http: httpx.AsyncClient, services: Services) -> None:
    """`view=basic` answers the racks without their components, as ListRacks' RACK_VIEW_BASIC does; `full`,
    the default, with them; any other view is refused with the field named, as the runs' `view` is."""
    await make_racks(services, "r1", "r2")

    async def listed(**params: str) -> list[tuple[str, int]]:
        response = await http.get(f"{API}/racks", params=params)
        assert response.status_code == 200, response.text
        return [(r["name"], len(r["components"])) for r in response.json()["racks"]]

    assert await listed() == await listed(view="full") == [("r1", 3), ("r2", 3)]
    assert await listed(view="basic") == await listed(view="BASIC") == [("r1", 0), ("r2", 0)]
    assert await listed(view="basic", name_contains="r2") == [("r2", 0)]
    for bad in ("summary", "RACK_VIEW_UNSPECIFIED", "%00", "1"):
        message = error_of(await http.get(f"{API}/racks?view={bad}"), 400, "INVALID_ARGUMENT", "view")
        assert "basic or full" in message, message


async def test_actions_change_the_schedule_and_are_audited_like_grpc(
    http: httpx.AsyncClient, services: Services, clock: FakeClock
) -> None:
    await make_racks(services, "r1")
    schedule = await make_schedule(services, "nightly", "r1")

    paused = await http.post(f"{API}/schedules/nightly:pause")
    assert paused.status_code == 200 and paused.json()["enabled"] is False
    clock.advance(timedelta(seconds=1))
    resumed = await http.post(f"{API}/schedules/{schedule.id}:resume", json={})
    assert resumed.status_code == 200 and resumed.json()["enabled"] is True
    clock.advance(timedelta(seconds=1))
    triggered = await http.post(f"{API}/schedules/nightly:trigger")
    (task_id,) = [t["id"] for t in triggered.json()["task_ids"]]
    clock.advance(timedelta(seconds=1))
    cancelled = await http.post(f"{API}/tasks/{task_id}:cancel")
    assert cancelled.json()["task"]["status"] == "TASK_STATUS_TERMINATED"

    rows = await audit_rows(http)
    assert [(e["method"], e["outcome"], e["principal"]) for e in rows] == [
        ("CancelTask", "OK", "anonymous"),
        ("TriggerTaskSchedule", "OK", "anonymous"),
        ("ResumeTaskSchedule", "OK", "anonymous"),
        ("PauseTaskSchedule", "OK", "anonymous"),
    ]
    pause = rows[-1]
    assert pause["target_ids"] == [{"id": str(schedule.id)}]
    assert '"enabled": true' in pause["schedule_before_json"]
    assert '"enabled": false' in pause["schedule_after_json"]


async def test_a_refused_action_is_audited_and_changes_nothing(
    http: httpx.AsyncClient, services: Services, db: Database
) -> None:
    await make_racks(services, "r1")
    schedule = await make_schedule(services, "nightly", "r1")
    (task_id,) = await services.schedules.trigger(schedule.id)
    await end_task(services, task_id, TaskStatus.COMPLETED)
    before = await table_counts(db)

    message = error_of(
        await http.post(f"{API}/tasks/{task_id}:cancel"), 412, "FAILED_PRECONDITION", "task_id"
    )
    assert "completed" in message.lower()
    counts = await table_counts(db)
    assert counts.pop("audit_events") == before.pop("audit_events") + 1
    assert counts == before
    (row,) = await audit_rows(http)
    assert (row["method"], row["outcome"]) == ("CancelTask", "FAILED_PRECONDITION")


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (
            '{"reasons": "maintenance"}',
            "reasons",
            "reasons: unknown field (the request body takes: reason, resume_at)",
        ),
        ("[1, 2]", None, "the request body must be a JSON object, got [1, 2]"),
        ("{not json", None, "the request body is not valid JSON"),
        ("[" * 50_000, None, "the request body is not valid JSON: nested too deep"),  # was a 500
        ('{"id": {"id": "x"}}', "id", "id: set by the URL path; leave it out of the body"),
        ('{"reason": 5}', "reason", "reason: expected a string, got 5"),
        ('{"resume_at": "tomorrow"}', "resume_at", "resume_at: expected an RFC 3339 time like"),
        ('{"resumeAt": "2h30"}', "resume_at", 'or a duration from now like 2h, got "2h30"'),
    ],
)
async def test_a_malformed_body_is_refused_before_anything_runs(
    http: httpx.AsyncClient, services: Services, db: Database, body: str, field: str | None, words: str
) -> None:
    """In the API's words: the field's path and what it takes, never the protobuf parser's internals. Nothing
    runs, and the trail records the refusal, as over gRPC (`JsonApi._answer`)."""
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")
    before = await table_counts(db)
    response = await http.post(f"{API}/schedules/nightly:pause", content=body, headers=JSON)
    message = error_of(response, 400, "INVALID_ARGUMENT", field)
    assert (
        words in message and "Available Fields" not in message and "PauseTaskScheduleRequest" not in message
    )
    assert await table_counts(db) == before | {"audit_events": before["audit_events"] + 1}
    (row,) = await audit_rows(http)
    assert (row["method"], row["outcome"], row["error"]) == ("PauseTaskSchedule", "INVALID_ARGUMENT", message)


async def test_unknown_schedule_actions_and_paths(http: httpx.AsyncClient, db: Database) -> None:
    before = await table_counts(db)
    for verb in ("pause", "resume", "trigger"):
        error_of(await http.post(f"{API}/schedules/ghost:{verb}"), 404, "NOT_FOUND", "id")
    assert (await http.get(f"{API}/nothing-here")).status_code == 404
    error_of(await http.delete(f"{API}/schedules/ghost"), 404, "NOT_FOUND", "id")
    error_of(await http.put(f"{API}/schedules/ghost", json={}), 405, "UNIMPLEMENTED", None)
    # A name that names nothing never reaches an RPC; each action on it is recorded as its RPC refused, the
    # name as sent (as over gRPC an id that names nothing is); a path that is no endpoint is no call.
    assert await table_counts(db) == before | {"audit_events": before["audit_events"] + 4}
    # A malformed id does reach CancelTask, which refuses it; the audit records that, as over gRPC.
    error_of(await http.post(f"{API}/tasks/nope:cancel"), 400, "INVALID_ARGUMENT", "task_id")
    rows = sorted((row["method"], row["outcome"], row["request_json"]) for row in await audit_rows(http))
    ghost = '{"id": {"id": "ghost"}}'
    assert rows == sorted(
        [
            *(
                (rpc, "NOT_FOUND", ghost)
                for rpc in ("PauseTaskSchedule", "ResumeTaskSchedule", "TriggerTaskSchedule")
            ),
            ("DeleteTaskSchedule", "NOT_FOUND", ghost),
            ("CancelTask", "INVALID_ARGUMENT", '{"task_id": {"id": "nope"}}'),
        ]
    )


async def test_audit_filters(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1")
    schedule = await make_schedule(services, "nightly", "r1")
    await http.post(f"{API}/schedules/nightly:pause")
    await http.post(f"{API}/schedules/nightly:trigger")
    only_pause = (await http.get(f"{API}/audit", params={"method": "PauseTaskSchedule"})).json()
    assert [e["method"] for e in only_pause["events"]] == ["PauseTaskSchedule"]
    none_later = (await http.get(f"{API}/audit", params={"since": "2030-01-01T00:00:00Z"})).json()
    assert none_later == {"events": [], "total": 0, "next_page_token": "", "total_capped": False}
    error_of(await http.get(f"{API}/audit?method=Reboot"), 400, "INVALID_ARGUMENT", "method")
    error_of(await http.get(f"{API}/audit?since=soon"), 400, "INVALID_ARGUMENT", "since")
    error_of(await http.get(f"{API}/audit?target=nightly"), 400, "INVALID_ARGUMENT", "target")
    by_target = (await http.get(f"{API}/audit", params={"target": str(schedule.id).upper()})).json()
    assert [e["method"] for e in by_target["events"]] == ["TriggerTaskSchedule", "PauseTaskSchedule"]


async def test_times_take_durations_where_the_cli_does(
    http: httpx.AsyncClient, services: Services, clock: FakeClock
) -> None:
    """`audit --since 24h` (back from now) and `schedule pause --for 2h` (on from now), over HTTP."""
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")
    paused = await http.post(f"{API}/schedules/nightly:pause", json={"resume_at": "2h30m"})
    assert paused.status_code == 200, paused.text
    resume_at = datetime.fromisoformat(paused.json()["resume_at"])
    assert resume_at == clock.now() + timedelta(hours=2, minutes=30)
    clock.advance(timedelta(hours=2))

    async def methods(since: str) -> list[str]:
        response = await http.get(f"{API}/audit", params={"since": since})
        assert response.status_code == 200, response.text
        return [e["method"] for e in response.json()["events"]]

    assert await methods("24h") == await methods("3h") == ["PauseTaskSchedule"]
    assert await methods("1h") == await methods("90m") == []
    message = error_of(await http.get(f"{API}/audit?since=-1h"), 400, "INVALID_ARGUMENT", "since")
    assert message == "since: a duration back from now must be positive, got '-1h'"
    message = error_of(await http.get(f"{API}/audit?since=yesterday"), 400, "INVALID_ARGUMENT", "since")
    assert "neither a duration like 24h nor an RFC 3339 time" in message


async def test_responses_carry_the_security_headers(http: httpx.AsyncClient) -> None:
    for path in (f"{API}/racks", "/racks"):
        headers = (await http.get(path)).headers
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff"


async def test_a_rollout_run_is_read_cancelled_and_refused_like_over_grpc(
    http: httpx.AsyncClient, services: Services, db: Database
) -> None:
    await make_racks(services, "r1", "r2", "r3")
    schedule = await make_schedule(
        services, "fw", "r1", "r2", "r3", rollout=RolloutPolicy(max_concurrent_racks=1)
    )
    await services.schedules.trigger(schedule.id)
    (run,) = (await http.get(f"{API}/schedules/fw/runs")).json()["runs"]
    assert run["state"] == "rolling" and run["progress"]["pending"] == 2 and run["progress"]["active"] == 1
    one = await http.get(f"{API}/runs/{run['id']['id']}")
    assert one.status_code == 200 and one.json() == run
    error_of(await http.get(f"{API}/runs/nope"), 400, "INVALID_ARGUMENT", "id")
    before = await table_counts(db)
    refused = await http.post(f"{API}/runs/{run['id']['id']}:resume")
    assert "only a halted rollout can be resumed" in error_of(refused, 412, "FAILED_PRECONDITION", "id")
    cancelled = await http.post(f"{API}/runs/{run['id']['id']}:cancel", json={})
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["progress"]["not_started"] == 3  # its rack not claimed yet too: ended
    rows = await audit_rows(http)
    assert sorted((e["method"], e["outcome"]) for e in rows) == [  # one FakeClock instant: any order
        ("CancelTaskScheduleRun", "OK"),
        ("ResumeTaskScheduleRun", "FAILED_PRECONDITION"),
    ]
    assert (await table_counts(db))["tasks"] == before["tasks"]


async def test_a_run_is_retried_over_http_with_only_failed_in_the_body(
    http: httpx.AsyncClient, services: Services, db: Database
) -> None:
    await make_racks(services, "r1", "r2")
    schedule = await make_schedule(services, "fw", "r1", "r2")
    task_ids = await services.schedules.trigger(schedule.id)
    (run,) = (await http.get(f"{API}/schedules/fw/runs")).json()["runs"]
    url = f"{API}/runs/{run['id']['id']}:retry"
    before = await table_counts(db)
    refused = await http.post(url, json={})
    assert "still has 2 active task(s)" in error_of(refused, 412, "FAILED_PRECONDITION", "id")
    assert await table_counts(db) == {**before, "audit_events": before["audit_events"] + 1}
    for task_id in task_ids:
        await end_task(services, task_id, TaskStatus.COMPLETED)
    again = await http.post(url, json={"only_failed": False})
    assert again.status_code == 200, again.text
    assert again.json()["retry_of"] == run["id"] and len(again.json()["outcomes"]) == 2


async def test_a_trigger_and_a_retry_sent_again_say_they_were_replayed(
    http: httpx.AsyncClient, services: Services, clock: FakeClock
) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "fw", "r1")
    body = {"request_id": "web-1"}

    first = (await http.post(f"{API}/schedules/fw:trigger", json=body)).json()
    clock.advance(timedelta(minutes=1))
    again = (await http.post(f"{API}/schedules/fw:trigger", json=body)).json()

    (run,) = (await http.get(f"{API}/schedules/fw/runs")).json()["runs"]
    assert (first["replayed"], again["replayed"]) == (False, True)
    assert first["task_ids"] == again["task_ids"] and len(first["task_ids"]) == 1
    assert first["run_id"] == again["run_id"] == run["id"]
    assert first["fired_at"] == again["fired_at"] == run["fired_at"]
    assert "replayed" not in run  # a run read is no answer of a retry

    await end_task(services, uuid.UUID(first["task_ids"][0]["id"]), TaskStatus.FAILED)
    url = f"{API}/runs/{run['id']['id']}:retry"
    retried = (await http.post(url, json={"request_id": "web-2"})).json()
    retried_again = (await http.post(url, json={"request_id": "web-2"})).json()
    assert (retried["replayed"], retried_again["replayed"]) == (False, True)
    assert retried["id"] == retried_again["id"] and retried["retry_of"] == run["id"]


async def test_a_refused_trigger_sent_again_says_it_was_replayed(
    http: httpx.AsyncClient, services: Services, clock: FakeClock
) -> None:
    """A trigger that fired but submitted no task is refused (412) naming its run as a success does; sent
    again with its request id, the same refusal says `replayed`, with the first call's run and time. Any
    other refusal carries none of them."""
    await make_racks(services, "r1")
    await make_schedule(services, "fw", "r1")
    await http.post(f"{API}/schedules/fw:trigger")  # its task stays pending: the next firing's scope fails
    body = {"request_id": "web-1"}

    first = await http.post(f"{API}/schedules/fw:trigger", json=body)
    clock.advance(timedelta(minutes=1))
    again = await http.post(f"{API}/schedules/fw:trigger", json=body)

    runs = (await http.get(f"{API}/schedules/fw/runs")).json()["runs"]
    assert len(runs) == 2
    (refused,) = [r for r in runs if r["outcomes"][0]["outcome"] == "failed"]
    assert "submitted no task" in error_of(first, 412, "FAILED_PRECONDITION", "id")
    assert "by an earlier request with request_id 'web-1'" in error_of(
        again, 412, "FAILED_PRECONDITION", "id"
    )
    for response, replayed in ((first, False), (again, True)):
        answer = response.json()
        assert (answer["run_id"], answer["replayed"]) == (refused["id"], replayed)
        assert answer["fired_at"] == refused["fired_at"]  # written as a success body writes it
    bad = await http.post(f"{API}/schedules/fw:trigger", json={"request_id": "no spaces"})
    error_of(bad, 400, "INVALID_ARGUMENT", "request_id")
    assert not {"run_id", "fired_at", "replayed"} & bad.json().keys()
    assert len((await http.get(f"{API}/schedules/fw/runs")).json()["runs"]) == 2


async def test_an_answer_past_the_message_limit_is_refused_413_as_over_grpc(
    http: httpx.AsyncClient, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make_racks(services, *(f"rack-with-a-long-name-{index:02}" for index in range(10)))
    one = await FlowServicer(services).ListRacks(
        pb.ListRacksRequest(pagination=pb.Pagination(limit=1)), _Context()
    )
    monkeypatch.setattr("rackflow.api.errors.GRPC_MESSAGE_BYTES", one.ByteSize())

    message = error_of(await http.get(f"{API}/racks"), 413, "RESOURCE_EXHAUSTED", None)

    assert message.startswith("ListRacks's answer is") and "pagination.limit" in message
    assert len((await http.get(f"{API}/racks?limit=1")).json()["racks"]) == 1
