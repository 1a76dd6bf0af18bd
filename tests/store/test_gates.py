"""The start gates' seam (`rackflow.tasks.gates`) on both databases, with gates made for the test: a gate
holds a task "until re-check" (on the task: by whom, why, since when, kept while the same gate holds it)
and then fails it with its reason; a task it lets go starts with its hold cleared; gates run in order,
each on what the ones before let through, and never see a takeover; a change releases one gate's holds
only; a task waiting for its window's opening is held by it in the typed columns."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from prometheus_client import REGISTRY
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.inventory import ComponentSpec, ComponentType, Rack
from rackflow.domain.tasks import WINDOW_HOLD, Fail, Hold, Operation, OperationKind, Task, TaskStatus
from rackflow.inventory.service import InventoryService
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.tasks.gates import Gate, Verdict, consult
from tests.store.test_executor import CLOCK, eventually, executing, finished, get, make_rack, submit

POWER_ON = Operation(OperationKind.POWER_ON)
RECHECK = timedelta(milliseconds=50)


@dataclass
class Probe:
    """A gate that answers from a script, one verdict per look (then lets the task go), and records what
    it was shown: the hold's start each time, and the tasks."""

    name: str
    script: list[str]  # "hold" or "fail", in order
    seen_since: list[datetime | None] = field(default_factory=list)
    seen: list[list[uuid.UUID]] = field(default_factory=list)

    async def check(
        self, conn: AsyncConnection, tasks: Sequence[Task], now: datetime
    ) -> Mapping[uuid.UUID, Verdict]:
        self.seen.append([task.id for task in tasks])
        verdicts: dict[uuid.UUID, Verdict] = {}
        for task in tasks:
            if not self.script:
                continue
            self.seen_since.append(task.held_since)
            look = self.script.pop(0)
            reason = f"not ready ({len(self.seen_since)})"
            verdicts[task.id] = Hold(now + RECHECK, reason) if look == "hold" else Fail(f"gave up: {reason}")
        return verdicts


async def _rack(db: Database, name: str) -> Rack:
    spec = ComponentSpec(ComponentType.COMPUTE, "compute-0", external_id=f"{name}-gpu-0")
    return await InventoryService(db, CLOCK).create_rack(name, components=[spec])


def _holds(gate: str) -> float:
    return REGISTRY.get_sample_value("rackflow_task_holds_total", {"gate": gate}) or 0.0


async def test_a_gate_holds_until_re_check_then_fails_the_task_with_its_reason(db: Database) -> None:
    rack = await make_rack(db, computes=1)
    probe = Probe("probe", ["hold", "hold", "fail"])
    before = _holds("probe")
    task = await submit(db, rack, POWER_ON)
    async with executing(db, gates=[probe]):

        async def held() -> bool:
            return (await get(db, task)).held_by == "probe"

        await eventually(held)
        waiting = await get(db, task)
        assert waiting.status is TaskStatus.PENDING and waiting.started_at is None
        assert waiting.held_reason is not None and waiting.held_reason.startswith("not ready")
        assert waiting.message == waiting.held_reason
        assert waiting.not_before is not None and waiting.held_since is not None
        done = await finished(db, task)
    assert (done.status, done.message) == (TaskStatus.FAILED, "gave up: not ready (3)")
    first, second, third = probe.seen_since
    assert first is None  # not held yet at the first look
    assert second is not None and third == second  # kept while the same gate holds it
    assert (done.held_by, done.held_reason, done.not_before) == (None, None, None)
    assert _holds("probe") - before == 2


async def test_a_task_the_gate_lets_go_starts_with_its_hold_cleared(db: Database) -> None:
    rack = await make_rack(db, computes=1)
    probe = Probe("once", ["hold"])
    task = await submit(db, rack, POWER_ON)
    async with executing(db, gates=[probe]):
        done = await finished(db, task)
    assert done.status is TaskStatus.COMPLETED and len(probe.seen) >= 2
    assert (done.held_by, done.held_reason, done.held_since, done.not_before) == (None, None, None, None)


async def _claim(db: Database, conn: AsyncConnection, owner: uuid.UUID) -> list[tuple[Task, int]]:
    return await task_runs.claim(
        db, conn, owner_id=owner, lease_ttl=timedelta(seconds=15), running_here=(), now=CLOCK.now(), limit=9
    )


async def test_gates_run_in_order_on_what_the_ones_before_let_through(db: Database) -> None:
    first_rack, second_rack = await _rack(db, "r1"), await _rack(db, "r2")
    a, b = await submit(db, first_rack, POWER_ON), await submit(db, second_rack, POWER_ON)
    first, second = Probe("first", ["hold"]), Probe("second", [])
    owner = uuid.uuid4()
    async with db.transaction() as conn:
        claimed = await _claim(db, conn, owner)
        gated = await consult([first, second], conn, claimed, owner_id=owner, now=CLOCK.now())
    assert first.seen == [[a.id, b.id]] and second.seen == [[b.id]]
    assert [task.id for task, _ in gated.claimed] == [b.id] and gated.failed == {}
    assert ((await get(db, a)).status, (await get(db, a)).held_by) == (TaskStatus.PENDING, "first")
    assert (await get(db, b)).status is TaskStatus.RUNNING


async def test_a_takeover_is_never_gated(db: Database) -> None:
    rack = await make_rack(db)
    task = await submit(db, rack, POWER_ON)
    probe = Probe("probe", ["fail"])
    owner = uuid.uuid4()
    async with db.transaction() as conn:
        taken_over = [(t, 2) for t, _ in await _claim(db, conn, owner)]
        gated = await consult([probe], conn, taken_over, owner_id=owner, now=CLOCK.now())
    assert probe.seen == [] and gated.claimed == taken_over and gated.failed == {}
    assert (await get(db, task)).status is TaskStatus.RUNNING


async def test_a_change_releases_only_the_holds_of_its_gate(db: Database) -> None:
    a = await submit(db, await _rack(db, "r1"), POWER_ON)
    b = await submit(db, await _rack(db, "r2"), POWER_ON)
    gates: list[Gate] = [Probe("freeze", ["hold"]), Probe("budget", ["hold"])]
    owner = uuid.uuid4()
    async with db.transaction() as conn:
        await consult(gates, conn, await _claim(db, conn, owner), owner_id=owner, now=CLOCK.now())
    async with db.transaction() as conn:
        await task_runs.release_held(conn, "freeze")
    released, kept = await get(db, a), await get(db, b)
    assert (released.held_by, released.not_before) == ("freeze", None)  # claimable, and gated again
    assert kept.held_by == "budget" and kept.not_before is not None


async def test_a_task_waiting_for_its_window_is_held_by_it_until_it_starts(db: Database) -> None:
    rack = await make_rack(db, computes=1)
    opens = datetime.now(UTC) + timedelta(hours=1)
    ends = opens + timedelta(hours=2)
    operation = Operation(
        OperationKind.UPGRADE_FIRMWARE, target_version="3", window_start=opens, window_end=ends
    )
    task = await submit(db, rack, operation)
    assert (task.held_by, task.not_before, task.not_after) == (WINDOW_HOLD, opens, ends)
    assert task.held_reason == task.message and task.message.startswith("waits for its maintenance window")
    assert task.operation == operation  # its window stays its parameter
    owner = uuid.uuid4()
    async with db.transaction() as conn:
        assert await _claim(db, conn, owner) == []  # not before the opening
        claimed = await task_runs.claim(
            db, conn, owner_id=owner, lease_ttl=timedelta(seconds=15), running_here=(), now=opens, limit=9
        )
        gated = await consult([], conn, claimed, owner_id=owner, now=opens)
    ((started, _),) = gated.claimed
    assert (started.held_by, started.not_before, started.not_after) == (None, None, ends)
    stored = await get(db, task)
    assert (stored.status, stored.held_by, stored.not_before, stored.not_after) == (
        TaskStatus.RUNNING,
        None,
        None,
        ends,
    )
