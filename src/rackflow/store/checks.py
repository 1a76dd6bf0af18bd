"""Pre-flight check queries: the checks, the tasks their gate holds, and what each round of checks found.

The only pre-flight module that speaks SQL. Checks are few (tens), so readers load them all. Functions
take an open connection, so the caller decides what one transaction holds: the gate's reads run inside the
executor's claim, the checker's writes in short transactions of their own, never around a look outside.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Row,
    Select,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.checks import (
    AlertmanagerSettings,
    CheckKind,
    CheckResult,
    OnRack,
    PreflightCheck,
    RackFacts,
    RackIdleSettings,
    Settings,
    Waiting,
    WebhookSettings,
)
from rackflow.domain.tasks import Hold, InLine, OperationKind, Task, TaskStatus
from rackflow.errors import AlreadyExists
from rackflow.store.db import Database, after_commit, chunked, in_id_order, unique_violation_as
from rackflow.store.dialect import in_keys, insert_rows_together, update_rows, walking_in_order
from rackflow.store.inventory import names_by_id
from rackflow.store.tables import (
    nvl_domains,
    preflight_checks,
    preflight_overrides,
    preflight_results,
    preflight_tasks,
    racks,
    tasks,
)
from rackflow.store.task_partitions import filed_at, in_live_weeks, live_weeks
from rackflow.store.tasks import OLDEST_FIRST, TASK_COLUMNS, hold_values, is_active, status_in, task_from_row

# What the writes that make a held task's round due now ask to be told after commit (`Database.on_commit`):
# the checker of this process looks at once (it sleeps while no round is due: `next_round_at`).
ROUND_DUE = "preflight_round_due"


def name_taken_error(name: str) -> AlreadyExists:
    return AlreadyExists("check.name", name, "a pre-flight check named")


# --- the checks ---------------------------------------------------------------------------------


def _settings_values(settings: Settings) -> dict[str, Any]:
    if isinstance(settings, AlertmanagerSettings):
        return {"url": settings.url, "matchers": list(settings.matchers), "fail_closed": settings.fail_closed}
    if isinstance(settings, WebhookSettings):
        return {"url": settings.url, "secret": settings.secret, "timeout": settings.timeout}
    return {
        "busy_operations": sorted(op.value for op in settings.busy_operations),
        "failed_within": settings.failed_within,
    }


def _settings_from(kind: CheckKind, values: dict[str, Any]) -> Settings:
    if kind is CheckKind.ALERTMANAGER:
        return AlertmanagerSettings(values["url"], tuple(values["matchers"]), values["fail_closed"])
    if kind is CheckKind.WEBHOOK:
        return WebhookSettings(values["url"], values["secret"], values["timeout"])
    busy = frozenset(OperationKind(op) for op in values["busy_operations"])
    return RackIdleSettings(busy, values["failed_within"])


def _values(check: PreflightCheck) -> dict[str, Any]:
    return {
        "name": check.name,
        "kind": check.kind.value,
        "operations": sorted(op.value for op in check.operations),
        "all_racks": check.all_racks,
        "rack_ids": [str(i) for i, _ in check.racks],
        "domain_ids": [str(i) for i, _ in check.domains],
        "settings": _settings_values(check.settings),
        "interval": check.interval,
        "max_wait": check.max_wait,
        "created_at": check.created_at,
        "updated_at": check.updated_at,
    }


async def _checks_where(conn: AsyncConnection, *conditions: Any) -> list[PreflightCheck]:
    rows = (
        await conn.execute(select(preflight_checks).where(*conditions).order_by(preflight_checks.c.name))
    ).all()
    if not rows:
        return []
    rack_ids = {uuid.UUID(i) for row in rows for i in row.rack_ids}
    domain_ids = {uuid.UUID(i) for row in rows for i in row.domain_ids}
    rack_names = await names_by_id(conn, racks, rack_ids) if rack_ids else {}
    domain_names = await names_by_id(conn, nvl_domains, domain_ids) if domain_ids else {}

    def named(ids: list[str], names: dict[uuid.UUID, str]) -> tuple[tuple[uuid.UUID, str], ...]:
        # A rack or domain deleted since is left out (and the check covers nothing there).
        found = [(uuid.UUID(i), names[uuid.UUID(i)]) for i in ids if uuid.UUID(i) in names]
        return tuple(sorted(found, key=lambda pair: pair[1]))

    return [
        PreflightCheck(
            id=row.id,
            name=row.name,
            operations=frozenset(OperationKind(op) for op in row.operations),
            all_racks=row.all_racks,
            racks=named(row.rack_ids, rack_names),
            domains=named(row.domain_ids, domain_names),
            settings=_settings_from(CheckKind(row.kind), row.settings),
            interval=row.interval,
            max_wait=row.max_wait,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )
        for row in rows
    ]


async def all_checks(conn: AsyncConnection) -> list[PreflightCheck]:
    """Every check, by name."""
    return await _checks_where(conn)


async def get_check(conn: AsyncConnection, check_id: uuid.UUID) -> PreflightCheck | None:
    found = await _checks_where(conn, preflight_checks.c.id == check_id)
    return found[0] if found else None


async def check_id_by_name(conn: AsyncConnection, name: str) -> uuid.UUID | None:
    stmt = select(preflight_checks.c.id).where(preflight_checks.c.name == name)
    return (await conn.execute(stmt)).scalar_one_or_none()


async def insert_check(conn: AsyncConnection, check: PreflightCheck) -> None:
    with unique_violation_as(name_taken_error(check.name)):
        await conn.execute(insert(preflight_checks).values(id=check.id, **_values(check)))


async def save_check(conn: AsyncConnection, check: PreflightCheck) -> None:
    """Write every field of an existing check."""
    with unique_violation_as(name_taken_error(check.name)):
        await conn.execute(
            update(preflight_checks).where(preflight_checks.c.id == check.id).values(_values(check))
        )


async def delete_check(conn: AsyncConnection, check_id: uuid.UUID) -> bool:
    result = await conn.execute(delete(preflight_checks).where(preflight_checks.c.id == check_id))
    return bool(result.rowcount)


async def rack_facts(conn: AsyncConnection, rack_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, RackFacts]:
    """Name, external id and NVLink domain of each rack that exists among `rack_ids`."""
    found: dict[uuid.UUID, RackFacts] = {}
    for chunk in chunked(set(rack_ids)):
        stmt = (
            select(
                racks.c.id,
                racks.c.name,
                racks.c.external_id,
                racks.c.nvl_domain_id,
                nvl_domains.c.name.label("domain"),
            )
            .outerjoin(nvl_domains, nvl_domains.c.id == racks.c.nvl_domain_id)
            .where(racks.c.id.in_(chunk))
        )
        for row in await conn.execute(stmt):
            found[row.id] = RackFacts(
                row.id, row.name, row.external_id or "", row.nvl_domain_id, row.domain or ""
            )
    return found


# --- the tasks the gate holds -------------------------------------------------------------------


async def start_waiting(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> None:
    """Tasks the gate holds for the first time: their first round of checks is due at once. Called in the
    claim, which holds the tasks' rows, so no other claim adds the same row meanwhile."""
    if task_ids:
        await conn.execute(
            insert(preflight_tasks),
            [
                {"task_id": i, "task_filed_at": filed_at(i), "attempt": 0, "next_check_at": None}
                for i in task_ids
            ],
        )
        after_commit(conn, ROUND_DUE)


async def check_again(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> None:
    """The tasks' last round is stale (they were claimed too late to start on it): the next is due now."""
    for chunk in chunked(set(task_ids)):
        await conn.execute(
            update(preflight_tasks).where(preflight_tasks.c.task_id.in_(chunk)).values(next_check_at=None)
        )
    if task_ids:
        after_commit(conn, ROUND_DUE)


async def check_all_again(conn: AsyncConnection) -> None:
    """Every held task's next round is due now (a check changed or went away)."""
    await conn.execute(
        update(preflight_tasks).where(preflight_tasks.c.overridden_at.is_(None)).values(next_check_at=None)
    )
    after_commit(conn, ROUND_DUE)


# A waiting row's columns beside its task's `id`, as `_waiting_from` reads them (its round labelled: a task
# row holds an `attempt` of its own, its retry attempt).
_WAITING_COLUMNS = (
    preflight_tasks.c.attempt.label("round"),
    preflight_tasks.c.next_check_at,
    preflight_tasks.c.override_reason,
    preflight_tasks.c.checking_until,
)


def _waiting_from(row: Row[*tuple[Any, ...]]) -> Waiting:
    return Waiting(row.id, row.round, row.next_check_at, row.override_reason, row.checking_until)


@dataclass(frozen=True)
class GateRead:
    """What the pre-flight gate reads about the tasks a claim took, in one statement (`gate_read`): each
    waiting task's row and its last round's results, which of them an operator overrode some checks for,
    and what runs on their racks."""

    waiting: dict[uuid.UUID, Waiting]
    results: dict[uuid.UUID, list[CheckResult]]
    with_overrides: set[uuid.UUID]
    running: dict[uuid.UUID, list[OnRack]]


def _gate_read_statement(busy: bool) -> Select[Any]:
    """`gate_read`'s statement, with or without the racks' busy tasks; the tasks and operations bound
    (expanding). Built once: building it (aliases, joins) cost a claim more than running it."""
    claimed = tasks.alias("claimed")
    other = tasks.alias("other")
    overrides = exists().where(preflight_overrides.c.task_id == claimed.c.id)
    joined = claimed.outerjoin(preflight_tasks, preflight_tasks.c.task_id == claimed.c.id).outerjoin(
        preflight_results,
        and_(
            preflight_results.c.task_id == preflight_tasks.c.task_id,
            preflight_results.c.attempt == preflight_tasks.c.attempt,
        ),
    )
    columns: list[Any] = [
        claimed.c.id,
        preflight_tasks.c.task_id.label("waiting"),
        *_WAITING_COLUMNS,
        overrides.label("overrides"),
        *(column.label(f"result_{column.name}") for column in preflight_results.c),
    ]
    if busy:
        joined = joined.outerjoin(
            other,
            and_(
                other.c.rack_id == claimed.c.rack_id,
                is_active(other.c.status),
                status_in(other.c.status, TaskStatus.RUNNING),
                other.c.operation.in_(bindparam("operations", expanding=True, type_=other.c.operation.type)),
            ),
        )
        columns += [claimed.c.rack_id, other.c.id.label("other_id"), other.c.operation.label("other_op")]
    task_ids = bindparam("task_ids", expanding=True, type_=claimed.c.id.type)
    return select(*columns).select_from(joined).where(claimed.c.id.in_(task_ids))


_GATE_READS = {busy: _gate_read_statement(busy) for busy in (False, True)}


async def gate_read(
    conn: AsyncConnection, task_ids: Collection[uuid.UUID], busy_operations: Collection[OperationKind]
) -> GateRead:
    """For the tasks `task_ids`: the waiting row of those the gate has held (`Waiting`) and the results of
    each one's last round (its `attempt`), which of them an operator overrode checks for alone
    (`overridden_checks` reads which), and the tasks of `busy_operations` RUNNING on their racks
    (`running_on`; in a claim, its own claimed tasks too), by rack, and which of their runs are rollouts.
    One statement a chunk of tasks: their rows joined to their waiting row, its results, their runs and
    their racks' busy tasks, because the claim's journal waits for every round trip of its gates
    (docs/PERFORMANCE.md, issue 26)."""
    read = GateRead({}, {}, set(), {})
    results: dict[uuid.UUID, dict[tuple[uuid.UUID, int], CheckResult]] = {}
    running: dict[uuid.UUID, dict[uuid.UUID, OnRack]] = {}
    stmt = _GATE_READS[bool(busy_operations)]
    operations = {"operations": sorted(op.value for op in busy_operations)} if busy_operations else {}
    for chunk in chunked(set(task_ids)):
        for row in await conn.execute(stmt, {"task_ids": chunk, **operations}):
            if row.waiting is not None:
                read.waiting[row.id] = _waiting_from(row)
            if row.overrides:
                read.with_overrides.add(row.id)
            if row.result_check_id is not None:
                results.setdefault(row.id, {})[(row.result_check_id, row.result_attempt)] = CheckResult(
                    task_id=row.id,
                    check_id=row.result_check_id,
                    check_name=row.result_check_name,
                    attempt=row.result_attempt,
                    passed=row.result_passed,
                    reason=row.result_reason,
                    checked_at=row.result_checked_at,
                    recheck_at=row.result_recheck_at,
                )
            if busy_operations:
                on_rack = running.setdefault(row.rack_id, {})
                if row.other_id is not None:
                    on_rack[row.other_id] = OnRack(row.other_id, OperationKind(row.other_op))
    read.results.update(
        (task_id, sorted(found.values(), key=lambda r: r.check_name)) for task_id, found in results.items()
    )
    read.running.update((rack_id, list(found.values())) for rack_id, found in running.items() if found)
    return read


def _waiting_for_rounds(gate: str) -> tuple[ColumnElement[bool], ...]:
    """A task `gate` holds for its rounds of checks (joined to its waiting row), not overridden."""
    return (
        is_active(tasks.c.status),
        status_in(tasks.c.status, TaskStatus.PENDING),
        tasks.c.held_by == gate,
        preflight_tasks.c.overridden_at.is_(None),
    )


async def due(conn: AsyncConnection, gate: str, *, now: datetime, limit: int) -> list[tuple[Task, Waiting]]:
    """Tasks `gate` holds whose next round of checks is due and that no checker is checking (or whose
    checker's lease ran out), not overridden, oldest first."""
    weeks = await live_weeks(conn)
    stmt = (
        select(*TASK_COLUMNS, *_WAITING_COLUMNS)
        .join(preflight_tasks, preflight_tasks.c.task_id == tasks.c.id)
        .where(
            *_waiting_for_rounds(gate),
            or_(preflight_tasks.c.next_check_at.is_(None), preflight_tasks.c.next_check_at <= now),
            or_(preflight_tasks.c.checking_until.is_(None), preflight_tasks.c.checking_until <= now),
            *_in_live_weeks(weeks),
        )
        .order_by(tasks.c.created_at)
        .limit(limit)
    )
    return [
        (
            task_from_row(row),
            _waiting_from(row),
        )
        for row in await conn.execute(stmt, weeks)
    ]


def _in_live_weeks(weeks: dict[str, datetime]) -> tuple[ColumnElement[bool], ...]:
    """A held task and its waiting row in the partitions that can hold a live task (PostgreSQL)."""
    return in_live_weeks(weeks, tasks.c.filed_at, preflight_tasks.c.task_filed_at)


async def next_round_at(conn: AsyncConnection, gate: str, *, now: datetime) -> datetime | None:
    """When the first round `due` would find comes due (`now` or earlier: due already), or None when
    `gate` holds no task (not overridden) at all: how long the checker may sleep. A round is due once its
    time has come and the lease of a checker checking it (if any) has run out."""
    at_type = preflight_tasks.c.next_check_at.type
    next_check = func.coalesce(preflight_tasks.c.next_check_at, literal(now, at_type))
    lease_end = func.coalesce(preflight_tasks.c.checking_until, literal(now, at_type))
    weeks = await live_weeks(conn)
    stmt = (
        select(func.min(case((lease_end > next_check, lease_end), else_=next_check), type_=at_type))
        .join(tasks, preflight_tasks.c.task_id == tasks.c.id)
        .where(*_waiting_for_rounds(gate), *_in_live_weeks(weeks))
    )
    at: datetime | None = (await conn.execute(stmt, weeks)).scalar()
    return at


def _queue_head_statement() -> Select[Any]:
    """`queue_head`'s statement, the gate, now and the limit bound. Built once: a look ahead runs at most
    every NUDGE_GAP while tasks end, and building it each time was the event loop's work (issue 26)."""
    return (
        select(
            tasks.c.id,
            tasks.c.rack_id,
            tasks.c.operation,
            tasks.c.ignore_windows,
            preflight_tasks.c.task_id.is_not(None).label("asked"),
        )
        .outerjoin(preflight_tasks, preflight_tasks.c.task_id == tasks.c.id)
        .where(
            is_active(tasks.c.status),
            status_in(tasks.c.status, TaskStatus.PENDING),
            or_(
                tasks.c.not_before.is_(None),
                tasks.c.not_before <= bindparam("now"),
                and_(
                    tasks.c.held_by == bindparam("gate"),
                    preflight_tasks.c.attempt == 0,
                    preflight_tasks.c.overridden_at.is_(None),
                ),
            ),
        )
        .order_by(*OLDEST_FIRST)
        .limit(bindparam("limit"))
    )


_QUEUE_HEAD = _queue_head_statement()


async def queue_head(
    conn: AsyncConnection, gate: str, *, now: datetime, limit: int
) -> list[tuple[InLine, bool]]:
    """The next `limit` tasks the executors' claims will take, in their order (oldest first), and whether
    `gate` has asked about each yet: the PENDING tasks nothing holds past `now`, and those `gate` holds for
    a first round of checks not yet answered (they are claimed as soon as it passes). A look ahead
    (`rackflow.checks.checker`) asks about the unasked ones among them before an executor has room, and
    reads those whole; the others are read only for what the gates' looks count (`InLine`)."""
    async with walking_in_order(conn):  # the live queue in its order, as the claim walks it
        rows = await conn.execute(_QUEUE_HEAD, {"gate": gate, "now": now, "limit": limit})
    return [
        (InLine(row.id, row.rack_id, OperationKind(row.operation), row.ignore_windows), bool(row.asked))
        for row in rows
    ]


async def ask_ahead(
    db: Database,
    conn: AsyncConnection,
    gate: str,
    asks: Mapping[uuid.UUID, tuple[Hold, datetime]],
    *,
    now: datetime,
) -> set[uuid.UUID]:
    """Take the first round of tasks no claim has taken yet (task id -> the hold while it is asked, and the
    round's lease): those still PENDING, due at `now` and never held by `gate` (no row of theirs), whose rows
    no claim holds (skipped, not waited for) become held by `gate` as a claim's gate holds them, with their
    first round taken, as the checker takes one (`take_rounds`). The tasks taken.

    The rows are locked first and the conditions read under the lock, so a claim that takes one of these
    tasks meanwhile either went first (the task is RUNNING, or held with its row: not taken here) or finds
    it held (not due): the task is never started and asked at once."""
    locked: set[uuid.UUID] = set()
    asked = exists().where(preflight_tasks.c.task_id == tasks.c.id)
    for chunk in chunked(sorted(asks)):
        stmt = (
            select(tasks.c.id)
            .where(
                tasks.c.id.in_(chunk),
                status_in(tasks.c.status, TaskStatus.PENDING),
                or_(tasks.c.not_before.is_(None), tasks.c.not_before <= now),
                ~asked,
            )
            .order_by(tasks.c.id)
        )
        locked.update(row.id for row in await conn.execute(db.skip_locked(stmt)))
    if not locked:
        return locked
    taken = sorted(locked)
    await conn.execute(
        insert(preflight_tasks),
        [
            {
                "task_id": i,
                "task_filed_at": filed_at(i),
                "attempt": 0,
                "next_check_at": None,
                "checking_until": asks[i][1],
            }
            for i in taken
        ],
    )
    # One statement per distinct hold (the tasks asked together mostly share it), as a claim holds them.
    by_hold: dict[Hold, list[uuid.UUID]] = defaultdict(list)
    for task_id in taken:
        by_hold[asks[task_id][0]].append(task_id)
    for hold, task_ids in by_hold.items():
        for chunk in chunked(task_ids):
            await conn.execute(
                update(tasks).where(tasks.c.id.in_(chunk)).values(hold_values(gate, hold, now))
            )
    return locked


def _still_held(gate: str, task_ids: Collection[uuid.UUID]) -> Any:
    return and_(
        tasks.c.id.in_(task_ids), status_in(tasks.c.status, TaskStatus.PENDING), tasks.c.held_by == gate
    )


async def _lock_held(
    db: Database, conn: AsyncConnection, gate: str, task_ids: Collection[uuid.UUID]
) -> set[uuid.UUID]:
    """Lock the rows of the tasks `gate` still holds (PENDING) among `task_ids`, in id order (one statement
    a chunk): the others started (or ended) meanwhile.

    The fence between a claim and the checker. A claim locks the rows of the tasks it takes before its gate
    reads their last round, and a checker takes and records a round only under this lock, so the two
    happen one after the other: a claim that started a task on its last round commits before any later
    round of that task is taken or written (the checker then finds it RUNNING, and asks nothing), and a
    round taken first is seen by the claim as under way (`Waiting.under_way`), which holds the task."""
    locked: set[uuid.UUID] = set()
    for chunk in chunked(in_id_order(task_ids)):
        stmt = select(tasks.c.id).where(_still_held(gate, chunk)).order_by(tasks.c.id)
        locked.update(row.id for row in await conn.execute(db.for_update(stmt)))
    return locked


async def take_rounds(
    db: Database,
    conn: AsyncConnection,
    gate: str,
    rounds: Sequence[tuple[Waiting, datetime]],
    *,
    now: datetime,
) -> set[uuid.UUID]:
    """Take each task's next round (its `Waiting` as read, and the lease's end): the tasks whose round was
    taken, of those still waiting for `gate`, with no other checker's lease, the same round still due; not
    one that started meanwhile or whose round another instance's checker took first. A few statements
    for all the rounds (`_rounds_of_locked`)."""
    locked = await _lock_held(db, conn, gate, [task.task_id for task, _ in rounds])
    found = await _rounds_of_locked(conn, locked)
    taken = {
        task.task_id: until
        for task, until in rounds
        if (row := found.get(task.task_id)) is not None
        and row.attempt == task.attempt
        and (row.checking_until is None or row.checking_until <= now)
    }
    if taken:
        leases = [{"task_id": i, "checking_until": until} for i, until in taken.items()]
        await conn.execute(*update_rows(conn.dialect.name, preflight_tasks, "task_id", leases))
    return set(taken)


async def _rounds_of_locked(
    conn: AsyncConnection, task_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, Waiting]:
    """The waiting rows of tasks whose rows `_lock_held` locked, but those an operator overrode: read under
    that lock, which every writer of a task's round holds (a claim, a checker, an override), so what is read
    stays so until commit, and the rounds it decides on are written with one UPDATE (`update_rows`) instead
    of a conditional one per task (issue 26: the checker's per-task statements took the executor's
    connection time and the event loop's turns)."""
    found: dict[uuid.UUID, Waiting] = {}
    for chunk in chunked(sorted(task_ids)):
        stmt: Select[Any] = select(preflight_tasks.c.task_id.label("id"), *_WAITING_COLUMNS).where(
            preflight_tasks.c.task_id.in_(chunk), preflight_tasks.c.overridden_at.is_(None)
        )
        for row in await conn.execute(stmt):
            found[row.id] = _waiting_from(row)
    return found


@dataclass(frozen=True)
class Round:
    """A round the checker asked, to record: task, round number, results, when the next is due."""

    task_id: uuid.UUID
    attempt: int
    found: Sequence[CheckResult]
    next_check_at: datetime
    leased_until: datetime  # the lease the checker took on it: a round taken over since has another


async def record_rounds(
    db: Database, conn: AsyncConnection, gate: str, rounds: Sequence[Round]
) -> set[uuid.UUID]:
    """Store each round's results and end its lease: the tasks whose round was recorded. Nothing is written
    for a round that was not ours any more: its task no longer waits for `gate` (it started, or ended), its
    checks were overridden, or our lease ran out and another checker took the round over."""
    locked = await _lock_held(db, conn, gate, [r.task_id for r in rounds])
    found = await _rounds_of_locked(conn, locked)
    ours = [
        each
        for each in rounds
        if (row := found.get(each.task_id)) is not None
        and row.attempt == each.attempt - 1
        and row.checking_until == each.leased_until
    ]
    if ours:
        moved = [{"task_id": r.task_id, "attempt": r.attempt, "next_check_at": r.next_check_at} for r in ours]
        update, values = update_rows(
            conn.dialect.name, preflight_tasks, "task_id", moved, {"checking_until": None}
        )
        await conn.execute(update, values)
        if results := [_result_values(r) for each in ours for r in each.found]:
            await conn.execute(insert(preflight_results), results)
    return {each.task_id for each in ours}


async def record_rounds_in_claim(
    conn: AsyncConnection, rounds: Sequence[tuple[Waiting | None, Sequence[CheckResult]]]
) -> None:
    """Store rounds the claim's gate asked itself (checks that only read the database), each after the
    task's last (`Waiting`, None when the gate never held it: its row is added). Called in the claim,
    which holds the tasks' rows locked and saw no round under way, so no checker takes or records a round
    of these tasks meanwhile; the next round, if the task stays held, is due at its first result's
    `recheck_at`. The new rows and the results go in one statement on PostgreSQL
    (`insert_rows_together`): the claim's journal waits for each round trip."""
    for last, found in rounds:
        if last is None:
            continue
        done = await conn.execute(
            update(preflight_tasks)
            .where(preflight_tasks.c.task_id == last.task_id, preflight_tasks.c.attempt == last.attempt)
            .values(attempt=last.attempt + 1, next_check_at=_next(found), checking_until=None)
        )
        if not done.rowcount:  # the fence: never write over a round this claim did not see
            raise RuntimeError(f"task {last.task_id}: its pre-flight round moved under the claim's lock")
    new = [
        {
            "task_id": found[0].task_id,
            "task_filed_at": filed_at(found[0].task_id),
            "attempt": 1,
            "next_check_at": _next(found),
        }
        for last, found in rounds
        if last is None
    ]
    results = [_result_values(r) for _, found in rounds for r in found]
    await insert_rows_together(conn, [(preflight_tasks, new), (preflight_results, results)])


def _next(found: Sequence[CheckResult]) -> datetime:
    return min(r.recheck_at for r in found)


def _result_values(result: CheckResult) -> dict[str, Any]:
    return {
        "task_id": result.task_id,
        "task_filed_at": filed_at(result.task_id),
        "check_id": result.check_id,
        "attempt": result.attempt,
        "check_name": result.check_name,
        "passed": result.passed,
        "reason": result.reason,
        "checked_at": result.checked_at,
        "recheck_at": result.recheck_at,
    }


async def latest_rounds(
    conn: AsyncConnection, task_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, list[CheckResult]]:
    """Each task's results of its last round of checks (its waiting row's `attempt`, the round count), by
    check name: what a task's view lists (`Task.checks`). Rounds before it are kept too, and not read."""
    found: dict[uuid.UUID, list[CheckResult]] = {}
    results = preflight_results.c
    for chunk in chunked(list(task_ids)):
        stmt = (
            select(preflight_results)
            .join(
                preflight_tasks,
                and_(
                    preflight_tasks.c.task_id == results.task_id, preflight_tasks.c.attempt == results.attempt
                ),
            )
            .where(in_keys(conn.dialect.name, results.task_id, chunk))
            .order_by(results.task_id, results.check_name)
        )
        for row in await conn.execute(stmt):
            found.setdefault(row.task_id, []).append(
                CheckResult(
                    task_id=row.task_id,
                    check_id=row.check_id,
                    check_name=row.check_name,
                    attempt=row.attempt,
                    passed=row.passed,
                    reason=row.reason,
                    checked_at=row.checked_at,
                    recheck_at=row.recheck_at,
                )
            )
    return found


async def release(
    conn: AsyncConnection, gate: str, task_ids: Collection[uuid.UUID], reason: str, *, now: datetime
) -> None:
    """The tasks may be claimed at once (their checks passed, or were overridden); still held by `gate`,
    which lets them start at the claim."""
    for chunk in chunked(in_id_order(task_ids)):
        await conn.execute(
            update(tasks)
            .where(_still_held(gate, chunk))
            .values(not_before=None, held_reason=reason, message=reason, updated_at=now)
        )


async def hold_until(
    conn: AsyncConnection, gate: str, task_id: uuid.UUID, hold: Hold, *, now: datetime
) -> None:
    """A round failed: the task waits for `hold` (its reason the failing check's)."""
    await conn.execute(update(tasks).where(_still_held(gate, [task_id])).values(hold_values(gate, hold, now)))


async def override(
    db: Database, conn: AsyncConnection, task_id: uuid.UUID, reason: str, *, now: datetime
) -> None:
    """An operator let the task start whatever its checks say. The task's row is locked first, as the
    checker locks it before its round's row, so the two never wait on each other in a circle."""
    await conn.execute(db.for_update(select(tasks.c.id).where(tasks.c.id == task_id)))
    values = {"override_reason": reason, "overridden_at": now, "checking_until": None}
    found = await conn.execute(
        update(preflight_tasks).where(preflight_tasks.c.task_id == task_id).values(values)
    )
    if not found.rowcount:
        await conn.execute(
            insert(preflight_tasks).values(
                task_id=task_id, task_filed_at=filed_at(task_id), attempt=0, **values
            )
        )


async def override_checks(
    db: Database,
    conn: AsyncConnection,
    task_id: uuid.UUID,
    check_ids: Collection[uuid.UUID],
    reason: str,
    *,
    now: datetime,
) -> None:
    """An operator let the task start whatever these checks say (the others still count). The task waits
    for a round of the rest at once (its row added if the gate has not held it yet, so the gate reads the
    overrides of the tasks it has rows for only); the task's row is locked first, as `override` does."""
    await conn.execute(db.for_update(select(tasks.c.id).where(tasks.c.id == task_id)))
    filed = filed_at(task_id)
    rows = [
        {"task_id": task_id, "task_filed_at": filed, "check_id": i, "reason": reason, "overridden_at": now}
        for i in check_ids
    ]
    await conn.execute(db.insert_new(preflight_overrides), rows)
    found = await conn.execute(
        update(preflight_tasks).where(preflight_tasks.c.task_id == task_id).values(next_check_at=None)
    )
    if not found.rowcount:
        await conn.execute(
            db.insert_new(preflight_tasks).values(task_id=task_id, task_filed_at=filed, attempt=0)
        )


async def forget_overrides(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> None:
    """Tasks sent back for another attempt: an operator's override (of all their checks, or of some) let the
    attempt that ran start, and is not one for the next, whose checks are asked anew (SAFETY.md, "Retries").
    It let every later attempt start unchecked, though a failed attempt may leave the rack alerting. An
    override during the back-off is for the next attempt: it comes after this, in the same task's row."""
    for chunk in chunked(set(task_ids)):
        await conn.execute(
            update(preflight_tasks)
            .where(preflight_tasks.c.task_id.in_(chunk), preflight_tasks.c.overridden_at.is_not(None))
            .values(override_reason=None, overridden_at=None)
        )
        await conn.execute(delete(preflight_overrides).where(preflight_overrides.c.task_id.in_(chunk)))


async def overridden_checks(
    conn: AsyncConnection, task_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, frozenset[uuid.UUID]]:
    """The checks an operator overrode for each of these tasks (only tasks with some)."""
    found: dict[uuid.UUID, set[uuid.UUID]] = {}
    for chunk in chunked(set(task_ids)):
        stmt = select(preflight_overrides.c.task_id, preflight_overrides.c.check_id).where(
            preflight_overrides.c.task_id.in_(chunk)
        )
        for row in await conn.execute(stmt):
            found.setdefault(row.task_id, set()).add(row.check_id)
    return {task_id: frozenset(ids) for task_id, ids in found.items()}


# --- what rack_idle asks ------------------------------------------------------------------------


async def running_on(
    conn: AsyncConnection, rack_ids: Collection[uuid.UUID], operations: Collection[OperationKind]
) -> dict[uuid.UUID, list[OnRack]]:
    """The tasks of `operations` RUNNING on each of these racks (in a claim: its own claimed tasks too),
    by rack."""
    found: dict[uuid.UUID, list[OnRack]] = {}
    if not operations:
        return found
    for chunk in chunked(set(rack_ids)):
        stmt = select(tasks.c.id, tasks.c.rack_id, tasks.c.operation).where(
            tasks.c.rack_id.in_(chunk),
            is_active(tasks.c.status),
            status_in(tasks.c.status, TaskStatus.RUNNING),
            tasks.c.operation.in_(sorted(op.value for op in operations)),
        )
        for row in await conn.execute(stmt):
            found.setdefault(row.rack_id, []).append(OnRack(row.id, OperationKind(row.operation)))
    return found


async def last_finished_of(
    conn: AsyncConnection,
    wanted: Collection[tuple[uuid.UUID, OperationKind]],
    *,
    besides: Collection[uuid.UUID],
) -> dict[tuple[uuid.UUID, OperationKind], Task]:
    """For each (rack, operation) of `wanted`, the rack's most recently finished task of that operation
    but those `besides`, if any: one query per chunk of racks (`last_finished` for many)."""
    found: dict[tuple[uuid.UUID, OperationKind], Task] = {}
    for chunk in chunked(sorted(set(wanted))):
        latest = (
            select(
                *TASK_COLUMNS,
                func.row_number()
                .over(partition_by=(tasks.c.rack_id, tasks.c.operation), order_by=tasks.c.finished_at.desc())
                .label("latest"),
            )
            .where(
                tasks.c.rack_id.in_({rack for rack, _ in chunk}),
                tasks.c.operation.in_(sorted({op.value for _, op in chunk})),
                tasks.c.finished_at.is_not(None),
                tasks.c.id.not_in(list(besides)),
            )
            .subquery()
        )
        stmt = select(*(latest.c[column.name] for column in TASK_COLUMNS)).where(latest.c.latest == 1)
        for row in await conn.execute(stmt):
            task = task_from_row(row)
            if (task.rack_id, task.operation.kind) in wanted:
                found[(task.rack_id, task.operation.kind)] = task
    return found


async def last_finished(
    conn: AsyncConnection, rack_id: uuid.UUID, operation: OperationKind, *, besides: uuid.UUID
) -> Task | None:
    """The rack's most recently finished other task of `operation`."""
    stmt = (
        select(*TASK_COLUMNS)
        .where(
            tasks.c.rack_id == rack_id,
            tasks.c.operation == operation.value,
            tasks.c.finished_at.is_not(None),
            tasks.c.id != besides,
        )
        .order_by(tasks.c.finished_at.desc())
        .limit(1)
    )
    row = (await conn.execute(stmt)).first()
    return task_from_row(row) if row is not None else None
