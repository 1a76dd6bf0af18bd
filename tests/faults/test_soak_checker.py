"""The chaos soak's safe-operations checker (bench/soak_safety.py) reports each broken promise: a database
state that keeps every promise passes, and the same state broken in one way (a task of a run awaiting
approval, a firing a microsecond past its deadline, an attempt past the max, …) is reported by the check
that guards it, and only by it. The soak itself cannot show that a check can fail: rackflow keeps them."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from sqlalchemy.engine import make_url

from tests.conftest import postgres_admin_url
from tests.e2e.cluster import fresh_postgres_database

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import soak_safety

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 12, 3, 3, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)
RETRY_2 = {"max_attempts": 2, "initial_backoff_seconds": 1, "multiplier": 2, "max_backoff_seconds": 3}


@dataclass
class Verdict:
    """What the checker added: each check's value, and the checks it found broken."""

    values: dict[str, str] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)

    def add(self, check: str, value: object, ok: bool = True, note: str = "") -> None:
        self.values[check] = str(value)
        if not ok:
            self.broken.add(check)


@pytest.fixture(scope="module")
def database(pg_template: str) -> Iterator[str]:
    with fresh_postgres_database(postgres_admin_url(), template=pg_template) as url:
        yield make_url(url).set(drivername="postgresql").render_as_string(False)


@dataclass
class State:
    """One database transaction (rolled back after the test) and the ids of the good state's rows."""

    conn: psycopg.Connection[Any]
    rack: uuid.UUID = field(default_factory=uuid.uuid4)
    ids: dict[str, uuid.UUID] = field(default_factory=dict)

    def sql(self, statement: str, *params: object) -> None:
        self.conn.execute(statement, params)  # type: ignore[arg-type]

    def schedule(self, name: str, *, approval: bool = False, deadline_us: int | None = None) -> uuid.UUID:
        self.ids[name] = uuid.uuid4()
        self.sql(
            "INSERT INTO task_schedule (id, name, spec_type, spec, operation_template, created_at,"
            " updated_at, approval, last_edited_by, start_deadline_us)"
            " VALUES (%s, %s, 'interval', '30s', '{}', %s, %s, %s, 'carol', %s)",
            self.ids[name],
            name,
            T0,
            T0,
            Jsonb({"timeout_seconds": 60, "min_approvers": 2}) if approval else None,
            deadline_us,
        )
        return self.ids[name]

    def run(
        self,
        name: str,
        schedule: str,
        state: str,
        *,
        slot: datetime = T0,
        fired: datetime = T0,
        approvers: tuple[tuple[str, datetime], ...] | None = None,
    ) -> uuid.UUID:
        self.ids[name] = uuid.uuid4()
        approval = None
        if approvers is not None:
            approval = {
                "expires_at": (T0 + timedelta(minutes=1)).isoformat(),
                "min_approvers": 2,
                "approvers": [{"principal": p, "at": at.isoformat(), "comment": ""} for p, at in approvers],
                "rejected_by": "",
                "comment": "",
                "decided_at": max((at for _, at in approvers), default=T0).isoformat()
                if len(approvers) >= 2
                else None,
            }
        self.sql(
            "INSERT INTO task_schedule_run (id, schedule_id, fired_at, scheduled_for, trigger, state,"
            " outcomes, approval) VALUES (%s, %s, %s, %s, 'dispatch', %s, '[]', %s)",
            self.ids[name],
            self.ids[schedule],
            fired,
            slot,
            state,
            Jsonb(approval),
        )
        return self.ids[name]

    def task(
        self,
        name: str,
        *,
        run: str | None = None,
        status: str = "completed",
        attempt: int = 1,
        retry: dict[str, float] | None = None,
        created: datetime = T0,
        attempts: tuple[tuple[str, bool], ...] = (),
    ) -> uuid.UUID:
        """A task and its recorded attempts ((status, retryable), numbered from 1)."""
        self.ids[name] = uuid.uuid4()
        self.sql(
            "INSERT INTO tasks (id, operation, parameters, rack_id, component_ids, status, created_at,"
            " updated_at, run_id, retry, attempt, attempt_started_at) VALUES (%s, 'power_on', '{}', %s, '[]',"
            " %s, %s, %s, %s, %s, %s, %s)",
            self.ids[name],
            self.rack,
            status,
            created,
            created,
            self.ids[run] if run else None,
            Jsonb(retry) if retry else None,
            attempt,
            created,
        )
        for number, (ended, retryable) in enumerate(attempts, 1):
            self.attempt(name, number, ended, retryable)
        return self.ids[name]

    def attempt(self, task: str, number: int, status: str, retryable: bool) -> None:
        self.sql(
            "INSERT INTO task_attempt (task_id, attempt, started_at, finished_at, status, retryable)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            self.ids[task],
            number,
            T0,
            T0 + SECOND,
            status,
            retryable,
        )


def good(state: State) -> None:
    """Every kind the soak counts, each keeping its promises."""
    state.sql("INSERT INTO racks (id, name, created_at) VALUES (%s, 'rack', %s)", state.rack, T0)
    state.schedule("gated", approval=True)
    approvers = (("ann", T0 + SECOND), ("bob", T0 + 2 * SECOND))
    state.run("approved", "gated", "completed", approvers=approvers)
    state.task("approved-task", run="approved", created=T0 + 2 * SECOND)
    state.run("awaiting", "gated", "awaiting_approval", slot=T0 + 30 * SECOND, approvers=())
    state.run("rejected", "gated", "rejected", slot=T0 + 60 * SECOND, approvers=())
    state.run("expired", "gated", "expired", slot=T0 + 90 * SECOND, approvers=())
    state.schedule("timely", deadline_us=2_000_000)
    state.run("in-time", "timely", "completed", fired=T0 + 2 * SECOND)  # exactly at the deadline
    state.task("in-time-task", run="in-time")
    state.run("missed", "timely", "missed", slot=T0 + 30 * SECOND, fired=T0 + 32 * SECOND + SECOND / 10**6)
    state.task(
        "retried",
        status="completed",
        attempt=2,
        retry=RETRY_2,
        attempts=(("failed", True), ("completed", False)),
    )
    state.task("refused", status="failed", retry=RETRY_2, attempts=(("failed", False),))
    state.task(
        "gave-up", status="failed", attempt=2, retry=RETRY_2, attempts=(("failed", True), ("failed", True))
    )
    state.task("plain")


def check(state: State, *, long_run: bool = True) -> Verdict:
    verdict = Verdict()
    soak_safety.check(state.conn, verdict.add, long_run=long_run)
    return verdict


@pytest.fixture
def state(database: str) -> Iterator[State]:
    with psycopg.connect(database) as conn:
        yield State(conn)
        conn.rollback()


def test_a_state_that_keeps_every_promise_passes_and_is_counted(state: State) -> None:
    good(state)
    verdict = check(state)
    assert verdict.broken == set(), verdict.values
    counts = verdict.values[next(c for c in verdict.values if c.startswith("safe operations exercised"))]
    # approved, approved by two, rejected, expired, missed, retried tasks, tasks failed for good
    assert counts == "1, 1, 1, 1, 1, 2, 1"


def test_a_long_run_that_exercised_nothing_fails_a_short_one_does_not(state: State) -> None:
    exercised = next(c for c in check(state).values if c.startswith("safe operations exercised"))
    assert check(state).broken == {exercised}
    assert check(state, long_run=False).broken == set()


UNAPPROVED = "tasks of runs never approved (awaiting, rejected, expired, unrecorded)"
SHORT = "approved runs' tasks without enough distinct approvers before them (or by the editor)"
LATE = "runs fired past their start deadline (database clock, no tolerance)"
MISSED = "missed runs with tasks, or not late"
OVER = "tasks past their max attempts"
GAP = "ended tasks whose recorded attempts have a gap, or miss one"
AFTER = "attempts after one that completed or failed for good (or a retryable one not retried)"

BREAKAGES: dict[str, tuple[str, Callable[[State], object]]] = {
    "a task of a run awaiting approval": (UNAPPROVED, lambda s: s.task("t", run="awaiting")),
    "a task of a rejected run": (UNAPPROVED, lambda s: s.task("t", run="rejected")),
    "a task of an expired run": (UNAPPROVED, lambda s: s.task("t", run="expired")),
    "a task of a gated schedule's run with no approval": (
        UNAPPROVED,
        lambda s: (
            s.run("bypassed", "gated", "completed", slot=T0 + 120 * SECOND),
            s.task("t", run="bypassed"),
        ),
    ),
    "one approver of two": (
        SHORT,
        lambda s: (
            s.run("half", "gated", "completed", slot=T0 + 120 * SECOND, approvers=(("ann", T0),)),
            s.task("t", run="half"),
        ),
    ),
    "one approver twice": (
        SHORT,
        lambda s: (
            s.run(
                "twice", "gated", "completed", slot=T0 + 120 * SECOND, approvers=(("ann", T0), ("ann", T0))
            ),
            s.task("t", run="twice"),
        ),
    ),
    "the last editor approving": (
        SHORT,
        lambda s: (
            s.run(
                "own", "gated", "completed", slot=T0 + 120 * SECOND, approvers=(("ann", T0), ("carol", T0))
            ),
            s.task("t", run="own"),
        ),
    ),
    "a task before the approval": (
        SHORT,
        lambda s: s.sql(
            "UPDATE tasks SET created_at = %s WHERE id = %s", T0 + SECOND, s.ids["approved-task"]
        ),
    ),
    "a firing a microsecond past its deadline": (
        LATE,
        lambda s: s.run(
            "late", "timely", "completed", slot=T0 + 60 * SECOND, fired=T0 + 62 * SECOND + SECOND / 10**6
        ),
    ),
    "a missed run with a task": (MISSED, lambda s: s.task("t", run="missed")),
    "a missed run that was in time": (
        MISSED,
        lambda s: s.run("early", "timely", "missed", slot=T0 + 60 * SECOND, fired=T0 + 62 * SECOND),
    ),
    "a missed run of a schedule without a deadline": (
        MISSED,
        lambda s: s.run("nodeadline", "gated", "missed", slot=T0 + 120 * SECOND, fired=T0 + 3600 * SECOND),
    ),
    "an attempt past the max": (
        OVER,
        lambda s: s.task("t", status="failed", attempt=3, retry=RETRY_2, attempts=(("failed", True),) * 3),
    ),
    "a second attempt without retries": (
        OVER,
        lambda s: s.sql("UPDATE tasks SET attempt = 2 WHERE id = %s", s.ids["plain"]),
    ),
    "a gap in the attempts": (
        GAP,
        lambda s: s.sql("DELETE FROM task_attempt WHERE task_id = %s AND attempt = 1", s.ids["retried"]),
    ),
    "the last attempt not recorded": (
        GAP,
        lambda s: s.sql("DELETE FROM task_attempt WHERE task_id = %s AND attempt = 2", s.ids["retried"]),
    ),
    "an attempt after a non-retryable failure": (
        AFTER,
        lambda s: (
            s.sql("UPDATE tasks SET attempt = 2 WHERE id = %s", s.ids["refused"]),
            s.attempt("refused", 2, "failed", False),
        ),
    ),
    "a retryable failure with attempts left not retried": (
        AFTER,
        lambda s: s.task("t", status="failed", retry=RETRY_2, attempts=(("failed", True),)),
    ),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_each_broken_promise_is_reported_by_its_check(state: State, breakage: str) -> None:
    reported_by, broken = BREAKAGES[breakage]
    good(state)
    broken(state)
    assert check(state).broken == {reported_by}
