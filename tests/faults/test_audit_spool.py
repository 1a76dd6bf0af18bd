"""No audit row lost in an outage: an action that committed while the database went away has its event
spooled to a local file and written once the database is back (rackflow.audit.spool).

The failpoint `audit_write` pauses `AuditTrail.record` between the action's commit and its audit write; the
database is taken away during that pause, so the write fails, the event is spooled, and after recovery the
replay writes it, with its id. In-process on both databases (the failpoint replaced: it holds the write until
the outage has begun, however long taking the database away takes), and with a real `rackflow serve` on
PostgreSQL (the failpoint's pause, set by its environment variable).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from rackflow import failpoints, metrics
from rackflow.audit.spool import AuditSpool
from rackflow.audit.trail import AuditTrail
from rackflow.clock import SystemClock
from rackflow.domain.audit import OK, AuditEvent
from rackflow.store import audit as audit_store
from rackflow.store.db import Database
from rackflow.v1 import flow_pb2 as pb
from tests.conftest import sqlite_threads, sqlite_threads_ended
from tests.e2e.cluster import servers, sql
from tests.e2e.fleet import wait_until
from tests.faults.conftest import database_down


@contextmanager
def outage(db: Database, url: str) -> Iterator[None]:
    """The database is unreachable while the block runs. PostgreSQL: connections refused and killed
    (tests/faults/conftest.py). SQLite: the database's directory is moved away, so opening it fails (the
    pool is emptied first: an open SQLite file survives a rename)."""
    if db.is_postgres:
        with database_down(url):
            yield
        return
    directory = Path(db.engine.url.database or "").parent
    away = directory.with_name(directory.name + "-away")
    directory.rename(away)
    try:
        yield
    finally:
        away.rename(directory)


@pytest.fixture
async def db(own_db_url: str) -> AsyncIterator[Database]:
    before = sqlite_threads()
    database = Database(own_db_url)
    yield database
    await database.dispose()
    await sqlite_threads_ended(sqlite_threads() - before)


async def stored(db: Database) -> dict[uuid.UUID, str]:
    async with db.read() as conn:
        found, _ = await audit_store.list_events(conn)
    return {event.id: event.method for event in found}


async def record_through_an_outage(
    trail: AuditTrail, db: Database, url: str, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Record one event whose write comes while the database is away (the failpoint holds it until the
    outage has begun)."""
    held, outage_begun = asyncio.Event(), asyncio.Event()

    async def hold(name: str) -> None:
        if name == "audit_write":
            held.set()
            await outage_begun.wait()

    monkeypatch.setattr(failpoints, "pause", hold)
    recording = asyncio.create_task(
        trail.record(principal="oncall", method=method, target_ids=["x"], outcome=OK, request={})
    )
    await asyncio.wait_for(held.wait(), 15)
    await db.dispose()  # SQLite: no open file survives; PostgreSQL: the outage kills them anyway
    with outage(db, url):
        outage_begun.set()
        await recording


async def test_an_event_written_during_an_outage_is_spooled_and_arrives_after_recovery(
    db: Database,
    own_db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    spool = AuditSpool(db, tmp_path / "audit.spool")
    trail = AuditTrail(db, SystemClock(), spool)
    spooled_before = metrics.AUDIT_EVENTS_SPOOLED._value.get()
    with caplog.at_level(logging.WARNING):
        await record_through_an_outage(trail, db, own_db_url, monkeypatch, "CreateRack")
    assert metrics.AUDIT_EVENTS_SPOOLED._value.get() == spooled_before + 1
    assert "CreateRack by oncall spooled" in caplog.text
    assert spool.pending_bytes() > 0
    assert await stored(db) == {}  # the database is back, the event not yet in it
    spooled_line = spool.path.read_bytes()

    assert await spool.replay() == 1
    events = await stored(db)
    assert list(events.values()) == ["CreateRack"]
    assert spool.pending_bytes() == 0 and not spool.path.exists()

    # A replay cut short after writing (the file was not yet deleted) writes nothing twice.
    spool.path.write_bytes(spooled_line)
    assert await spool.replay() == 1
    assert await stored(db) == events


async def test_a_full_spool_is_loud_and_the_action_stands(
    db: Database,
    own_db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    spool = AuditSpool(db, tmp_path / "audit.spool", max_bytes=100)  # smaller than one event
    trail = AuditTrail(db, SystemClock(), spool)
    lost_before = metrics.AUDIT_EVENTS_LOST._value.get()
    with caplog.at_level(logging.WARNING):
        await record_through_an_outage(
            trail, db, own_db_url, monkeypatch, "DeleteRack"
        )  # returns, never raises
    assert metrics.AUDIT_EVENTS_LOST._value.get() == lost_before + 1
    assert "AUDIT WRITE FAILED: DeleteRack by oncall" in caplog.text
    assert "is full (100 bytes)" in caplog.text
    assert not spool.path.exists()


async def test_the_bound_counts_the_file_of_a_replay_cut_short(db: Database, tmp_path: Path) -> None:
    """A replay the database's going away again cut short leaves `<spool>.replaying` for the next round,
    and new events start a new spool beside it: `--audit-spool-max-bytes` bounds both together."""
    spool = AuditSpool(db, tmp_path / "audit.spool", max_bytes=4096)
    trail = AuditTrail(db, SystemClock(), spool)
    while spool.append(audit_store.PendingEvent(_event(trail, "CreateRack"))):
        pass  # full
    full = spool.path.stat().st_size
    spool.path.rename(spool.replaying)  # as a replay does, which then failed

    assert not spool.append(audit_store.PendingEvent(_event(trail, "DeleteRack")))
    assert not spool.path.exists()
    assert spool.pending_bytes() == full <= spool.max_bytes
    assert metrics.AUDIT_SPOOL_BYTES._value.get() == full

    assert await spool.replay() > 0  # the database is back: room again
    assert spool.append(audit_store.PendingEvent(_event(trail, "DeleteRack")))
    assert metrics.AUDIT_SPOOL_BYTES._value.get() == spool.pending_bytes() == spool.path.stat().st_size


async def test_an_unreadable_line_is_skipped_and_its_neighbours_written(
    db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = AuditSpool(db, tmp_path / "audit.spool")
    trail = AuditTrail(db, SystemClock(), spool)
    for method in ("CreateRack", "DeleteRack"):
        assert spool.append(audit_store.PendingEvent(_event(trail, method)))
    with spool.path.open("ab") as torn:
        torn.write(b'{"id": "a crash cut this li')
    assert spool.append(audit_store.PendingEvent(_event(trail, "AddComponents")))  # after the torn line
    lost_before = metrics.AUDIT_EVENTS_LOST._value.get()
    with caplog.at_level(logging.ERROR):
        assert await spool.replay() == 3
    assert sorted((await stored(db)).values()) == ["AddComponents", "CreateRack", "DeleteRack"]
    assert "line 3 of" in caplog.text and "unreadable" in caplog.text
    assert metrics.AUDIT_EVENTS_LOST._value.get() == lost_before + 1


async def test_an_events_changes_are_spooled_and_a_line_without_them_is_replayed_too(
    db: Database, tmp_path: Path
) -> None:
    """What a DeleteRack changed arrives with its spooled event; a line spooled by the release before
    `changes` (migration 0041), which has no such key, is written with none."""
    spool = AuditSpool(db, tmp_path / "audit.spool")
    trail = AuditTrail(db, SystemClock(), spool)
    removed = [{"scope_entry": "removed", "schedule_id": str(uuid.uuid4()), "schedule_name": "nightly"}]
    deleted = replace(_event(trail, "DeleteRack"), changes=removed)
    assert spool.append(audit_store.PendingEvent(deleted))
    older = _event(trail, "CreateRack")
    assert spool.append(audit_store.PendingEvent(older))
    lines = spool.path.read_bytes().splitlines(keepends=True)
    line = json.loads(lines[1])
    del line["changes"]
    spool.path.write_bytes(lines[0] + json.dumps(line).encode() + b"\n")

    assert await spool.replay() == 2
    async with db.read() as conn:
        found, _ = await audit_store.list_events(conn)
    assert {event.id: event.changes for event in found} == {deleted.id: removed, older.id: None}


async def test_a_line_the_disk_has_no_room_for_is_lost_loudly_and_leaves_no_fragment(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A disk that fills in the middle of a line: write() takes part of it and returns the count (Linux's
    answer when some bytes fit), and ENOSPC only on the next try. The event must not count as spooled (it
    would be found torn, and lost, at the replay), and no fragment may stay in the spool."""
    spool = AuditSpool(db, tmp_path / "audit.spool")
    trail = AuditTrail(db, SystemClock(), spool)
    assert spool.append(audit_store.PendingEvent(_event(trail, "CreateRack")))
    before = spool.path.read_bytes()
    real_write = os.write
    room = [40]  # bytes the disk still has

    def filling_write(fd: int, data: bytes) -> int:
        if room[0] == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken = real_write(fd, data[: room[0]])
        room[0] -= taken
        return taken

    monkeypatch.setattr(os, "write", filling_write)
    with pytest.raises(OSError, match="No space left"):  # AuditTrail logs the event as lost
        spool.append(audit_store.PendingEvent(_event(trail, "DeleteRack")))
    monkeypatch.setattr(os, "write", real_write)
    assert spool.path.read_bytes() == before  # the part that fit is gone again

    assert spool.append(audit_store.PendingEvent(_event(trail, "AddComponents")))  # room again
    caplog.clear()
    assert await spool.replay() == 2
    assert sorted((await stored(db)).values()) == ["AddComponents", "CreateRack"]
    assert "unreadable" not in caplog.text


def _event(trail: AuditTrail, method: str) -> AuditEvent:
    return AuditEvent(
        id=uuid.uuid4(),
        at=trail.clock.now(),
        principal="oncall",
        method=method,
        target_ids=("x",),
        outcome=OK,
        error="",
        request={"name": method},
    )


@pytest.mark.slow
@pytest.mark.postgres
def test_a_served_rpc_whose_audit_write_meets_an_outage_is_in_the_trail_after_recovery(
    pg_db: str, tmp_path: Path
) -> None:
    """A real `rackflow serve`: CreateRack commits, the database goes away before its audit row is written,
    the RPC still answers OK, and the row is in the trail once the database is back."""
    env = {"RACKFLOW_FAILPOINT_AUDIT_WRITE": "2s"}
    with servers(pg_db, tmp_path, 1, env=env) as (server,):
        answer: list[pb.Rack] = []
        call = threading.Thread(
            target=lambda: answer.append(
                server.stub().CreateRack(pb.CreateRackRequest(name="r1"), timeout=30)
            )
        )
        call.start()
        wait_until(lambda: "failpoint audit_write: pausing" in server.output, 10, what="the failpoint")
        with database_down(pg_db):
            wait_until(lambda: "CreateRack by anonymous spooled" in server.output, 15, what="the spooling")
            call.join(10)
        assert answer and answer[0].name == "r1"
        rack_id = answer[0].id.id
        wait_until(
            lambda: bool(sql(pg_db, "SELECT 1 FROM audit_events WHERE method = 'CreateRack'")),
            30,
            what="the spooled event in the trail",
        )
        rows = sql(
            pg_db, "SELECT principal, outcome, target_ids FROM audit_events WHERE method = 'CreateRack'"
        )
        assert len(rows) == 1
        assert rows[0][:2] == ("anonymous", OK) and rack_id in rows[0][2]  # type: ignore[operator]
        assert "events written to the audit trail after an outage" in server.output
        assert server.proc.poll() is None
