"""Tokens and roles over HTTP: the gRPC rule, the same refusals, and pages that never leak without a token."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest

from rackflow.api.auth import is_mutating
from rackflow.config import AUDIT_UNPARSED_BODY_MAX_BYTES
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


async def _refused_request(http: httpx.AsyncClient, path: str, body: bytes) -> dict[str, Any]:
    """A viewer's POST of `body` to `path`, refused by role: the request its audit row records."""
    headers = {**bearer(VIEWER_TOKEN), "Content-Type": "application/json"}
    response = await http.post(f"{API}{path}", content=body, headers=headers)
    assert response.status_code == 403 and response.json()["code"] == "PERMISSION_DENIED", response.text
    (event,) = (await http.get(f"{API}/audit", params={"limit": 1}, headers=bearer(VIEWER_TOKEN))).json()[
        "events"
    ]
    assert event["outcome"] == "PERMISSION_DENIED"
    return dict(json.loads(event["request_json"]))


async def test_a_refused_call_s_body_that_does_not_parse_is_recorded_as_sent_bounded(
    http: httpx.AsyncClient, services: Services
) -> None:
    """A call refused by role was recorded with its body only when the body parsed: a viewer's malformed
    request left no trace of what it sent. The body is recorded beside the request the path gives (its
    ids), with why it did not parse, at most AUDIT_UNPARSED_BODY_MAX_BYTES of it, saying it was cut."""
    await make_racks(services, "r1")
    schedule = await make_schedule(services, "nightly", "r1")
    typo = await _refused_request(http, "/schedules/nightly:pause", b'{"reasons": "INC-4411"}')
    assert typo == {
        "id": {"id": str(schedule.id)},
        "unparsed_body": {
            "error": "reasons: unknown field (the request body takes: reason, resume_at)",
            "body": '{"reasons": "INC-4411"}',
        },
    }
    broken = await _refused_request(http, "/schedules/nightly:pause", b'{"reason": "INC-4411"')
    assert broken["unparsed_body"]["body"] == '{"reason": "INC-4411"'
    assert broken["unparsed_body"]["error"].startswith("the request body is not valid JSON: ")
    assert AUDIT_UNPARSED_BODY_MAX_BYTES == 4096
    huge = "é" * 3000  # 6,000 bytes of UTF-8, cut between characters, never inside one
    cut = await _refused_request(http, "/schedules/nightly:pause", huge.encode())
    assert cut["unparsed_body"]["body"] == "é" * 2048
    assert cut["unparsed_body"]["truncated"] == {"original_bytes": 6000, "limit_bytes": 4096}
    parsed = await _refused_request(http, "/schedules/nightly:pause", b'{"reason": "INC-4411"}')
    assert parsed == {"id": {"id": str(schedule.id)}, "reason": "INC-4411"}  # as before: no unparsed_body


PAST_RESUME = b'{"resume_at": "2001-01-01T00:00:00Z"}'


async def test_a_permitted_call_refused_before_its_rpc_ran_is_recorded_once(
    http: httpx.AsyncClient, services: Services
) -> None:
    """An operator's action refused before its RPC ran (a body that does not parse, a name in its path that
    names nothing, a scope that is not its schedule's) was answered with no row: the trail showed a viewer's
    malformed pause, or a pause of a missing schedule by id over gRPC, but not an operator's. Each is one
    row now, with the request as sent; a call its RPC refused is still one row, and a read none."""
    await make_racks(services, "r1")
    schedule = await make_schedule(services, "nightly", "r1")
    headers = {**bearer(OPERATOR_TOKEN), "Content-Type": "application/json"}
    scope_id = str(uuid.UUID(int=7))
    sent: list[tuple[str, str, bytes, dict[str, Any]]] = [  # (method, path, body, the request recorded)
        (
            "POST",
            "/schedules/nightly:pause",
            b'{"reasons": "INC-1"}',
            {
                "id": {"id": str(schedule.id)},
                "unparsed_body": {
                    "error": "reasons: unknown field (the request body takes: reason, resume_at)",
                    "body": '{"reasons": "INC-1"}',
                },
            },
        ),
        ("POST", "/schedules/nightly-typo:pause", b"{}", {"id": {"id": "nightly-typo"}}),
        ("DELETE", f"/schedules/nightly/scopes/{scope_id}", b"", {"scope_id": {"id": scope_id}}),
        # Refused by its service, whose audit records it: one row all the same.
        (
            "POST",
            "/schedules/nightly:pause",
            PAST_RESUME,
            {"id": {"id": str(schedule.id)}, **json.loads(PAST_RESUME)},
        ),
    ]
    answers = [
        await http.request(method, API + path, content=body, headers=headers)
        for method, path, body, _ in sent
    ]
    read = await http.get(f"{API}/schedules", params={"colour": "red"}, headers=headers)
    assert [a.status_code for a in [*answers, read]] == [400, 404, 404, 400, 400], [a.text for a in answers]
    events = (await http.get(f"{API}/audit", headers=bearer(VIEWER_TOKEN))).json()["events"]
    recorded = sorted(
        ((e["method"], e["outcome"], e["error"], json.loads(e["request_json"])) for e in events), key=repr
    )
    rpcs = ("PauseTaskSchedule", "PauseTaskSchedule", "RemoveTaskScheduleScope", "PauseTaskSchedule")
    expected = [
        (rpc, answer.json()["code"], answer.json()["message"], request)
        for (_, _, _, request), answer, rpc in zip(sent, answers, rpcs, strict=True)
    ]
    assert recorded == sorted(expected, key=repr)


async def test_a_refused_call_s_unparsed_body_is_recorded_without_its_secrets(
    http: httpx.AsyncClient,
) -> None:
    """A channel's secret and URL are kept out of the trail when its request parses (`without_secrets`);
    an unparsed body is redacted alike: a JSON body's secret (any key naming one, a typo's too) as
    "(redacted)", in a request that may hold a secret any key that is no field (a misspelt secret) too,
    each URL as the API shows a Slack one (no user, password, path or query), and the parser's reason
    without the value it quotes; a body that is not JSON, to a request that may hold a secret, is not
    recorded at all, only its size."""
    url = "https://hook-user:hook-pass@hooks.slack.example/services/T0/B0/XOXB?token=tok-123"
    channel = {"name": "pager", "kind": "slack", "url": url, "secret": "s3cret-1", "Secrett": "s3cret-2"}
    extra = [{"webhook_token": "tok-456", "password": {"value": "pw-789"}}]
    sent = {"channel": {**channel, "sceret": "s3cret-4", "schedules": [url]}, "extra": extra}
    recorded = await _refused_request(http, "/notification-channels", json.dumps(sent).encode())
    body = json.loads(recorded["unparsed_body"]["body"])
    assert body == {
        "channel": {
            "name": "pager",
            "kind": "slack",
            "url": "https://hooks.slack.example/…",
            "secret": "(redacted)",
            "Secrett": "(redacted)",
            "sceret": "(redacted)",
            "schedules": ["https://hooks.slack.example/…"],
        },
        "extra": "(redacted)",
    }
    assert recorded["unparsed_body"]["error"].startswith("channel.Secrett: unknown field (channel takes: ")
    wrong_type = {"channel": {"name": "pager", "secret": 987654}}
    quoted = await _refused_request(http, "/notification-channels", json.dumps(wrong_type).encode())
    assert quoted["unparsed_body"] == {
        "error": "channel.secret: expected a string",  # the caller is told ", got 987654"
        "body": '{"channel": {"name": "pager", "secret": "(redacted)"}}',
    }
    not_json = b'{"channel": {"secret": "s3cret-3", "url": "' + url.encode() + b'"'
    withheld = await _refused_request(http, "/notification-channels", not_json)
    assert withheld["unparsed_body"]["body"] == (
        f"({len(not_json)} bytes, not JSON, not recorded: "
        "CreateNotificationChannel's request may hold a secret)"
    )
    for row in (recorded, quoted, withheld):
        text = json.dumps(row)
        leaked = ("s3cret", "hook-pass", "tok-", "pw-789", "XOXB", "T0/B0", "987654")
        assert not any(s in text for s in leaked), text
