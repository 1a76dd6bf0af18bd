"""The executor: runs tasks in every rackflow process, and makes sure none is lost with a process.

Design note, why a task runs to an end exactly once at a time and never stays RUNNING forever:

* Claim. One transaction locks PENDING tasks (`FOR UPDATE SKIP LOCKED` on PostgreSQL, SQLite's single
  writer otherwise) and marks them RUNNING with this instance as `owner_id`, so no two instances take one.
* Lease. The instance's heartbeat row (`store/instances.py`), renewed every `lease_ttl / 3` and compared on
  the database clock, is the lease on every task it owns. A RUNNING task whose owner's heartbeat is older
  than `lease_ttl`, or gone, is claimed by any instance (takeover, one more attempt). Steps are idempotent,
  so repeating the ones a dead owner may have done is safe; after `MAX_ATTEMPTS` the task fails instead.
* Fencing. Every write while running is conditional on "still RUNNING and still mine": an executor whose
  task was cancelled, or taken over while it was cut off, finds out before its next step and stops.
* Shutdown. In-flight runs are cancelled and the instance unregisters, so other instances (or this one,
  restarted) take its tasks over at once instead of after the lease.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from datetime import timedelta

from rackflow.clock import Clock
from rackflow.inventory.model import Component
from rackflow.store import instances
from rackflow.store import tasks as store
from rackflow.store.db import Database
from rackflow.store.inventory import components_by_rack
from rackflow.tasks.backends.base import DONE_VERB, STEP_VERB, Backend, StepFailed, plan
from rackflow.tasks.manager import TaskManager
from rackflow.tasks.model import OperationKind, Task, TaskStatus

log = logging.getLogger(__name__)

# A task whose runs keep ending with their process (say, a step that crashes it) fails after this many
# attempts rather than taking down every instance in turn.
MAX_ATTEMPTS = 3
MAX_RETRY_DELAY_SECONDS = 5.0

Outcome = tuple[TaskStatus, str]


class Executor:
    """Claims and runs tasks until `stop` is set. `wake()` makes it poll now (e.g. after a submit)."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        backend: Backend,
        *,
        instance_id: uuid.UUID,
        manager: TaskManager | None = None,
        poll_interval: float = 0.5,
        lease_ttl: float = instances.LEASE_TTL.total_seconds(),
        max_concurrent: int = 32,
    ) -> None:
        self.db = db
        self.clock = clock
        self.backend = backend
        self.instance_id = instance_id
        self.manager = manager or TaskManager(db, clock)
        self.manager.on_submit.append(self.wake)
        self.poll_interval = poll_interval
        self.lease_ttl = timedelta(seconds=lease_ttl)
        self.max_concurrent = max_concurrent
        self._wake = asyncio.Event()
        self._running: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._next_hold_check = 0.0

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        await self._register(stop)
        lease = asyncio.create_task(self._keep_lease(stop), name="executor lease")
        try:
            while not stop.is_set():
                try:
                    await self.poll()
                except Exception:  # an outage or a bug: report it and try again next poll
                    log.exception("executor poll failed")
                await self._nap(stop)
        finally:
            lease.cancel()
            runs = list(self._running.values())
            for run in runs:
                run.cancel()
            await asyncio.gather(lease, *runs, return_exceptions=True)
            try:
                await instances.unregister(self.db, self.instance_id)
            except Exception:
                log.warning("could not unregister instance %s; its lease will expire", self.instance_id)

    async def poll(self) -> None:
        """One round: housekeeping (promotion, expiry, dead holds), then claim what there is room for."""
        now = asyncio.get_running_loop().time()
        dead_holds = now >= self._next_hold_check
        if dead_holds:
            self._next_hold_check = now + self.lease_ttl.total_seconds()
        await self.manager.sweep(lease_ttl=self.lease_ttl, dead_holds=dead_holds)
        room = self.max_concurrent - len(self._running)
        if room <= 0:
            return
        for task, attempt in await self._claim(room):
            self._running[task.id] = asyncio.create_task(self._run(task, attempt), name=f"task {task.id}")

    # --- claiming and the lease ------------------------------------------------------------------

    async def _claim(self, room: int) -> list[tuple[Task, int]]:
        async with self.db.transaction() as conn:
            stale_before = await self.db.now(conn) - self.lease_ttl
            now = self.clock.now()
            candidates = await store.claimable(
                self.db, conn, owner_id=self.instance_id, stale_before=stale_before,
                running_here=self._running, now=now, limit=room,
            )
            for task, _ in candidates:
                await store.mark_running(conn, task, owner_id=self.instance_id, now=now)
        for task, attempts in candidates:
            if task.status is TaskStatus.RUNNING:
                log.info("task %s: taking over (attempt %d)", task.id, attempts + 1)
        return [(task, attempts + 1) for task, attempts in candidates]

    async def _register(self, stop: asyncio.Event) -> None:
        while True:
            try:
                await instances.register(
                    self.db, self.instance_id, host=socket.gethostname(), pid=os.getpid()
                )
                return
            except Exception:
                log.exception("cannot register instance %s; retrying", self.instance_id)
                if await _sleep(stop, self.poll_interval):
                    return

    async def _keep_lease(self, stop: asyncio.Event) -> None:
        while not await _sleep(stop, self.lease_ttl.total_seconds() / 3):
            try:
                if not await instances.heartbeat(self.db, self.instance_id):
                    log.warning("instance %s was unregistered; registering again", self.instance_id)
                    await self._register(stop)
            except Exception:
                log.warning("heartbeat of instance %s failed", self.instance_id, exc_info=True)

    async def _nap(self, stop: asyncio.Event) -> None:
        waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waiters, timeout=self.poll_interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        self._wake.clear()

    # --- running one task ------------------------------------------------------------------------

    async def _run(self, task: Task, attempt: int) -> None:
        try:
            outcome = await self._execute(task, attempt)
            if outcome is None:
                await self._retrying(task, lambda: self.manager.release(task.id, owner_id=self.instance_id))
                log.info("task %s: stopped (cancelled or taken over)", task.id)
            else:
                status, message = outcome
                await self._retrying(task, lambda: self.manager.finish(
                    task.id, owner_id=self.instance_id, status=status, message=message
                ))
                log.info("task %s: %s: %s", task.id, status.value, message)
        except Exception:  # it stays RUNNING and mine, so the next poll picks it up again
            log.exception("task %s: run interrupted; it will be run again", task.id)
        finally:
            self._running.pop(task.id, None)
            self.wake()

    async def _execute(self, task: Task, attempt: int) -> Outcome | None:
        """Run the steps; the outcome to record, or None when the task stopped being ours."""
        refusal = self._refusal(task, attempt)
        if refusal is not None:
            return TaskStatus.FAILED, refusal
        kind = task.operation.kind
        steps = plan(kind, await self._components(task))
        width = max(1, int(getattr(self.backend, "step_concurrency", 1)))
        for batch in step_batches(steps, width):
            numbers = f"{batch[0][0]}" if len(batch) == 1 else f"{batch[0][0]}-{batch[-1][0]}"
            names = ", ".join(component.name for _, component in batch)
            if not await self._progress(task, f"{STEP_VERB[kind]} {numbers}/{len(steps)}: {names}"):
                return None
            outcomes = await asyncio.gather(*(self._step(task, c, n, len(steps)) for n, c in batch))
            failures = [failure for failure in outcomes if failure is not None]
            if failures:
                return TaskStatus.FAILED, "; ".join(failures)
        return TaskStatus.COMPLETED, _done(task, len(steps))

    async def _step(self, task: Task, component: Component, number: int, total: int) -> str | None:
        """Run one step; why it failed, or None when it succeeded."""
        try:
            await self.backend.run_step(task, component)
        except StepFailed as exc:
            return f"{_failed(task, component, number, total)}: {exc}"
        except Exception as exc:  # a backend bug must fail the task, not the executor
            log.exception("task %s: step on %s raised", task.id, component.name)
            return f"{_failed(task, component, number, total)}: unexpected error: {exc!r}"
        return None

    def _refusal(self, task: Task, attempt: int) -> str | None:
        """Why the task must fail without running, if it must."""
        if attempt > MAX_ATTEMPTS:
            return f"gave up after {MAX_ATTEMPTS} attempts, each cut short with its rackflow instance"
        window_end = task.operation.window_end
        if window_end is not None and self.clock.now() > window_end:
            return f"the maintenance window ended at {window_end.isoformat()} before the task could run"
        return None

    async def _components(self, task: Task) -> list[Component]:
        """The task's components that still exist (one removed meanwhile is skipped)."""
        wanted = set(task.component_ids)
        async with self.db.read() as conn:
            rack_components = (await components_by_rack(conn, [task.rack_id]))[task.rack_id]
        return [c for c in rack_components if c.id in wanted]

    async def _progress(self, task: Task, message: str) -> bool:
        async with self.db.transaction() as conn:
            return await store.record_progress(
                conn, task.id, owner_id=self.instance_id, message=message, now=self.clock.now()
            )

    async def _retrying(self, task: Task, write: Callable[[], Awaitable[object]]) -> None:
        """Retry a final write through an outage; the run only counts as over once it is recorded."""
        delay = 0.1
        while True:
            try:
                await write()
                return
            except Exception:
                log.warning("task %s: recording the outcome failed; retrying", task.id, exc_info=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY_SECONDS)


def step_batches(steps: Sequence[Component], width: int) -> list[list[tuple[int, Component]]]:
    """The planned steps (numbered from 1) in batches run together: at most `width` consecutive steps of
    one component type. The order between types stays strict: a batch starts when the one before ended.

    A backend opts in with a `step_concurrency` attribute (the redfish backend: RACKFLOW_REDFISH_CONCURRENCY);
    without it every batch holds one step, so steps run one by one.
    """
    batches: list[list[tuple[int, Component]]] = []
    for number, component in enumerate(steps, 1):
        last = batches[-1] if batches else None
        if last is not None and len(last) < width and last[-1][1].type is component.type:
            last.append((number, component))
        else:
            batches.append([(number, component)])
    return batches


def _failed(task: Task, component: Component, number: int, total: int) -> str:
    return f"{task.operation.kind.value} failed on {component.name} ({number}/{total})"


def _done(task: Task, count: int) -> str:
    kind = task.operation.kind
    text = f"{DONE_VERB[kind]} {count} component{'' if count == 1 else 's'}"
    if kind is OperationKind.UPGRADE_FIRMWARE:
        text += f" to {task.operation.target_version}"
    return text


async def _sleep(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep unless `stop` is set first; True when stopping."""
    with suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    return stop.is_set()
