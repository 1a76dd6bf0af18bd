"""The audit spool: events whose action committed while the database could not take their row.

Why: an action that committed must be in the audit trail even if the database goes away between the action's
commit and the audit write. `AuditTrail.record` hands such an event (only on `Unavailable`: an outage, not a
bad row) to `AuditSpool.append`, which appends it as one JSON line to a local file and fsyncs it before the
action's caller hears back, so a crash right after loses nothing either. `AuditSpool.run` replays the file
into the database once it answers again, every `DEFAULT_AUDIT_SPOOL_REPLAY_INTERVAL`: each event keeps its
id and the insert skips ids already there (`store.audit.insert_events`), so a replay cut short and repeated
writes every event once. A spooled event's "after" snapshot is read when it is replayed.

The spool is bounded (`--audit-spool-max-bytes`, counting the file and an unfinished replay's): an event that
would not fit is lost, and says so loudly (an ERROR line naming the action, and
`rackflow_audit_events_lost_total`); the server keeps serving. So is an event the disk has no room for, whose
partly written line is cut off again (`_write_whole`). Several processes may share one spool path
(`--audit-spool`): appends and the hand-over to a replay hold an exclusive lock on `<path>.lock` for the few
microseconds they take, and one process at a time replays (`<path>.replay.lock`, not waited for), so no event
is read by two replays or dropped between them.

The replay moves the spool aside to `<path>.replaying` (new events start a new spool), writes it in
transactions of `REPLAY_CHUNK` events, and deletes it once every event is in; a replay that fails (the
database went away again) leaves it there for the next round. An unreadable line (torn by a crash in the
middle of a write, before its fsync) is skipped and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from rackflow import metrics
from rackflow.clock import sleep_unless_stopped
from rackflow.config import DEFAULT_AUDIT_SPOOL_MAX_BYTES, DEFAULT_AUDIT_SPOOL_REPLAY_INTERVAL
from rackflow.domain.audit import AuditEvent, bounded_event
from rackflow.errors import InvalidArgument, Unavailable
from rackflow.store import audit as store
from rackflow.store.db import Database

log = logging.getLogger(__name__)

# Events per replay transaction: a spool of a long outage goes back in short transactions.
REPLAY_CHUNK = 500


def check_spool_path(path: Path) -> None:
    """Refuse, before serving, a spool this process could not write: its directory missing or not one, or
    the path a directory. Found at the first outage instead, it lost every event the spool is there to
    keep. Only looked at: the spool and its `.lock` files are made when first needed."""
    directory = path.parent
    if path.is_dir():
        why = "it is a directory"
    elif not directory.is_dir():
        why = f"{directory} is not a directory" if directory.exists() else f"{directory} does not exist"
    elif not os.access(directory, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        why = "permission denied"
    else:
        return
    raise InvalidArgument(f"--audit-spool: cannot keep audit events in {path}: {why}")


def _to_line(pending: store.PendingEvent) -> bytes:
    """The event as the trail keeps it (`bounded_event`, as `store.insert_events` writes it), one line."""
    event = bounded_event(pending.event)
    record = {
        "id": str(event.id),
        "at": event.at.isoformat(),
        "principal": event.principal,
        "method": event.method,
        "target_ids": list(event.target_ids),
        "outcome": event.outcome,
        "error": event.error,
        "request": event.request,
        "schedule_before": event.schedule_before,
        "changes": event.changes,
        "after_of": str(pending.after_of) if pending.after_of is not None else None,
    }
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def _from_line(line: bytes) -> store.PendingEvent:
    record: dict[str, Any] = json.loads(line)
    event = AuditEvent(
        id=uuid.UUID(record["id"]),
        at=datetime.fromisoformat(record["at"]),
        principal=record["principal"],
        method=record["method"],
        target_ids=tuple(record["target_ids"]),
        outcome=record["outcome"],
        error=record["error"],
        request=record["request"],
        schedule_before=record["schedule_before"],
        changes=record.get("changes"),  # absent from the lines of a release before it
    )
    after_of = uuid.UUID(record["after_of"]) if record["after_of"] is not None else None
    return store.PendingEvent(event, after_of=after_of)


class AuditSpool:
    """One spool file: `append` from `AuditTrail.record`, `run(stop)` beside the other workers."""

    def __init__(
        self,
        db: Database,
        path: Path,
        *,
        max_bytes: int = DEFAULT_AUDIT_SPOOL_MAX_BYTES,
        every: timedelta = DEFAULT_AUDIT_SPOOL_REPLAY_INTERVAL,
    ) -> None:
        self.db = db
        self.path = path
        self.max_bytes = max_bytes
        self.every = every
        self.replaying = path.with_name(path.name + ".replaying")
        self._lock_path = path.with_name(path.name + ".lock")
        self._replay_lock_path = path.with_name(path.name + ".replay.lock")

    @contextlib.contextmanager
    def _locked(self, lock_path: Path, *, wait: bool = True) -> Iterator[bool]:
        """Hold an exclusive lock on `lock_path`; yields False (not held) if `wait` is off and it is taken."""
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock

    def append(self, pending: store.PendingEvent) -> bool:
        """Append one event and fsync it; False (nothing written) when it would not fit.

        Synchronous on purpose: it runs only during an outage, and the action's caller must not hear back
        before its event is on disk.
        """
        line = _to_line(pending)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked(self._lock_path):
            size = self.path.stat().st_size if self.path.exists() else 0
            # The bound holds the whole spool: a replay that failed (the database went away again) leaves
            # its `.replaying` file, and new events start a new spool beside it.
            spooled = self.pending_bytes()
            if spooled + len(line) > self.max_bytes:
                return False
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line  # a torn last line (a crash mid-write) must not swallow this one
                _write_whole(fd, line, size)
            finally:
                os.close(fd)
            if size == 0:
                _fsync_dir(self.path.parent)  # a new file's name survives a crash too
        metrics.AUDIT_SPOOL_BYTES.set(spooled + len(line))
        return True

    def pending_bytes(self) -> int:
        """Bytes waiting in the spool and in an unfinished replay."""
        return sum(p.stat().st_size for p in (self.path, self.replaying) if p.exists())

    async def run(self, stop: asyncio.Event) -> None:
        """Replay at once, then every `every` until `stop`; failures are logged and retried."""
        while not stop.is_set():
            if self.pending_bytes():
                try:
                    await self.replay()
                except Exception as exc:
                    log.warning("audit spool: replay failed (%s); retrying in %s", exc, self.every)
            await sleep_unless_stopped(stop, self.every)

    async def replay(self) -> int:
        """Write every spooled event into the database (skipping ids already there) and empty the spool.
        Returns how many were written; 0 when another process is replaying this spool."""
        with self._locked(self._replay_lock_path, wait=False) as held:
            if not held:
                return 0
            written = 0
            while True:
                if not self.replaying.exists():
                    with self._locked(self._lock_path):
                        if not self.path.exists():
                            break
                        self.path.rename(self.replaying)
                        _fsync_dir(self.path.parent)
                written += await self._replay_file()
                self.replaying.unlink()
                metrics.AUDIT_SPOOL_BYTES.set(self.pending_bytes())
            if written:
                log.warning("audit spool: %d events written to the audit trail after an outage", written)
            return written

    async def _replay_file(self) -> int:
        events = list(self._read(self.replaying))
        for start in range(0, len(events), REPLAY_CHUNK):
            chunk = events[start : start + REPLAY_CHUNK]
            try:
                async with self.db.transaction() as conn:
                    await store.write_events(conn, chunk)
            except Unavailable:
                raise
            except Exception:
                await self._write_one_by_one(chunk)
            metrics.AUDIT_EVENTS_REPLAYED.inc(len(chunk))
        return len(events)

    async def _write_one_by_one(self, chunk: list[store.PendingEvent]) -> None:
        """A chunk refused for something else than an outage: write its events alone, so the one that
        cannot be written (logged, counted as lost) does not keep the others out forever."""
        for pending in chunk:
            try:
                async with self.db.transaction() as conn:
                    await store.write_events(conn, [pending])
            except Unavailable:
                raise
            except Exception:
                metrics.AUDIT_EVENTS_LOST.inc()
                log.exception(
                    "AUDIT EVENT LOST: spooled event %s (%s by %s) cannot be written",
                    pending.event.id,
                    pending.event.method,
                    pending.event.principal,
                )

    def _read(self, path: Path) -> Iterator[store.PendingEvent]:
        with path.open("rb") as spooled:
            for number, line in enumerate(spooled, 1):
                try:
                    yield _from_line(line)
                except (ValueError, KeyError, TypeError):
                    metrics.AUDIT_EVENTS_LOST.inc()
                    log.error("AUDIT EVENT LOST: line %d of %s is unreadable (torn write?)", number, path)


def _write_whole(fd: int, line: bytes, size: int) -> None:
    """Append all of `line` and fsync it, or raise OSError with the file cut back to `size`.

    A disk that fills mid-line takes part of a write and says how much (ENOSPC comes only on the next
    try): taken for done, that event would count as spooled and then be found torn, and lost, at the
    replay. Cut back, the event is reported lost by its caller, and no fragment stays behind.
    """
    try:
        written = 0
        while written < len(line):
            written += os.write(fd, line[written:])
        os.fsync(fd)
    except OSError:
        os.ftruncate(fd, size)
        raise


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
