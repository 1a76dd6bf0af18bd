"""The chaos soak's safe-operations part (bench/soak.py; docs/RELIABILITY.md, "The chaos soak";
docs/SAFETY.md): schedules with approvals, retries and start deadlines in the mix, a driver that plays
their approvers and pauses some, and the checker of what they promise.

The mix, `per_kind` schedules of each kind, each on a rack of its own (`safe-…`, outside the soak's other
racks, so the failures injected here touch nothing else):

* approval (created by `carol`, an approver, so the two-person rule refuses her approvals): a third need
  two approvers, whom the driver sends at once through two different instances; a third need one, whom
  it sometimes sends twice at once (one is told the run no longer awaits approval); a fifth of those
  decisions are rejections; a third have a 3 s timeout and are never decided, so they expire. Before a
  decision the driver sometimes has carol try to approve (refused);
* retries (`RetryPolicy`, 2–4 attempts, back-off 1–3 s): a third on racks whose first component always
  fails retryably (`RACKFLOW_SIM_TRANSIENT_IDS`: every attempt fails, the last one fails the task), a
  third whose first component fails retryably twice in each process and then works (retried, then
  completed), a third whose second component always fails for good (`RACKFLOW_SIM_FAIL_IDS`: failed at the
  first attempt, never tried again); the soak's 5% of failing steps fall on them too;
* start deadlines: recurring schedules with a deadline of 1–2 s, which the faults make late (missed), and
  one-time schedules the driver creates every 10–20 s due 6 s later with a 2 s deadline, two in three of
  which it pauses at once and resumes (itself, or by the pause's `resume_at`) after the deadline passed,
  so they are found late: missed.

The soak runs with bearer tokens (`server_env`): every call is the operator `soak`'s, but approvals.

The checker, from the database once the tasks have drained, each a promise of docs/SAFETY.md:

* no task of a run that was never approved: runs awaiting approval, rejected or expired have no tasks; a
  run of a schedule with an approval policy that has tasks has an approval record with at least
  `min_approvers` distinct principals, none of them the schedule's last editor, decided at or before its
  first task was created;
* no firing past its deadline: every dispatched run of a schedule with a start deadline that is not
  `missed` was fired (on the database's clock, which both its slot and the planner's decision use) at most
  the deadline after its slot, exactly, with no tolerance (the planner compares the same two values);
  every missed run was fired later than that, and has no tasks;
* attempts never above max: every task's attempt is at most its retry policy's `max_attempts` (1 without
  one); `task_attempt` holds attempts 1..n of each task with no gap (n the task's attempt, or one less when
  its current attempt never started); nothing was attempted after an attempt that completed or failed for
  good, and the task ended as that attempt did; and a retryable failure with attempts left was retried.

With `long_run`, a kind the mix produced none of (approved, rejected, expired or missed runs, retried
tasks, refused ones) is a violation too, so the invariants cannot hold vacuously.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from rackflow.security import hash_token
from rackflow.v1 import flow_pb2 as pb

if TYPE_CHECKING:  # soak.py puts the repository on the path only after importing this
    from tests.e2e.cluster import ServerProcess

Add = Callable[..., None]  # the soak's Verdict.add(check, value, ok=True, note="")

# name -> (role, token). `soak` makes every call but the approvals; `carol` creates the approval
# schedules (so she is their last editor); `ann` and `bob` approve and reject.
TOKENS = {
    "soak": ("operator", "soak-operator-7f3a"),
    "carol": ("approver", "soak-carol-91bd"),
    "ann": ("approver", "soak-ann-2c64"),
    "bob": ("approver", "soak-bob-e05f"),
}
OPERATOR = "soak"
EDITOR = "carol"
APPROVERS = ("ann", "bob")
KINDS = ("approval", "retry", "deadline")
LATE_DEADLINE_S = 2  # the driver's one-time schedules: due 6 s after creation, this deadline
LATE_DUE_S = 6


def metadata(principal: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TOKENS[principal][1]}"),)


def rack_names(kind: str, per_kind: int) -> list[str]:
    return [f"safe-{kind}-{i}" for i in range(per_kind)]


def server_env(per_kind: int) -> dict[str, str]:
    """What every instance of the soak runs with: the tokens, and the simulator's injected failures on the
    retry schedules' racks (by component external id, `<rack>-c<n>`; see the module)."""
    env = {
        f"RACKFLOW_AUTH_TOKEN_{name.upper()}": f"{role}:{hash_token(token)}"
        for name, (role, token) in TOKENS.items()
    }
    racks = rack_names("retry", per_kind)
    env["RACKFLOW_SIM_TRANSIENT_IDS"] = ",".join(
        f"{rack}-c0" if i % 3 == 0 else f"{rack}-c0:2" for i, rack in enumerate(racks) if i % 3 != 2
    )
    env["RACKFLOW_SIM_FAIL_IDS"] = ",".join(f"{rack}-c1" for i, rack in enumerate(racks) if i % 3 == 2)
    return env


class Caller(Protocol):
    """The soak's client (bench/soak.py): one recorded call as `principal`, through `server` or the next
    live instance; (the status code's name, the answer or None)."""

    stop: threading.Event

    def attempt(
        self, method: str, request: object, *, principal: str = ..., server: ServerProcess | None = ...
    ) -> tuple[str, Any]: ...

    def live(self) -> list[ServerProcess]: ...


def _create(caller: Caller, request: pb.CreateTaskScheduleRequest, principal: str = OPERATOR) -> str:
    code, answer = caller.attempt("CreateTaskSchedule", request, principal=principal)
    if answer is None:
        raise SystemExit(f"cannot create schedule {request.schedule.name}: {code}")
    return str(answer.id.id)


def _request(name: str, rack: str, spec_type: int, spec: str) -> pb.CreateTaskScheduleRequest:
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=rack)]))
    return pb.CreateTaskScheduleRequest(
        schedule=pb.ScheduleConfig(name=name, spec=pb.ScheduleSpec(type=spec_type, spec=spec)),
        operation=pb.ScheduledOperation(power_on=pb.PowerOnRackRequest(target_spec=target)),
    )


@dataclass
class SafetyDriver:
    """Creates the mix, then plays its people until the client stops: approves, rejects, lets expire;
    creates late one-time schedules, pauses and resumes them."""

    caller: Caller
    rng: random.Random
    per_kind: int
    decided: dict[str, str] = field(default_factory=dict)  # schedule id -> "two", "one" or "expire"
    deadline_racks: list[str] = field(default_factory=list)
    done: set[str] = field(default_factory=set)  # runs decided (or seen decided)
    editor_answers: Counter[str] = field(default_factory=Counter)  # carol's approvals, by answer
    decisions: Counter[str] = field(default_factory=Counter)  # the driver's calls answered OK, by kind
    to_resume: list[tuple[float, str]] = field(default_factory=list)  # (when, schedule id)
    late_created: int = 0
    late_paused: int = 0

    def create(self) -> None:
        for kind in KINDS:
            for i, rack in enumerate(rack_names(kind, self.per_kind)):
                components = [
                    pb.ComponentSpec(
                        type=pb.COMPONENT_TYPE_COMPUTE, name=f"{rack}-c{n}", external_id=f"{rack}-c{n}"
                    )
                    for n in range(2)
                ]
                code, answer = self.caller.attempt(
                    "CreateRack", pb.CreateRackRequest(name=rack, components=components)
                )
                if answer is None:
                    raise SystemExit(f"cannot create rack {rack}: {code}")
                every = f"{self.rng.randint(15, 40)}s"
                request = _request(f"{kind}-{i}", rack, pb.SCHEDULE_SPEC_TYPE_INTERVAL, every)
                if kind == "approval":
                    how = ("two", "one", "expire")[i % 3]
                    request.schedule.approval.CopyFrom(
                        pb.ApprovalPolicy(
                            required=True,
                            timeout="3s" if how == "expire" else "60s",
                            min_approvers=2 if how == "two" else 1,
                        )
                    )
                    self.decided[_create(self.caller, request, EDITOR)] = how
                elif kind == "retry":
                    backoff = self.rng.choice(("1s", "2s"))
                    request.schedule.retry.CopyFrom(
                        pb.RetryPolicy(
                            max_attempts=self.rng.randint(2, 4),
                            initial_backoff=backoff,
                            multiplier=1.5,
                            max_backoff="3s",
                        )
                    )
                    _create(self.caller, request)
                else:
                    request.schedule.start_deadline = self.rng.choice(("1s", "2s"))
                    _create(self.caller, request)
                    self.deadline_racks.append(rack)

    def run(self) -> None:
        to_decide = [s for s, how in self.decided.items() if how != "expire"]
        next_late = time.time() + self.rng.uniform(2, 10)
        for n in itertools.count():
            if self.caller.stop.wait(self.rng.uniform(0.5, 1.5)):
                return
            if to_decide:
                self._decide(to_decide[n % len(to_decide)])
            if time.time() >= next_late:
                self._late_one_time(n)
                next_late = time.time() + self.rng.uniform(10, 20)
            self._resume_due()

    # --- approvals ------------------------------------------------------------------------------------

    def _decide(self, schedule_id: str) -> None:
        request = pb.ListTaskScheduleRunsRequest(
            schedule_id=pb.UUID(id=schedule_id), pagination=pb.Pagination(limit=10)
        )
        _, answer = self.caller.attempt("ListTaskScheduleRuns", request)
        for run in answer.runs if answer is not None else ():
            if run.state != "awaiting_approval" or run.id.id in self.done:
                continue
            if self.rng.random() < 0.25:  # the two-person rule refuses the schedule's last editor
                code, _ = self.caller.attempt(
                    "ApproveTaskScheduleRun", pb.ApproveTaskScheduleRunRequest(id=run.id), principal=EDITOR
                )
                self.editor_answers[code] += 1
            given = {a.principal for a in run.approval.approvers}
            left = [p for p in APPROVERS if p not in given]
            if not left:  # both approved, yet it awaits: the checker will say so
                continue
            if self.rng.random() < 0.2:
                reject = pb.RejectTaskScheduleRunRequest(id=run.id, comment="soak: not now")
                code, _ = self.caller.attempt(
                    "RejectTaskScheduleRun", reject, principal=self.rng.choice(left)
                )
                self._settle(run.id.id, [code], "rejected")
            elif self.decided[schedule_id] == "two" or self.rng.random() < 0.3:
                self._together(run.id, left)
            else:
                approve = pb.ApproveTaskScheduleRunRequest(id=run.id, comment="soak")
                code, _ = self.caller.attempt("ApproveTaskScheduleRun", approve, principal=left[0])
                self._settle(run.id.id, [code], "approved")

    def _together(self, run_id: pb.UUID, principals: list[str]) -> None:
        """Each of `principals` approves at once, through a different live instance where there are two."""
        live = self.caller.live()
        barrier = threading.Barrier(len(principals))
        codes: list[str] = []

        def approve(principal: str, server: ServerProcess | None) -> None:
            barrier.wait(10)
            request = pb.ApproveTaskScheduleRunRequest(id=run_id, comment="soak, together")
            codes.append(
                self.caller.attempt("ApproveTaskScheduleRun", request, principal=principal, server=server)[0]
            )

        threads = [
            threading.Thread(target=approve, args=(p, live[i % len(live)] if live else None), daemon=True)
            for i, p in enumerate(principals)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        self.decisions["rounds of approvers at once"] += len(principals) > 1
        self._settle(run_id.id, codes, "approved")

    def _settle(self, run_id: str, codes: list[str], what: str) -> None:
        """Count the calls answered OK; the run is done with when every call was answered OK or
        FAILED_PRECONDITION (already decided, or expired). After anything else (a fault) the next round
        tries again, with the approvers the run does not have yet."""
        self.decisions[what] += codes.count("OK")
        if codes and all(code in ("OK", "FAILED_PRECONDITION") for code in codes):
            self.done.add(run_id)

    # --- late one-time schedules -----------------------------------------------------------------------

    def _late_one_time(self, n: int) -> None:
        """A one-time schedule due LATE_DUE_S from now with a LATE_DEADLINE_S deadline; two in three paused
        at once, to be resumed after the deadline (one of those by the pause's own `resume_at`)."""
        at = datetime.now(UTC) + timedelta(seconds=LATE_DUE_S)
        request = _request(
            f"late-{n}", self.rng.choice(self.deadline_racks), pb.SCHEDULE_SPEC_TYPE_ONE_TIME, at.isoformat()
        )
        request.schedule.start_deadline = f"{LATE_DEADLINE_S}s"
        code, answer = self.caller.attempt("CreateTaskSchedule", request)
        if answer is None:
            return
        self.late_created += 1
        way = self.late_created % 3
        if way == 0:
            return
        resume = at + timedelta(seconds=LATE_DEADLINE_S + self.rng.uniform(2, 4))
        pause = pb.PauseTaskScheduleRequest(id=answer.id, reason="soak: late on purpose")
        if way == 1:
            pause.resume_at.FromDatetime(resume)
        code, _ = self.caller.attempt("PauseTaskSchedule", pause)
        self.late_paused += code == "OK"
        # Resumed by the driver even when the pause's answer was lost: it may have been paused all the same.
        if way == 2 or code != "OK":
            self.to_resume.append((resume.timestamp(), answer.id.id))

    def _resume_due(self) -> None:
        keep = []
        for when, schedule_id in self.to_resume:
            if when > time.time():
                keep.append((when, schedule_id))
                continue
            code, _ = self.caller.attempt(
                "ResumeTaskSchedule", pb.ResumeTaskScheduleRequest(id=pb.UUID(id=schedule_id))
            )
            if code not in ("OK", "FAILED_PRECONDITION"):  # FAILED_PRECONDITION: it fired meanwhile
                keep.append((when, schedule_id))
        self.to_resume = keep

    def report(self, add: Add, *, long_run: bool) -> None:
        """The driver's own record: the last editor's approvals (each must be refused; in a long run, some
        must have been tried), its calls answered OK, and the late one-time schedules it made."""
        refused = self.editor_answers["PERMISSION_DENIED"]
        wrongly = self.editor_answers["OK"]
        add(
            "approvals by the schedule's last editor: refused / answered OK (two-person rule)",
            f"{refused} / {wrongly}",
            wrongly == 0 and not (long_run and refused == 0),
        )
        add(
            "the driver's approvals and rejections answered OK; late one-time schedules created, paused",
            f"{dict(sorted(self.decisions.items()))}; {self.late_created}, {self.late_paused}",
        )


# --- the checker -----------------------------------------------------------------------------------------


def _rows(conn: psycopg.Connection[Any], statement: str) -> list[tuple[Any, ...]]:
    return conn.execute(statement).fetchall()  # type: ignore[arg-type]


def check(conn: psycopg.Connection[Any], add: Add, *, long_run: bool) -> None:
    """The three promises of the module's docstring, and the counts of each kind."""
    counts = {
        **check_approvals(conn, add),
        **check_deadlines(conn, add),
        **check_attempts(conn, add),
    }
    none = [kind for kind, n in counts.items() if n == 0]
    add(
        "safe operations exercised: " + ", ".join(counts),
        ", ".join(str(n) for n in counts.values()),
        not (long_run and none),
        f"(none {', '.join(none)}: the invariants held vacuously)" if long_run and none else "",
    )


def _listed(found: list[str]) -> str:
    return "; ".join(found[:3])


def check_approvals(conn: psycopg.Connection[Any], add: Add) -> dict[str, int]:
    unapproved = [
        f"run {run_id} ({state}): {n} tasks"
        for run_id, state, n in _rows(
            conn,
            "SELECT r.id, r.state, count(*) FROM task_schedule_run r JOIN tasks t ON t.run_id = r.id"
            " WHERE r.state IN ('awaiting_approval', 'rejected', 'expired') GROUP BY r.id, r.state",
        )
    ]
    unrecorded = [
        f"run {row[0]}: its schedule needs approval, the run has none recorded"
        for row in _rows(
            conn,
            "SELECT r.id FROM task_schedule_run r JOIN task_schedule s ON s.id = r.schedule_id"
            " WHERE jsonb_typeof(s.approval) = 'object'"
            " AND jsonb_typeof(r.approval) IS DISTINCT FROM 'object'"
            " AND EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.id)",
        )
    ]
    short: list[str] = []
    approved_by_two = 0
    for run_id, approval, editor, first_task in _rows(
        conn,
        "SELECT r.id, r.approval, s.last_edited_by, min(t.created_at) FROM task_schedule_run r"
        " JOIN task_schedule s ON s.id = r.schedule_id JOIN tasks t ON t.run_id = r.id"
        " WHERE jsonb_typeof(r.approval) = 'object'"
        " AND r.state NOT IN ('awaiting_approval', 'rejected', 'expired')"
        " GROUP BY r.id, r.approval, s.last_edited_by",
    ):
        principals = {a["principal"] for a in approval["approvers"]}
        decided = datetime.fromisoformat(approval["decided_at"]) if approval.get("decided_at") else None
        approved_by_two += len(principals) >= 2
        if len(principals) < approval["min_approvers"]:
            short.append(f"run {run_id}: approved by {sorted(principals)}, needs {approval['min_approvers']}")
        elif editor in principals:
            short.append(f"run {run_id}: approved by its schedule's last editor {editor!r}")
        elif decided is None or first_task < decided:
            short.append(f"run {run_id}: a task created at {first_task}, the approval decided at {decided}")
    broken = unapproved + unrecorded
    add(
        "tasks of runs never approved (awaiting, rejected, expired, unrecorded)",
        len(broken),
        not broken,
        _listed(broken),
    )
    add(
        "approved runs' tasks without enough distinct approvers before them (or by the editor)",
        len(short),
        not short,
        _listed(short),
    )
    states = Counter(
        dict(
            _rows(
                conn,
                "SELECT state, count(*) FROM task_schedule_run WHERE jsonb_typeof(approval) = 'object'"
                " GROUP BY state",
            )
        )
    )
    waiting = ("awaiting_approval", "rejected", "expired", "skipped")
    approved = sum(n for state, n in states.items() if state not in waiting)
    add(
        "approval runs by state (approved: the others than awaiting, rejected, expired)",
        dict(sorted(states.items())),
    )
    return {
        "approved runs": approved,
        "approved by two": approved_by_two,
        "rejected runs": states["rejected"],
        "expired runs": states["expired"],
    }


def check_deadlines(conn: psycopg.Connection[Any], add: Add) -> dict[str, int]:
    late: list[str] = []
    missed_wrongly: list[str] = []
    missed = in_time = 0
    for run_id, state, slot, fired, deadline_us, task_count in _rows(
        conn,
        "SELECT r.id, r.state, r.scheduled_for, r.fired_at, coalesce(s.start_deadline_us, 0),"
        " (SELECT count(*) FROM tasks t WHERE t.run_id = r.id)"
        " FROM task_schedule_run r JOIN task_schedule s ON s.id = r.schedule_id"
        " WHERE r.trigger = 'dispatch' AND (s.start_deadline_us > 0 OR r.state = 'missed')",
    ):
        past = deadline_us > 0 and fired > slot + timedelta(microseconds=deadline_us)
        if state == "missed":
            missed += 1
            if task_count or not past:
                missed_wrongly.append(
                    f"run {run_id}: missed, {task_count} tasks, fired {fired - slot} after its slot"
                )
        elif past:
            late.append(f"run {run_id} ({state}, {task_count} tasks): fired {fired - slot} after its slot")
        else:
            in_time += 1
    add(
        "runs fired past their start deadline (database clock, no tolerance)",
        len(late),
        not late,
        _listed(late),
    )
    add(
        "missed runs with tasks, or not late",
        len(missed_wrongly),
        not missed_wrongly,
        _listed(missed_wrongly),
    )
    add("runs of schedules with a start deadline: in time, missed", f"{in_time}, {missed}")
    return {"missed runs": missed}


def check_attempts(conn: psycopg.Connection[Any], add: Add) -> dict[str, int]:
    over = [
        f"task {task_id}: attempt {attempt} of {most}"
        for task_id, attempt, most in _rows(
            conn,
            "SELECT id, attempt, coalesce((retry->>'max_attempts')::int, 1) AS most FROM tasks"
            " WHERE attempt > coalesce((retry->>'max_attempts')::int, 1) OR attempt < 1",
        )
    ]
    add("tasks past their max attempts", len(over), not over, _listed(over))
    gaps = [
        f"task {task_id} (attempt {attempt}, {status}): attempts recorded {numbers}"
        for task_id, status, attempt, started, retries, numbers in _rows(
            conn,
            "SELECT t.id, t.status, t.attempt, t.attempt_started_at IS NOT NULL,"
            " jsonb_typeof(t.retry) = 'object',"
            " coalesce(array_agg(a.attempt ORDER BY a.attempt) FILTER (WHERE a.attempt IS NOT NULL), '{}')"
            " FROM tasks t LEFT JOIN task_attempt a ON a.task_id = t.id"
            " WHERE t.status IN ('completed', 'failed')"
            " GROUP BY t.id, t.status, t.attempt, t.attempt_started_at, t.retry",
        )
        if numbers != list(range(1, (attempt if started else attempt - 1) + 1 if retries else 1))
    ]
    add("ended tasks whose recorded attempts have a gap, or miss one", len(gaps), not gaps, _listed(gaps))
    after = [
        f"task {task_id}: attempt {number} {status} (retryable: {retryable}), task {task_status} at {attempt}"
        for task_id, number, status, retryable, attempt, task_status, most in _rows(
            conn,
            "SELECT a.task_id, a.attempt, a.status, a.retryable, t.attempt, t.status,"
            " coalesce((t.retry->>'max_attempts')::int, 1)"
            " FROM task_attempt a JOIN tasks t ON t.id = a.task_id",
        )
        if ((status != "failed" or not retryable) and (number != attempt or task_status != status))
        or (status == "failed" and retryable and number < most and attempt == number)
    ]
    add(
        "attempts after one that completed or failed for good (or a retryable one not retried)",
        len(after),
        not after,
        _listed(after),
    )
    retried, given_up, refused = _rows(
        conn,
        "SELECT count(*) FILTER (WHERE t.attempt > 1),"
        " count(*) FILTER (WHERE t.status = 'failed' AND t.attempt = (t.retry->>'max_attempts')::int),"
        " count(*) FILTER (WHERE EXISTS (SELECT 1 FROM task_attempt a WHERE a.task_id = t.id"
        " AND a.status = 'failed' AND NOT a.retryable))"
        " FROM tasks t WHERE jsonb_typeof(t.retry) = 'object'",
    )[0]
    add(
        "tasks with retries: retried, failed at their last attempt, failed for good",
        f"{retried}, {given_up}, {refused}",
    )
    return {"retried tasks": retried, "tasks failed for good": refused}
