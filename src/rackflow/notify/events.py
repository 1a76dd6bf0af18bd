"""The events each write site records, built here so that a site adds one line:
`await outbox.record_events(conn, events.<kind>(…))` in the transaction that writes the change.

Each write site's constructor returns a list (often empty: the change was not one to report), names the
ids it knows, and leaves the names to `store.outbox.record_events`; the hold watcher's (`held_too_long`,
`hold_cleared`: `rackflow.notify.holds`) return one keyed event each. The principal is the RPC's caller
when there is one, else rackflow itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from rackflow.domain.approvals import expiry_text
from rackflow.domain.audit import SYSTEM_PRINCIPAL
from rackflow.domain.notifications import SEVERITY, Event, EventType
from rackflow.domain.rollouts import Phase, ScopeView
from rackflow.domain.schedules import Pause, Run, Schedule
from rackflow.domain.tasks import TaskStatus
from rackflow.ids import new_id
from rackflow.security import caller_name
from rackflow.timespec.duration import format_go_duration

if TYPE_CHECKING:
    from rackflow.domain.firing import Firing, RunResult
    from rackflow.domain.tasks import Ending
    from rackflow.store.outbox import Held

# How many per-rack errors a run's event quotes in its reason (the run's page has them all).
ERRORS_QUOTED = 3


def _event(kind: EventType, at: datetime, summary: str, **fields: object) -> Event:
    return Event(
        type=kind,
        severity=SEVERITY[kind],
        at=at,
        summary=summary,
        principal=caller_name() or SYSTEM_PRINCIPAL,
        **fields,  # type: ignore[arg-type]
    )


def _quoted(errors: Sequence[str]) -> str:
    more = f" (+{len(errors) - ERRORS_QUOTED} more)" if len(errors) > ERRORS_QUOTED else ""
    return "; ".join(errors[:ERRORS_QUOTED]) + more


def runs_with_failures(firings: Sequence[Firing], results: Sequence[RunResult], at: datetime) -> list[Event]:
    """A plain firing's run recorded as completed with scopes that could not be submitted."""
    found = []
    for firing, result in zip(firings, results, strict=True):
        failed = [o for o in result.outcomes if o.outcome == "failed"]
        if not failed:
            continue
        found.append(
            _event(
                EventType.RUN_COMPLETED_WITH_FAILURES,
                at,
                f"schedule {firing.schedule.name}: {len(failed)} of {len(result.outcomes)} rack(s) failed",
                reason=_quoted([o.error for o in failed]),
                schedule_id=firing.schedule.id,
                run_id=result.run_id,
                rack_id=failed[0].rack_id if len(failed) == 1 else None,
                payload={"failed": len(failed), "scopes": len(result.outcomes)},
            )
        )
    return found


def runs_missed(firings: Sequence[Firing], at: datetime) -> list[Event]:
    """Dispatched firings recorded as missed (past their start deadline): nothing was submitted."""
    return [
        _event(
            EventType.RUN_MISSED,
            at,
            f"schedule {f.schedule.name}: run missed",
            reason=f.missed_reason,
            schedule_id=f.schedule.id,
            run_id=f.run_id,
            payload={
                "scheduled_for": f.scheduled_for.isoformat() if f.scheduled_for else None,
                "late_by_us": f.late_by // timedelta(microseconds=1) if f.late_by is not None else None,
            },
        )
        for f in firings
    ]


def paused_after_failures(
    schedule: Schedule, reason: str, newest_run: uuid.UUID, at: datetime
) -> list[Event]:
    """rackflow paused the schedule after `pause_after_failed_runs` consecutive failing runs."""
    return [
        _event(
            EventType.SCHEDULE_PAUSED,
            at,
            "schedule paused after consecutive failing runs",
            reason=reason,
            schedule_id=schedule.id,
            run_id=newest_run,
        )
    ]


def rollout_halted(run: Run, reason: str, paused: bool, at: datetime) -> list[Event]:
    """A rollout halted, and (`paused`) its schedule paused by the halt."""
    halted = _event(
        EventType.RUN_HALTED,
        at,
        "rollout halted",
        reason=reason,
        schedule_id=run.schedule_id,
        run_id=run.id,
    )
    if not paused:
        return [halted]
    return [halted, _paused_by(run.schedule_id, run.id, "schedule paused by its rollout's halt", reason, at)]


def rollout_cancelled(run: Run, why: str, paused: bool, at: datetime) -> list[Event]:
    """rackflow cancelled a rollout (`run`, as cancelled) that still had racks to start at its firmware
    window's end (`why`), and (`paused`) paused its schedule for it."""
    cancelled = _event(
        EventType.RUN_CANCELLED,
        at,
        "rollout cancelled at its firmware window's end",
        reason=run.reason,
        schedule_id=run.schedule_id,
        run_id=run.id,
    )
    if not paused:
        return [cancelled]
    summary = "schedule paused by its rollout's cancel at its firmware window's end"
    return [cancelled, _paused_by(run.schedule_id, run.id, summary, why, at)]


def paused_over_limit(run: Run, reason: str, at: datetime) -> list[Event]:
    """A rollout done over its failure limit (every rack had begun: nothing to halt) paused its schedule."""
    summary = "schedule paused: its rollout completed over its failure limit"
    return [_paused_by(run.schedule_id, run.id, summary, reason, at)]


def paused_window_ended(firings: Sequence[Firing], at: datetime) -> list[Event]:
    """Dispatched firings past their operation's window (a firmware upgrade's end_time) paused their
    schedules: they submitted nothing, and nothing later could start either."""
    summary = "schedule paused: its firmware window ended"
    return [_paused_by(f.schedule.id, f.run_id, summary, f.skipped, at) for f in firings]


def _paused_by(schedule_id: uuid.UUID, run_id: uuid.UUID, summary: str, reason: str, at: datetime) -> Event:
    """rackflow paused the schedule because of run `run_id` (its rollout, or its firing)."""
    return _event(
        EventType.SCHEDULE_PAUSED, at, summary, reason=reason, schedule_id=schedule_id, run_id=run_id
    )


def rollout_finished(run: Run, views: Iterable[ScopeView], at: datetime) -> list[Event]:
    """A rollout completed: how many racks succeeded, failed and were skipped."""
    phases = [v.phase for v in views]
    counts = {p.value: phases.count(p) for p in (Phase.SUCCEEDED, Phase.FAILED, Phase.SKIPPED)}
    summary = "rollout finished: " + ", ".join(f"{n} {phase}" for phase, n in counts.items())
    return [
        _event(
            EventType.ROLLOUT_FINISHED,
            at,
            summary,
            schedule_id=run.schedule_id,
            run_id=run.id,
            payload=counts,
        )
    ]


def halt_cleared(
    run: Run, how: Literal["resumed", "cancelled"], at: datetime, *, ended: int = 0, left: int = 0
) -> list[Event]:
    """A halted rollout was resumed or cancelled: its halt alert resolves (`run` as it was: cancelling a
    rolling one clears nothing). `ended`: the tasks of it that had not begun, which a cancel ended; `left`:
    those it left to the start gate of the executor claiming them at that moment (which ends them)."""
    if run.state != "halted":
        return []
    counts = (
        f"{ended} task(s) that had not begun ended" if ended else "",
        f"{left} task(s) an executor was claiming left to its start gate" if left else "",
    )
    return [
        _event(
            EventType.RUN_HALT_CLEARED,
            at,
            "; ".join(part for part in (f"halted rollout {how}", *counts) if part),
            reason=run.reason,
            schedule_id=run.schedule_id,
            run_id=run.id,
        )
    ]


def tasks_failed(endings: Iterable[Ending], ended: Collection[uuid.UUID], at: datetime) -> list[Event]:
    """The tasks an executor's round ended as FAILED (a final status: a failed task is not tried again).
    `ended` are the endings the round recorded (the others were cancelled or taken over meanwhile)."""
    return [
        _event(
            EventType.TASK_FAILED,
            at,
            "task failed",
            reason=ending.outcome[1],
            task_id=ending.task_id,
            rack_id=ending.rack_id,
        )
        for ending in endings
        if ending.outcome is not None and ending.outcome[0] is TaskStatus.FAILED and ending.task_id in ended
    ]


def runs_awaiting_approval(firings: Iterable[Firing], at: datetime) -> list[Event]:
    """Firings recorded awaiting approval: someone must approve or reject each before it expires."""
    return [
        _event(
            EventType.RUN_AWAITING_APPROVAL,
            at,
            f"schedule {f.schedule.name}: run awaits approval",
            reason=f"needs {f.approval.min_approvers} approver(s) by {expiry_text(f.approval)}",
            schedule_id=f.schedule.id,
            run_id=f.run_id,
        )
        for f in firings
        if f.approval is not None
    ]


_DECIDED = {
    "approved": EventType.RUN_APPROVED,
    "rejected": EventType.RUN_REJECTED,
    "expired": EventType.RUN_EXPIRED,
}


def approval_decided(
    run: Run, decision: Literal["approved", "rejected", "expired"], reason: str, at: datetime
) -> list[Event]:
    """A run that awaited approval was approved (it starts), rejected, or expired: the condition ends."""
    kind = _DECIDED[decision]
    return [
        _event(
            kind,
            at,
            f"run {kind.value.removeprefix('run.')}",
            reason=reason,
            schedule_id=run.schedule_id,
            run_id=run.id,
        )
    ]


def pauses_ended(resumed: Iterable[tuple[Schedule, Pause]], at: datetime) -> list[Event]:
    """Schedules rackflow resumed because their pause reached its end."""
    return [
        _event(
            EventType.SCHEDULE_RESUMED,
            at,
            "schedule resumed: its pause ended",
            reason=pause.reason,
            schedule_id=schedule.id,
            payload={"paused_by": pause.by},
        )
        for schedule, pause in resumed
    ]


def kept_paused(kept: Iterable[tuple[Schedule, Pause]], at: datetime) -> list[Event]:
    """Schedules whose pause ended but which rackflow kept paused, its reason saying why: resumed, they
    could only skip their firings (their firmware window, `domain.schedules.kept_paused`)."""
    return [
        _event(
            EventType.SCHEDULE_PAUSED,
            at,
            "schedule kept paused at its pause's end: its firmware window ends first",
            reason=schedule.pause.reason if schedule.pause is not None else "",
            schedule_id=schedule.id,
            payload={"paused_by": pause.by},
        )
        for schedule, pause in kept
    ]


def held_too_long(held: Held, threshold: timedelta, at: datetime) -> Event:
    """A start gate has held a task since `held.held_since`, longer than `threshold`; keyed by the task, the
    gate and that time, so each hold is reported once, however many instances find it."""
    return _event(
        EventType.TASK_HELD_TOO_LONG,
        at,
        f"task held by {held.held_by} for more than {format_go_duration(threshold)}",
        reason=held.reason,
        task_id=held.task_id,
        rack_id=held.rack_id,
        payload={"held_by": held.held_by, "held_since": held.held_since.isoformat()},
        key=hold_key(held),
    )


def hold_key(held: Held) -> str:
    return f"{EventType.TASK_HELD_TOO_LONG.value}:{held.task_id}:{held.held_by}:{held.held_since.isoformat()}"


def hold_cleared(raised: Event, why: str, at: datetime) -> Event:
    """The hold `raised` reported ended (`why`: the task started, ended, another gate holds it): the same
    names and ids as `raised`, so Alertmanager ends that very alert even if the task is gone. Not keyed
    (a keyed event is an open condition until cleared): only the transaction that marked `raised` cleared
    writes it (`outbox.clear_condition`)."""
    return replace(
        raised,
        id=new_id(),
        type=EventType.TASK_HOLD_CLEARED,
        severity=SEVERITY[EventType.TASK_HOLD_CLEARED],
        at=at,
        summary=f"task no longer held by {raised.payload.get('held_by', 'a gate')}: {why}",
        principal=SYSTEM_PRINCIPAL,
        key="",
    )
