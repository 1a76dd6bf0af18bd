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

NOW = datetime(2026, 12, 1, 6, 48, tzinfo=UTC)
RACK_ID = "5f0c4a51-2c1b-4d7e-9a43-0f3a1b2c3d4e"


def stamp(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


class FakeAuditClient:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def list_audit_events(self, **kwargs: Any) -> pb.ListAuditEventsResponse:
        self.calls.append(kwargs)
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
