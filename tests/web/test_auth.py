"""Tokens and roles over HTTP: the gRPC rule, the same refusals, and pages that never leak without a token."""

from __future__ import annotations

import uuid

import httpx
import pytest

from rackflow.api.auth import is_mutating
from rackflow.security import TokenTable
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.v1 import flow_pb2 as pb
from rackflow.web.api import JsonApi
from tests.api.secured import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN
from tests.conftest import table_counts
from tests.web.conftest import BASE_URL, make_racks, make_schedule

API = "/api/v1"
FRAGMENT = {"X-Rackflow-Fragment": "1"}


@pytest.fixture
def tokens() -> TokenTable | None:
    return TOKENS


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("not-a-token"),
        {"Authorization": f"Basic {VIEWER_TOKEN}"},
        {"Cookie": f"token={VIEWER_TOKEN}"},
    ],
    ids=["none", "unknown", "basic", "cookie"],
)
async def test_without_a_valid_token_everything_is_401(
    http: httpx.AsyncClient, services: Services, db: Database, headers: dict[str, str]
) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")
    before = await table_counts(db)
    for method, path in (("GET", "/schedules"), ("GET", "/racks/r1"), ("POST", "/schedules/nightly:pause")):
        response = await http.request(method, API + path, headers=headers)
        assert response.status_code == 401, response.text
        assert response.json()["code"] == "UNAUTHENTICATED"
        assert response.headers["www-authenticate"] == "Bearer"
    fragment = await http.get("/schedules", headers={**headers, **FRAGMENT})
    assert fragment.status_code == 401
    assert await table_counts(db) == before


async def test_a_viewer_reads_but_is_refused_every_action(
    http: httpx.AsyncClient, services: Services, db: Database
) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")
    read = await http.get(f"{API}/schedules/nightly", headers=bearer(VIEWER_TOKEN))
    assert read.status_code == 200
    schedule_id = read.json()["id"]["id"]
    before = await table_counts(db)
    messages = []
    for verb in ("pause", "resume", "trigger"):
        response = await http.post(f"{API}/schedules/nightly:{verb}", headers=bearer(VIEWER_TOKEN))
        assert response.status_code == 403
        body = response.json()
        assert body["code"] == "PERMISSION_DENIED" and "operator" in body["message"]
        assert body["field"] is None  # the message starts with the RPC's name, which is no field
        messages.append(body["message"])
    after = await table_counts(db)
    # Refused by role: nothing changed but the trail, which says who tried what (as over gRPC).
    assert {k: v for k, v in after.items() if v != before[k]} == {"audit_events": before["audit_events"] + 3}
    events = (await http.get(f"{API}/audit", headers=bearer(VIEWER_TOKEN))).json()["events"]
    assert [(e["principal"], e["method"], e["outcome"], e["error"]) for e in reversed(events)] == [
        ("dashboard", rpc, "PERMISSION_DENIED", message)
        for rpc, message in zip(
            ("PauseTaskSchedule", "ResumeTaskSchedule", "TriggerTaskSchedule"), messages, strict=True
        )
    ]
    assert all([t["id"] for t in e["target_ids"]] == [schedule_id] for e in events)


@pytest.mark.parametrize("ref", ["a%00b", "a%1Bb", "x" * 300], ids=["nul", "escape", "too-long"])
async def test_a_viewer_acting_on_what_is_no_name_is_refused_by_role_and_audited(
    http: httpx.AsyncClient, ref: str
) -> None:
    """A name the look-up refuses (a control character, too long) was answered 400 before the role: the
    role is checked first, so it is refused 403 and recorded as any refusal."""
    response = await http.post(f"{API}/schedules/{ref}:pause", headers=bearer(VIEWER_TOKEN))
    assert response.status_code == 403, response.text
    (event,) = (await http.get(f"{API}/audit", headers=bearer(VIEWER_TOKEN))).json()["events"]
    assert (event["method"], event["outcome"]) == ("PauseTaskSchedule", "PERMISSION_DENIED")
    assert len(event["target_ids"]) == 1  # what was asked, as the trail keeps it
    page = (await http.get("/audit", headers={**FRAGMENT, **bearer(VIEWER_TOKEN)})).text
    assert "\x1b" not in page  # the Audit page shows what was asked escaped (a\x1bb), as any name


async def test_an_operator_approving_from_the_console_is_refused_and_audited(
    http: httpx.AsyncClient, services: Services
) -> None:
    """The console's Approve button posts to the JSON API as the page's script does (same origin, JSON):
    an operator's approval is refused by role, and the trail records it as the gRPC API does."""
    run_id = str(uuid.uuid4())
    console = {"Origin": BASE_URL, "Sec-Fetch-Site": "same-origin", **bearer(OPERATOR_TOKEN)}
    response = await http.post(f"{API}/runs/{run_id}:approve", json={"comment": "ok"}, headers=console)
    assert response.status_code == 403 and response.json()["code"] == "PERMISSION_DENIED"
    (event,) = (await http.get(f"{API}/audit", headers=bearer(VIEWER_TOKEN))).json()["events"]
    assert (event["principal"], event["method"], event["outcome"], event["error"]) == (
        "oncall",
        "ApproveTaskScheduleRun",
        "PERMISSION_DENIED",
        response.json()["message"],
    )
    assert [t["id"] for t in event["target_ids"]] == [run_id]


async def test_an_operator_acts_and_the_audit_names_the_token(
    http: httpx.AsyncClient, services: Services
) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")
    paused = await http.post(f"{API}/schedules/nightly:pause", headers=bearer(OPERATOR_TOKEN))
    assert paused.status_code == 200 and paused.json()["enabled"] is False
    events = (await http.get(f"{API}/audit", headers=bearer(VIEWER_TOKEN))).json()["events"]
    assert [(e["method"], e["principal"], e["outcome"]) for e in events] == [
        ("PauseTaskSchedule", "oncall", "OK")
    ]


async def test_a_page_without_a_token_is_an_empty_shell(http: httpx.AsyncClient, services: Services) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "secret-schedule-name", "r1")
    shell = await http.get("/schedules")
    assert shell.status_code == 200
    assert 'data-tokens="required"' in shell.text and "data-deferred" in shell.text
    assert "secret-schedule-name" not in shell.text
    fragment = await http.get("/schedules", headers={**FRAGMENT, **bearer(VIEWER_TOKEN)})
    assert fragment.status_code == 200 and "secret-schedule-name" in fragment.text
    assert "<html" not in fragment.text  # only the page's own part


def test_every_action_on_a_ref_says_which_request_field_the_ref_sets() -> None:
    """A call refused by role is recorded with the id its path names (`JsonApi._as_sent`), so each action's
    endpoint names the field; RemoveTaskScheduleScope's request holds the scope alone ({scope_id})."""
    unnamed = [
        e.rpc
        for e in JsonApi.endpoints()
        if is_mutating(e.rpc)
        and "{ref}" in e.path
        and not any(
            e.request_type.fields_by_name[f].message_type is pb.UUID.DESCRIPTOR for f in e.path_fields
        )
    ]
    assert unnamed == []
