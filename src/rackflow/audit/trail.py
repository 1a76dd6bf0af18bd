"""Recording and listing audit events: every front end records through `AuditTrail.record`.

The gRPC interceptor (`rackflow.api.audit`) records every mutating RPC; another front end (an HTTP
handler, say) records its actions the same way: read the schedule's "before" with `schedule_before` when
the action names a schedule, carry the action out, then `record` one event with the principal, the method,
the ids it touched, the outcome (`OK` or the status code's name), the request as JSON, the schedule
whose "after" to read, and what its service noted it changed besides (`rackflow.audit.changes`).

Concurrent events are written together (`GroupCommit`, one writer per process): one transaction reads all
their "after" snapshots (two queries) and inserts all their rows (one INSERT), after the actions' own
transactions committed. The "after" snapshot is read there, not taken from an action's reply, because a
reply lacks what the snapshot holds (the operation template, the timezone, the scopes). `record` returns
only once its row is committed, so an action that returned has its event in the trail. What that saves:
docs/PERFORMANCE.md, "api".

An audit failure cannot roll back or fail an action that succeeded: it is counted in
`rackflow_audit_write_failures_total` instead (a failed group is retried one row per transaction, so one
bad row does not lose its neighbours). When the database is unavailable (an outage between the action's
commit and the audit write), the event goes to the local spool (`rackflow.audit.spool`, fsync'd before
`record` returns) and is written once the database is back; any other failure, or a full spool, is logged
at ERROR and the event is lost. The price: a crash between the action's commit and the audit write loses
those events, and a concurrent change to the same schedule can fall between a before and an after snapshot
(the after is read when its group is written, at most one round after the action committed; for a spooled
event, when it is replayed). `close` waits for queued rows, so a clean shutdown loses none.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow import failpoints, metrics
from rackflow.audit.spool import AuditSpool
from rackflow.clock import Clock
from rackflow.config import AUDIT_PAGE_MAX_BYTES
from rackflow.domain.audit import (
    EVERY_EVENT,
    OK,
    SYSTEM_PRINCIPAL,
    AuditEvent,
    EventFilter,
    bounded_event,
    event_bytes,
)
from rackflow.errors import Unavailable
from rackflow.ids import new_id
from rackflow.store import audit as store
from rackflow.store.db import Database
from rackflow.store.group_commit import GroupCommit
from rackflow.store.paging import Listed
from rackflow.validation import check_text

log = logging.getLogger(__name__)

_T = TypeVar("_T")
# What a NUL in a recorded text becomes: U+2400 SYMBOL FOR NULL (`_storable`).
NUL_RECORDED_AS = "\u2400"


class AuditTrail:
    """The audit trail of one process: records events (grouped into shared transactions) and lists them.
    Without a `spool`, an event the database cannot take is lost (logged and counted)."""

    def __init__(self, db: Database, clock: Clock, spool: AuditSpool | None = None) -> None:
        self.db = db
        self.clock = clock
        self.spool = spool
        self._writer: GroupCommit[store.PendingEvent, None] = GroupCommit(db, store.write_events)

    async def close(self) -> None:
        """Wait for the events already queued to be written (before the database is closed)."""
        await self._writer.close()

    async def schedule_of_scope(self, scope_id: uuid.UUID) -> uuid.UUID | None:
        """The schedule a scope entry belongs to (None: no such scope, or the read failed, logged)."""
        return await self._read(f"the schedule of scope {scope_id}", store.schedule_of_scope, scope_id)

    async def schedule_of_run(self, run_id: uuid.UUID) -> uuid.UUID | None:
        """The schedule a run belongs to (None: no such run, or the read failed, logged)."""
        return await self._read(f"the schedule of run {run_id}", store.schedule_of_run, run_id)

    async def schedule_before(self, schedule_id: uuid.UUID | None) -> dict[str, Any] | None:
        """The schedule (row and scopes) as JSON, to record as an action's "before" (None: no schedule, or
        the read failed, which is logged: the action goes ahead all the same)."""
        if schedule_id is None:
            return None
        return await self._read(f"schedule {schedule_id}", store.schedule_snapshot, schedule_id)

    async def _read(
        self, what: str, query: Callable[[AsyncConnection, uuid.UUID], Awaitable[_T | None]], key: uuid.UUID
    ) -> _T | None:
        """`query(conn, key)` in a read of its own; None, logged, when it fails (auditing never fails an
        action)."""
        try:
            async with self.db.read() as conn:
                return await query(conn, key)
        except Exception:
            log.exception("audit: cannot read %s", what)
            return None

    async def record(
        self,
        *,
        principal: str,
        method: str,
        target_ids: Sequence[str],
        outcome: str,
        request: dict[str, Any],
        error: str = "",
        schedule_id: uuid.UUID | None = None,
        before: dict[str, Any] | None = None,
        changes: list[dict[str, Any]] | None = None,
        event_id: uuid.UUID | None = None,
    ) -> None:
        """Record one action: `principal` called `method` on `target_ids` and it ended with `outcome`
        (`OK`, or the status code's name with `error`). With `schedule_id`, the event holds `before` and
        the schedule as the write finds it; `changes`, what the action changed that `target_ids` names but
        the request does not; `event_id`, the id the action's services were told its event carries
        (`rackflow.audit.changes.Changes`), else a new one. Returns once the event is committed, or spooled
        while the database is unavailable; never raises (a failure is logged loudly and counted, so the
        action's own result stands).
        """
        # Bounded where it is kept (`domain.audit.bounded_event`): by the insert and by the spool's line.
        event = AuditEvent(
            id=event_id or new_id(),
            at=self.clock.now(),
            principal=principal,
            method=method,
            target_ids=tuple(_storable(target_id) for target_id in target_ids),
            outcome=outcome,
            error=_storable(error),
            request=_storable(request),
            schedule_before=before,
            changes=changes,
        )
        pending = store.PendingEvent(event, after_of=schedule_id)
        try:
            await failpoints.pause("audit_write")  # the action has committed; its event is not written yet
            await self._writer.write(pending)
        except Unavailable as exc:
            metrics.AUDIT_WRITE_FAILURES.inc()
            self._spool_or_lose(pending, exc)
        except Exception:
            metrics.AUDIT_WRITE_FAILURES.inc()
            metrics.AUDIT_EVENTS_LOST.inc()
            log.exception(
                "AUDIT WRITE FAILED: %s by %s (outcome %s) is not in the audit trail",
                method,
                principal,
                outcome,
            )

    async def record_rackflow_pause(
        self, schedule_id: uuid.UUID, reason: str, *, run_id: uuid.UUID | None = None, **why: Any
    ) -> None:
        """Record a pause rackflow made, once it committed: a PauseTaskSchedule by rackflow, naming the
        schedule, with the reason and what made it: a run (`store.schedules.pause_by_rackflow`: a rollout's
        halt or its cancel at its firmware window's end, one done over its failure limit, a firing past
        its operation's window), also a target, or
        `why`'s fields (the failed runs of a streak, a pause that ended past a firmware window)."""
        made_by = {"run_id": str(run_id)} if run_id is not None else {}
        await self.record(
            principal=SYSTEM_PRINCIPAL,
            method="PauseTaskSchedule",
            target_ids=[str(schedule_id), *made_by.values()],
            outcome=OK,
            request={"id": str(schedule_id), "reason": reason, **made_by, **why},
            schedule_id=schedule_id,
        )

    async def record_rackflow_run_end(
        self, method: str, run_id: uuid.UUID, schedule_id: uuid.UUID, reason: str
    ) -> None:
        """Record a run rackflow ended itself, once it committed (`method`: an approval's expiry, a
        rollout's cancel at its firmware window's end), by rackflow, naming the run and its schedule, with
        the reason."""
        await self.record(
            principal=SYSTEM_PRINCIPAL,
            method=method,
            target_ids=[str(schedule_id), str(run_id)],
            outcome=OK,
            request={"id": str(run_id), "reason": reason},
            schedule_id=schedule_id,
        )

    def _spool_or_lose(self, pending: store.PendingEvent, why: Unavailable) -> None:
        """Spool an event the database could not take; when that fails too, say loudly that it is lost."""
        event = pending.event
        reason = "is off"
        if self.spool is not None:
            try:
                if self.spool.append(pending):
                    metrics.AUDIT_EVENTS_SPOOLED.inc()
                    log.warning(
                        "audit: %s by %s spooled to %s until the database is back (%s)",
                        event.method,
                        event.principal,
                        self.spool.path,
                        why,
                    )
                    return
                reason = f"{self.spool.path} is full ({self.spool.max_bytes} bytes)"
            except OSError as exc:
                reason = f"{self.spool.path} cannot be written ({exc})"
        metrics.AUDIT_EVENTS_LOST.inc()
        log.error(
            "AUDIT WRITE FAILED: %s by %s (outcome %s) is not in the audit trail: the database is"
            " unavailable (%s) and the audit spool %s",
            event.method,
            event.principal,
            event.outcome,
            why,
            reason,
        )

    async def list_events(
        self,
        matching: EventFilter = EVERY_EVENT,
        *,
        offset: int = 0,
        limit: int | None = None,
        after: Sequence[Any] | None = None,
    ) -> tuple[list[AuditEvent], Listed]:
        """One page of events, newest first (after the `store.EVENT_ORDER` key `after`), and how many
        match the filter before paging (counted up to LIST_COUNT_CAP, then more; by target on SQLite, a
        page walks a bounded range: `store.list_events`)."""
        # No row can hold a longer or control-character name: refuse it before the query.
        check_text(matching.principal or "", "principal")
        async with self.db.read() as conn:
            events, listed = await store.list_events(conn, matching, offset=offset, limit=limit, after=after)
        return _within_page_bytes(events, listed)


def _within_page_bytes(events: list[AuditEvent], listed: Listed) -> tuple[list[AuditEvent], Listed]:
    """The page's events up to AUDIT_PAGE_MAX_BYTES (`domain.audit.event_bytes`), at least one; a page
    cut there says where it ended (`Listed.searched_to`, the key of its last event), so the next page goes
    on after it, as a walked page does, whatever its limit. An event past the budget by itself (a row kept
    whole before events were bounded) is sent as the trail keeps events now (`bounded_event`).

    Why: a page of rows holding megabytes each passed gRPC's 64 MiB send limit (RESOURCE_EXHAUSTED), and a
    client's default 4 MiB receive limit long before, and the trail could not be read past them; bounded
    rows alone do not help the rows written before."""
    page: list[AuditEvent] = []
    size = 0
    for event in events:
        event_size = event_bytes(event)
        if event_size > AUDIT_PAGE_MAX_BYTES:
            event = bounded_event(event)
            event_size = event_bytes(event)
        if page and size + event_size > AUDIT_PAGE_MAX_BYTES:
            return page, replace(listed, searched_to=(page[-1].at, page[-1].id))
        page.append(event)
        size += event_size
    return page, listed


def _storable(value: Any) -> Any:
    """`value` (text, or JSON of dicts and lists) with every NUL shown as NUL_RECORDED_AS.

    Why: PostgreSQL stores no NUL in text or JSONB, and what the caller sent is recorded as sent, before
    anything validated it: a request refused for holding a NUL (a probe, a broken client) failed its
    row's insert there and left no trace. One rule on both databases, so SQLite's trail reads the same.
    """
    if isinstance(value, str):
        return value.replace("\x00", NUL_RECORDED_AS)
    if isinstance(value, dict):
        return {_storable(key): _storable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_storable(item) for item in value]
    return value
