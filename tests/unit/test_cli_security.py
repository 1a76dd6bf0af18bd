"""`rackflow audit`, `rackflow auth hash-token` and the client's TLS/token options, over a fake client."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.cli.audit import parse_since
from rackflow.cli.main import main
from rackflow.cli.output import Session
from rackflow.cli.security import use_connection
from rackflow.client import RackflowClient
from rackflow.clock import FakeClock
from rackflow.security import hash_token
from rackflow.v1 import flow_pb2 as pb
from tests.certs import Pki, make_pki

NOW = datetime(2026, 12, 1, 6, 48, tzinfo=UTC)
RACK_ID = "5f0c4a51-2c1b-4d7e-9a43-0f3a1b2c3d4e"


def stamp(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


class FakeAuditClient:
    def __init__(self, events: list[pb.AuditEvent] | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.events = events

    def list_audit_events(self, **kwargs: Any) -> pb.ListAuditEventsResponse:
        self.calls.append(kwargs)
        if self.events is not None:
            return pb.ListAuditEventsResponse(total=len(self.events), events=self.events)
        return pb.ListAuditEventsResponse(
            total=7,
            events=[
                pb.AuditEvent(
                    at=stamp(NOW),
                    principal="oncall",
                    method="DeleteRack",
                    outcome="NOT_FOUND",
                    target_ids=[pb.UUID(id=RACK_ID)],
                    error="id: no rack",
                ),
                pb.AuditEvent(
                    at=stamp(NOW),
                    principal="ci",
                    method="PowerOnRack",
                    outcome="OK",
                    target_ids=[pb.UUID(id=RACK_ID), pb.UUID(id="t1"), pb.UUID(id="t2")],
                ),
            ],
        )

    def resolve_target_id(self, target: str) -> str:
        return target  # an id, as the test gives: the client's look-up of a name is tested in tests/e2e

    def close(self) -> None:
        pass


def run(client: FakeAuditClient, *args: str) -> Result:
    session = Session(connect=lambda _server: client, clock=FakeClock(NOW))  # type: ignore[arg-type,return-value]
    return CliRunner().invoke(main, list(args), obj=session)


def test_audit_sends_the_filters_and_shows_a_table() -> None:
    client = FakeAuditClient()
    filters = ("--since", "24h", "--method", "DeleteRack", "--principal", "oncall", "--target", RACK_ID)
    result = run(client, "audit", *filters, "--limit", "5")
    assert result.exit_code == 0, result.output
    expected = {
        "since": NOW - timedelta(hours=24),
        "method": "DeleteRack",
        "principal": "oncall",
        "target": RACK_ID,
    }
    assert client.calls == [{**expected, "offset": 0, "limit": 5, "page_token": ""}]
    assert "2 of 7 events" in result.output
    assert "oncall" in result.output and "NOT_FOUND" in result.output
    assert f"{RACK_ID} (+2)" in result.output


TASK_ID = "0193a5c2-7f1e-7c3a-9d4b-2f6e8a1b3c5d"
WINDOW_ID = "0193a5c2-7f1e-7c3a-9d4b-00000000000a"
EVENT_ID = "0193a5c2-7f1e-7c3a-9d4b-00000000000e"


def redecided(owed_by: dict[str, Any]) -> pb.AuditEvent:
    """A decision rackflow took by itself that a window's change owed (docs/SECURITY.md, `owed_by`)."""
    request = {"task_id": TASK_ID, "decided_by": "look_again", "owed_by": owed_by}
    return pb.AuditEvent(
        at=stamp(NOW),
        principal="rackflow",
        method="RedecideWindowTask",
        outcome="OK",
        target_ids=[pb.UUID(id=TASK_ID), pb.UUID(id=WINDOW_ID)],
        request_json=json.dumps(request),
    )


def test_audit_shows_what_owed_a_decision_rackflow_took() -> None:
    """Each RedecideWindowTask row says what made its decision owed, and when: the window's change and its
    caller (and that its call's event was not in the trail, when so), a firing's submit that found the
    windows changed since its plan, or no cause recorded; the change's event id is left to `-o json`."""
    since = "2026-12-01T06:30:00Z"
    events = [
        redecided(
            {
                "change": "window_updated",
                "window_id": WINDOW_ID,
                "window_name": "nightly",
                "event_id": EVENT_ID,
                "principal": "alice",
                "owed_since": since,
            }
        ),
        redecided(
            {
                "change": "window_created",
                "window_id": WINDOW_ID,
                "window_name": "new",
                "event_id": EVENT_ID,
                "principal": "bob",
                "owed_since": since,
                "event_found": False,
            }
        ),
        redecided(
            {"change": "window_deleted", "window_id": WINDOW_ID, "window_name": "gone", "owed_since": since}
        ),
        redecided(
            {
                "change": "windows_changed_before_submit",
                "planned_at": "2026-12-01T06:00:00Z",
                "window_ids": [WINDOW_ID],
                "owed_since": since,
            }
        ),
        redecided({"change": "not_recorded", "owed_since": since}),
    ]
    result = run(FakeAuditClient(events), "audit", "--method", "RedecideWindowTask")
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())  # (the detail wraps, or moves under its row, as the width has it)
    assert "DETAIL" in shown
    assert "owed by window 'nightly' updated by alice at 2026-12-01 06:30Z" in shown
    assert "owed by window 'gone' deleted at 2026-12-01 06:30Z" in shown
    assert (
        "owed by window 'new' created by bob at 2026-12-01 06:30Z; its call's event was not in the trail"
        in shown
    )
    assert (
        "owed by windows changed between its firing's plan (2026-12-01 06:00Z) and submit (2026-12-01 06:30Z)"
        in shown
    )
    assert "owed since 2026-12-01 06:30Z (its cause not recorded: an older release)" in shown
    assert EVENT_ID not in shown

    as_json = run(FakeAuditClient(events[:1]), "audit", "-o", "json")
    [event] = json.loads(as_json.output)["events"]
    assert json.loads(event["request_json"])["owed_by"]["event_id"] == EVENT_ID


def test_audit_json_is_the_message() -> None:
    result = run(FakeAuditClient(), "audit", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["total"] == 7


def test_since_takes_a_duration_or_an_rfc3339_time() -> None:
    assert parse_since("30m", NOW) == NOW - timedelta(minutes=30)
    assert parse_since("2026-11-30T00:00:00Z", NOW) == datetime(2026, 11, 30, tzinfo=UTC)
    with pytest.raises(click.BadParameter, match="neither a duration"):
        parse_since("yesterday", NOW)
    assert run(FakeAuditClient(), "audit", "--since", "2026-11-30").exit_code == 2


def test_hash_token_reads_stdin() -> None:
    result = CliRunner().invoke(main, ["auth", "hash-token"], input="s3cret-token\n")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == hash_token("s3cret-token")
    assert "s3cret-token" not in result.output
    assert CliRunner().invoke(main, ["auth", "hash-token"], input="").exit_code == 2


def test_without_tls_or_token_the_session_keeps_its_connector() -> None:
    session = Session()
    use_connection(session, tls_ca=None, tls_cert=None, tls_key=None, token=None)
    assert session.connect is RackflowClient


def test_unreadable_tls_files_are_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--tls-ca", str(tmp_path / "missing.pem"), "audit"])
    assert result.exit_code == 2
    assert "--tls-ca: cannot read" in result.output


def _event(principal: str, method: str, request: dict[str, Any], error: str = "") -> pb.AuditEvent:
    return pb.AuditEvent(
        at=stamp(NOW),
        principal=principal,
        method=method,
        outcome="FAILED_PRECONDITION" if error else "OK",
        error=error,
        target_ids=[pb.UUID(id=RACK_ID)],
        request_json=json.dumps({"id": RACK_ID, **request}),
    )


def test_audit_says_why_a_pause_resume_expiry_or_rejection_was_made() -> None:
    """The trail's table says who and what; the why of a safe operation (a pause's reason, a rejection's
    comment, what rackflow's own pause, resume or expiry was for) sat in `-o json` alone, so a reader of
    `rackflow audit` saw "rackflow PauseTaskSchedule" and had to dig for the failing runs that caused it."""
    events = [
        _event("oncall", "PauseTaskSchedule", {"reason": "rack-02 PSU swap, INC-4411", "resume_at": "…"}),
        _event("rackflow", "PauseTaskSchedule", {"reason": "paused by rackflow: 3 consecutive runs …"}),
        _event(
            "rackflow",
            "ResumeTaskSchedule",
            {"pause_ended": {"reason": "INC-4411", "by": "oncall", "at": "…", "resume_at": "…"}},
        ),
        _event("rackflow", "ResumeTaskSchedule", {"pause_ended": {"reason": "", "by": "", "resume_at": "…"}}),
        _event("rackflow", "ExpireTaskScheduleRun", {"reason": "not approved by 2026-12-01T10:00Z (0 of 1)"}),
        _event("bob", "RejectTaskScheduleRun", {"comment": "firmware 2.1.0 bricks PSUs"}),
        _event("bob", "RejectTaskScheduleRun", {"comment": "late"}, error="id: run … is rejected; …"),
    ]
    result = run(FakeAuditClient(events), "audit")
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())
    assert "rack-02 PSU swap, INC-4411" in shown
    assert "paused by rackflow: 3 consecutive runs …" in shown
    assert "ended the pause by oncall at its end: INC-4411" in shown
    assert "ended the pause by an anonymous caller at its end" in shown
    assert "not approved by 2026-12-01T10:00Z (0 of 1)" in shown
    assert "firmware 2.1.0 bricks PSUs" in shown
    assert "id: run … is rejected; …" in shown and "late" not in shown  # a refusal: its error


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.mark.parametrize("case", ["no CA", "another's key", "no key"])
def test_tls_files_that_are_no_certificate_or_its_key_are_a_usage_error(
    pki: Pki, tmp_path: Path, case: str
) -> None:
    """A CA file holding no certificate, or a client key of another certificate, were sent to gRPC, which
    wrote `Could not load any root certificate.` / `Invalid private key.` four times in its own format and
    answered `UNAVAILABLE: failed to connect to all addresses` (exit 1), as if the server were down."""
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    ca, cert = str(pki.ca.cert), str(pki.client.cert)
    args, message = {
        "no CA": (["--tls-ca", str(not_pem)], f"--tls-ca: {not_pem} holds no PEM certificate"),
        "another's key": (
            ["--tls-ca", ca, "--tls-cert", cert, "--tls-key", str(pki.server.key)],
            f"--tls-key: {pki.server.key} is not the private key of the certificate in {cert}",
        ),
        "no key": (
            ["--tls-ca", ca, "--tls-cert", cert, "--tls-key", str(not_pem)],
            f"--tls-key: {not_pem} is not a PEM private key (unencrypted) of the certificate in {cert}",
        ),
    }[case]
    result = CliRunner().invoke(main, [*args, "audit"])
    assert result.exit_code == 2, result.output
    assert f"Error: {message}" in result.output
