"""The start gates: one seam for everything that may keep a claimed task from starting yet.

A task that may not start yet is *held*, one typed way, on its row (`Task.not_before`, `held_by`,
`held_reason`, `held_since`): the executor's claim leaves it until `not_before`. Two things hold tasks:

* its window, from submission: a firmware upgrade's own maintenance window, or the opening a DEFER
  firing waits for (`held_by` "window"; `not_after`, the window's end, fails it if it has not started by
  then). The claim's SQL honours it; no gate is involved.
* the start gates, at claim time. A gate is an object with a `name` and a `check`: given the claim's
  connection (its transaction), the claimed tasks and now, it answers for each task it stops, `Hold(until,
  reason)` or `Fail(reason)`. The executor calls `consult` with the gates it was built with (the list is
  made in `Services.build`, services.py): a held task goes back to PENDING as if never claimed (the
  attempt is not counted), held by that gate until `until`; a failed task ends without running (FAILED, or
  TERMINATED as `Fail.ends_as` says), with the reason as its message. Gates run in the list's order, each
  on the tasks the ones before let through (so a frozen task never takes a budget's room). A hold that
  only awaits an answer the gate asked for (`Hold.awaits_answer`: a first round of pre-flight checks)
  keeps the task's slot in the executor that held it until the answer or `until` (`Executor`'s "slots kept
  for answers"), so a burst is not held, and asked about, faster than it could start.

Only first attempts are gated. A later attempt is a takeover of a task that was RUNNING all along (its
owner died, or its run was interrupted): it started already, so handing it back would lose its place
(and its `started_at`) for nothing. But the claim before it may have been a refusal: a gate's `Fail`
leaves the task RUNNING for its executor to end, and an instance that dies first leaves it to a takeover.
So `consult` records every gate's refusal on the task (`Task.refusal`) in the claim's transaction, and a
takeover, which reads it back with the task (the claim's own pick returns it), ends the task with it
rather than run it. Writing it touches only rows the claim holds (no lock after them, the lock order of
`tasks/executor.py`), and costs a statement only at a claim some gate refused a task in.
Nor is a task past the end of its window (`Task.too_late`) gated: it fails without running at this
claim, so no gate may hold it (a freeze would keep it waiting, for nothing, until the freeze ends), count
it (a budget's room) or ask about it (a pre-flight check's round).

A gate's `check` runs inside the claim's transaction, which holds rows locked: it must do no network I/O
and nothing slow. A gate that needs the outside world (a pre-flight check asking Alertmanager) reads what
a loop of its own last found, from the database, and holds the task until the next look ("until re-check");
`Task.held_since` (kept while the same gate holds the task) tells it how long it has waited, so it can
`Fail` the task once a maximum wait is exceeded.

A look ahead (issue 26): the pre-flight checker asks its hooks about the tasks next in line before an
executor has room to claim them, and asks only about those the gates before it would let start now
(`look`): a gate that can answer without writing or locking anything has a `look` method that answers as
its `check` would; a gate without one lets no task be looked ahead at.

Adding a gate: a module with a class that has `name` and `check` (as `windows/gate.py`), and its
instance in the list `Services.build` makes. Its name shows on the tasks it holds (`rackflow task show`,
the API's `Task.held_by`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol, runtime_checkable

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.tasks import Fail, Hold, InLine, Task
from rackflow.metrics import TASK_HOLDS
from rackflow.store import task_runs
from rackflow.store.tasks import NOT_HELD

log = logging.getLogger(__name__)


Verdict = Hold | Fail


class Gate(Protocol):
    """A start gate. `name` is short, lower case and stable: it is stored on the tasks it holds."""

    @property
    def name(self) -> str: ...

    async def check(
        self, conn: AsyncConnection, tasks: Sequence[Task], now: datetime
    ) -> Mapping[uuid.UUID, Verdict]:
        """The tasks among `tasks` (just claimed, first attempts) that may not start at `now`, with why.
        Tasks left out start (unless a later gate stops them). It may read and write in `conn` (the claim's
        transaction), but never wait on anything outside the database."""
        ...


@runtime_checkable
class Looking(Gate, Protocol):
    """A gate that can also say, without writing or locking anything, what it would answer now."""

    async def look(
        self, conn: AsyncConnection, tasks: Sequence[InLine], now: datetime
    ) -> Mapping[uuid.UUID, Verdict]:
        """What `check` would answer for `tasks` (PENDING, not claimed, in claim order: each counted as if
        the ones before it started) at `now`. It writes and locks nothing; the claim's `check` decides."""
        ...


@runtime_checkable
class LooksAgain(Gate, Protocol):
    """A gate whose holds may outlast what it decided them by, with nothing left to let them go: a freeze
    shortened or deleted while a claim held a task of it, whose change let go of that hold only once it
    committed and did not live to (`rackflow.windows.gate`). The executor asks it at its dead-hold cadence
    (every lease period) to let go of those."""

    async def look_again(self, now: datetime) -> int:
        """Let go of the holds this gate would no longer hold so long at `now` (each is claimed and gated
        again); returns how many. In transactions of its own, which hold nothing else."""
        ...


async def look(
    gates: Sequence[Gate], conn: AsyncConnection, tasks: Sequence[InLine], now: datetime
) -> list[InLine]:
    """Of `tasks` (not claimed, in claim order), those every gate of `gates` would let start now, by their
    `look`; none if a gate has no `look`. A look only: each task's claim still asks every gate."""
    open_ = list(tasks)
    for gate in gates:
        if not open_:
            break
        if not isinstance(gate, Looking):
            return []
        verdicts = await gate.look(conn, open_, now)
        open_ = [task for task in open_ if task.id not in verdicts]
    return open_


@dataclass(frozen=True)
class Gated:
    """What the gates made of a claim: the tasks that start (or fail), why the failed ones fail, and the
    held tasks whose gate awaits an answer that may start them soon (`Hold.awaits_answer`), with the
    hold's end (`awaiting`: the executor keeps a slot for each meanwhile)."""

    claimed: list[tuple[Task, int]]
    failed: dict[uuid.UUID, Fail]
    awaiting: dict[uuid.UUID, tuple[str, datetime]]


async def consult(
    gates: Sequence[Gate],
    conn: AsyncConnection,
    claimed: Sequence[tuple[Task, int]],
    *,
    owner_id: uuid.UUID,
    now: datetime,
) -> Gated:
    """Ask the gates about what a claim just took (task, attempt), in its transaction; hand back the held
    tasks, and clear the hold of those that start. What is left starts, but the failed ones fail: those
    the gates refuse now, recorded on them in this transaction, and those taken over that a gate refused
    at an earlier claim (their recorded `refusal`)."""
    held: set[uuid.UUID] = set()
    failed = {task.id: task.refusal for task, attempt in claimed if attempt > 1 and task.refusal is not None}
    refused: dict[uuid.UUID, Fail] = {}
    awaiting: dict[uuid.UUID, tuple[str, datetime]] = {}
    open_ = [task for task, attempt in claimed if attempt == 1 and not task.too_late(now)]
    for gate in gates:
        if not open_:
            break
        verdicts = await gate.check(conn, open_, now)
        holds = {i: verdict for i, verdict in verdicts.items() if isinstance(verdict, Hold)}
        refused.update((i, verdict) for i, verdict in verdicts.items() if isinstance(verdict, Fail))
        if holds:
            # Handed back at once, so the next gate's count (a budget's) no longer sees them RUNNING.
            await task_runs.hold_back(conn, gate.name, holds, owner_id=owner_id, now=now)
            held.update(holds)
            awaiting.update((i, (gate.name, hold.until)) for i, hold in holds.items() if hold.awaits_answer)
            TASK_HOLDS.labels(gate=gate.name).inc(len(holds))
            log.info("%d task(s) held back by %s", len(holds), gate.name, extra={"tasks_held": len(holds)})
        open_ = [task for task in open_ if task.id not in verdicts]
    was_held = {
        task.id
        for task, _ in claimed
        if task.id not in held and (task.held_by is not None or task.not_before is not None)
    }
    if was_held:
        await task_runs.clear_holds(conn, was_held)
    if refused:
        await task_runs.record_refusals(conn, refused)
        failed.update(refused)
    starts = [
        (replace(task, **NOT_HELD) if task.id in was_held else task, attempt)
        for task, attempt in claimed
        if task.id not in held
    ]
    return Gated(starts, failed, awaiting)
