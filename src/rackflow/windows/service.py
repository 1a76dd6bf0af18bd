"""Maintenance window use cases. Each request is one transaction, so a refused request writes nothing.

Validation happens before any write and names the request's field (`window.recurring.duration`,
`window.racks[1]`); racks and domains named by id or name are resolved here, in the same transaction.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.audit import decisions as audit
from rackflow.clock import Clock
from rackflow.domain.audit import WINDOW_CREATED, WINDOW_DELETED, WINDOW_UPDATED
from rackflow.domain.tasks import OperationKind
from rackflow.domain.window_rules import WindowEvent, events
from rackflow.domain.windows import MaintenanceWindow, OneOff, RackRef, Recurring, When, WindowKind
from rackflow.errors import InvalidArgument, NotFound
from rackflow.ids import new_id
from rackflow.store import inventory as inventory_store
from rackflow.store import task_runs
from rackflow.store import windows as store
from rackflow.store.db import Database
from rackflow.store.tables import nvl_domains, racks
from rackflow.timespec import format_rfc3339
from rackflow.validation import (
    MAX_TARGETS,
    at_most,
    check_description,
    check_mask,
    check_name,
    check_rename,
    check_text,
    distinct_operations,
    preview_count,
)
from rackflow.windows.gate import FreezeGate, let_go_of_freezes

log = logging.getLogger(__name__)

NAME_PATH = "window.name"
REASON_PATH = "window.reason"
KIND_PATH = "window.kind"
WHEN_PATH = "window.when"
RACKS_PATH = "window.racks"
DOMAINS_PATH = "window.nvl_domains"
OPERATIONS_PATH = "window.operations"
UPDATE_PATHS = (NAME_PATH, REASON_PATH, KIND_PATH, WHEN_PATH, RACKS_PATH, DOMAINS_PATH, OPERATIONS_PATH)


@dataclass(frozen=True)
class Ref:
    """A rack or an NVLink domain as a request names it: by id, or else by name."""

    id: uuid.UUID | None = None
    name: str = ""


@dataclass(frozen=True)
class WindowInput:
    """A window as a request gives it (create, or the masked fields of an update)."""

    name: str = ""
    reason: str = ""
    kind: WindowKind | None = None
    when: When | None = None
    racks: tuple[Ref, ...] = ()
    domains: tuple[Ref, ...] = ()
    operations: tuple[OperationKind, ...] = ()


def _check_when(when: When | None, now: datetime) -> When:
    if when is None:
        raise InvalidArgument(
            f"{WHEN_PATH}: give recurring {{cron, duration, timezone}} or one_off {{start, end}}"
        )
    try:
        if isinstance(when, Recurring):
            when.check(now, "window.recurring")
        else:
            when.check("window.one_off")
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    return when


def _not_over(when: When, now: datetime) -> When:
    """A new one-off window that has already ended would never apply: refused, since a FREEZE given the
    wrong year or offset would protect nothing while its list showed it there. (An update may end a window
    early, at now or before: that is how a freeze is lifted.)"""
    if isinstance(when, OneOff) and when.end <= now:
        raise InvalidArgument(
            f"window.one_off.end: {format_rfc3339(when.end)} has passed (now {format_rfc3339(now)}): the "
            "window would never apply"
        )
    return when


async def resolve_refs(
    conn: AsyncConnection, refs: Sequence[Ref], field: str, what: str, by_column: str
) -> tuple[tuple[uuid.UUID, str], ...]:
    """(id, name) of each named rack or domain, in request order; NotFound naming `field[i]`. At most
    MAX_TARGETS of them: a window's and a check's are asked about at every claim of a task on a rack."""
    at_most(refs, MAX_TARGETS, field, "racks" if by_column == "racks" else "NVLink domains")
    lookup = inventory_store.racks_by_column if by_column == "racks" else inventory_store.domains_by_column
    for index, ref in enumerate(refs):
        if ref.id is None:
            check_text(ref.name, f"{field}[{index}].name", required=True)
    by_id = await lookup(conn, "id", [r.id for r in refs if r.id is not None])
    by_name = await lookup(conn, "name", [r.name for r in refs if r.id is None])
    table = racks if by_column == "racks" else nvl_domains
    names = await inventory_store.names_by_id(conn, table, [*by_id.values(), *by_name.values()])
    found: list[tuple[uuid.UUID, str]] = []
    for index, ref in enumerate(refs):
        found_id = by_id.get(ref.id) if ref.id is not None else by_name.get(ref.name)
        if found_id is None:
            label = f"id {ref.id}" if ref.id is not None else f"name {ref.name!r}"
            raise NotFound(f"{field}[{index}]: no {what} with {label}")
        if any(found_id == i for i, _ in found):
            raise InvalidArgument(f"{field}[{index}]: the {what} {names[found_id]!r} is listed twice")
        found.append((found_id, names[found_id]))
    return tuple(found)


class Redeciding(Protocol):
    """What decides again the waits of the tasks a window deferred (`rackflow.tasks.deferrals`, above
    this layer: it ends tasks and promotes their racks' queues)."""

    async def redecide_in(
        self,
        conn: AsyncConnection,
        changed: Sequence[MaintenanceWindow],
        now: datetime,
        write: Callable[[], Awaitable[object]],
        change: str,
    ) -> Callable[[], Awaitable[None]]:
        """In the caller's transaction, for the window as it was and is (created: as it is): locks the
        runs and racks it may touch, then `write`s the change (the window's write checks its racks' keys,
        so it comes after their locks: the lock order of `rackflow.tasks.deferrals`), then decides, and
        records a task it skipped owed a decision, caused by `change` (`domain.audit.WINDOW_CREATED`,
        `WINDOW_UPDATED`, `WINDOW_DELETED`) to the window as it is (as it was, deleted);
        returns what to do once it committed (which decides again, in transactions of its own, the tasks
        whose rows another transaction held), which never raises: the change is made, and what it could not
        finish is left to the executors' look again."""
        ...


class WindowService:
    def __init__(self, db: Database, clock: Clock, deferrals: Redeciding) -> None:
        self.db = db
        self.clock = clock
        self.deferrals = deferrals

    async def _load(self, conn: AsyncConnection, window_id: uuid.UUID) -> MaintenanceWindow:
        window = await store.get_window(conn, window_id)
        if window is None:
            raise NotFound(f"id: no maintenance window {window_id}")
        return window

    async def _in_turn(self, conn: AsyncConnection) -> datetime:
        """Take this edit's turn (`store.windows.edits_in_turn`), then read the clock: "now" is when the
        edit decides its tasks, after the edits before it committed, not when it began waiting for them
        (a task whose wait ended meanwhile must not be decided as still waiting)."""
        await store.edits_in_turn(conn)
        return self.clock.now()

    async def create(self, given: WindowInput) -> MaintenanceWindow:
        """Create the window; the tasks bound to the windows on the racks it covers (deferred under DEFER,
        or fired inside an ALLOW window) are decided again as `update` decides them: a new freeze over a
        deferred task's opening moves it, a new ALLOW window may release or bind one again."""
        check_name(given.name, NAME_PATH)
        check_description(given.reason, REASON_PATH)
        if given.kind is None:
            raise InvalidArgument(f"{KIND_PATH}: a kind is required (ALLOW or FREEZE)")
        operations = distinct_operations(given.operations, OPERATIONS_PATH)
        async with self.db.transaction() as conn:
            now = await self._in_turn(conn)
            when = _not_over(_check_when(given.when, now), now)
            if await store.name_taken(conn, given.name):
                raise store.name_taken_error(given.name)
            covered = await resolve_refs(conn, given.racks, RACKS_PATH, "rack", "racks")
            domains = await resolve_refs(conn, given.domains, DOMAINS_PATH, "NVLink domain", "domains")
            window = MaintenanceWindow(
                id=new_id(),
                name=given.name,
                reason=given.reason,
                kind=given.kind,
                when=when,
                all_racks=not covered and not domains,
                racks=covered,
                domains=domains,
                operations=operations,
                created_at=now,
                updated_at=now,
            )
            once_committed = await self.deferrals.redecide_in(
                conn, (window,), now, lambda: store.insert_window(conn, window), WINDOW_CREATED
            )
        await once_committed()
        return window

    async def get(self, window_id: uuid.UUID) -> MaintenanceWindow:
        async with self.db.read() as conn:
            return await self._load(conn, window_id)

    async def list_windows(self, rack_id: uuid.UUID | None = None) -> list[MaintenanceWindow]:
        """Every window by name, or those covering `rack_id` (for any operation)."""
        async with self.db.read() as conn:
            windows = await store.all_windows(conn)
            if rack_id is None:
                return windows
            rack = await self._rack(conn, rack_id)
        return [w for w in windows if w.covers(rack)]

    async def update(
        self, window_id: uuid.UUID, paths: Collection[str], given: WindowInput
    ) -> MaintenanceWindow:
        """Apply the masked fields. Tasks a freeze holds are let go, to be held again by what now applies
        (a shortened or deleted freeze must not keep them waiting), in the transaction; but a task whose row
        another transaction holds (a claim's, which may hold it again by the windows it read before the
        change committed) is not waited for there, where the change holds runs and racks: it is let go once
        the change committed (`windows.gate.let_go_of_freezes`), or, should the change not live to, by the
        executors' look again (`windows.gate.FreezeGate.look_again`). The tasks a
        DEFER firing deferred that the window covered or covers wait for the opening the windows now give
        them, or are released or ended, and those fired inside an ALLOW window are bound to the end it now
        has (`rackflow.tasks.deferrals`), in the same transaction. Window edits take turns
        (`store.windows.edits_in_turn`), so each decides from what the one before committed."""
        mask = check_mask(paths, UPDATE_PATHS)
        if NAME_PATH in mask:
            check_text(given.name, NAME_PATH, required=True)  # a new one is checked as on create, below
        if REASON_PATH in mask:
            check_description(given.reason, REASON_PATH)
        if KIND_PATH in mask and given.kind is None:
            raise InvalidArgument(f"{KIND_PATH}: a kind is required (ALLOW or FREEZE)")
        operations = None
        if OPERATIONS_PATH in mask:
            operations = distinct_operations(given.operations, OPERATIONS_PATH)
        async with self.db.transaction() as conn:
            now = await self._in_turn(conn)
            when = _check_when(given.when, now) if WHEN_PATH in mask else None
            current = await self._load(conn, window_id)
            updated = replace(current, updated_at=now)
            if NAME_PATH in mask:
                check_rename(given.name, NAME_PATH, current.name)
                if await store.name_taken(conn, given.name, other_than=window_id):
                    raise store.name_taken_error(given.name)
                updated = replace(updated, name=given.name)
            if REASON_PATH in mask:
                updated = replace(updated, reason=given.reason)
            if given.kind is not None and KIND_PATH in mask:
                updated = replace(updated, kind=given.kind)
            if when is not None:
                updated = replace(updated, when=when)
            if operations is not None:
                updated = replace(updated, operations=operations)
            if RACKS_PATH in mask:
                updated = replace(
                    updated, racks=await resolve_refs(conn, given.racks, RACKS_PATH, "rack", "racks")
                )
            if DOMAINS_PATH in mask:
                domains = await resolve_refs(conn, given.domains, DOMAINS_PATH, "NVLink domain", "domains")
                updated = replace(updated, domains=domains)
            if RACKS_PATH in mask or DOMAINS_PATH in mask:
                updated = replace(updated, all_racks=not updated.racks and not updated.domains)
            once_committed = await self.deferrals.redecide_in(
                conn, (current, updated), now, lambda: store.save_window(conn, updated), WINDOW_UPDATED
            )
            skipped = await task_runs.release_unclaimed(conn, FreezeGate.name)
        await self._once_committed(window_id, once_committed, skipped)
        return updated

    async def delete(self, window_id: uuid.UUID) -> None:
        """Delete the window; what it held or deferred is decided again, as `update` decides it."""
        async with self.db.transaction() as conn:
            now = await self._in_turn(conn)
            current = await self._load(conn, window_id)
            once_committed = await self.deferrals.redecide_in(
                conn, (current,), now, lambda: store.delete_window(conn, window_id), WINDOW_DELETED
            )
            skipped = await task_runs.release_unclaimed(conn, FreezeGate.name)
        await self._once_committed(window_id, once_committed, skipped)

    async def _once_committed(
        self, window_id: uuid.UUID, once_committed: Callable[[], Awaitable[None]], skipped: list[uuid.UUID]
    ) -> None:
        """What an edit or a deletion does once it committed: its tasks' decisions (which log what fails)
        and the freeze holds it skipped let go. The call succeeded, whatever fails here: a hold not let go
        is the executors' look again's (`FreezeGate.look_again`), not the caller's error."""
        await once_committed()
        try:
            await let_go_of_freezes(self.db, skipped, self.clock.now(), audit.CHANGE)
        except Exception:
            log.warning(
                "window %s changed, but letting go of the freeze holds of task(s) %s failed; they are left "
                "to the executors' look again",
                window_id,
                ", ".join(str(task_id) for task_id in skipped),
                exc_info=True,
            )

    async def preview(self, rack_id: uuid.UUID, after: datetime | None, count: int) -> list[WindowEvent]:
        """The next `count` openings and closings of the windows covering the rack, after `after` (now)."""
        count = preview_count(count)
        async with self.db.read() as conn:
            rack = await self._rack(conn, rack_id, "rack_id")
            windows = await store.all_windows(conn)
        return events(windows, rack, after or self.clock.now(), count)

    async def id_by_name(self, name: str, field: str = "name") -> uuid.UUID:
        """The id of the window called `name`; NotFound naming `field` otherwise."""
        check_text(name, field, required=True)
        async with self.db.read() as conn:
            found = await store.window_id_by_name(conn, name)
        if found is None:
            raise NotFound(f"{field}: no maintenance window named {name!r}")
        return found

    @staticmethod
    async def _rack(conn: AsyncConnection, rack_id: uuid.UUID, field: str = "rack_id") -> RackRef:
        found = await store.rack_refs(conn, [rack_id])
        if rack_id not in found:
            raise NotFound(f"{field}: no rack {rack_id}")
        return found[rack_id]
