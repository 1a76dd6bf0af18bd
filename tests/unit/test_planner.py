"""The planner's rules (`rackflow.domain.firing`), table-driven over snapshots built in memory: no database.

The store tests prove the same firings end to end (tests/store/test_schedules_firing.py, test_firing_once,
test_windows_firing, test_rollouts*); these pin each rule alone, one row a case.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.firing import (
    LiveRollout,
    RunTally,
    Snapshot,
    advance_after_firing,
    deadline_end,
    failing_streak,
    own_or_default,
    plan,
    plan_starts,
    planned_times,
    run_id,
    scope_decisions,
    tally,
)
from rackflow.domain.rollouts import RackPlace, RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, Schedule, Scope, ScopeOutcome, Trigger
from rackflow.domain.tasks import Operation, OperationKind, TaskStatus
from rackflow.domain.windows import MaintenanceWindow, OneOff, RackRef, WindowKind, WindowPolicy
from rackflow.ids import time_of
from rackflow.timespec import ScheduleSpec, SpecType

NOW = datetime(2030, 1, 1, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)
POWER_OFF = Operation(OperationKind.POWER_OFF)
HOURLY = ScheduleSpec(SpecType.INTERVAL, "1h")


def schedule(
    *,
    overlap: OverlapPolicy = OverlapPolicy.SKIP,
    window_policy: WindowPolicy = WindowPolicy.SKIP,
    operation: Operation = POWER_OFF,
    rollout: RolloutPolicy | None = None,
    spec: ScheduleSpec = HOURLY,
    enabled: bool = True,
    deadline: timedelta | None = None,
    late: timedelta = timedelta(seconds=5),
) -> Schedule:
    return Schedule(
        id=uuid.uuid4(),
        name="nightly",
        spec=spec,
        overlap_policy=overlap,
        enabled=enabled,
        next_run_at=NOW - late,
        last_run_at=None,
        created_at=NOW - HOUR,
        updated_at=NOW - HOUR,
        operation=operation,
        queue_timeout=HOUR,
        description="",
        window_policy=window_policy,
        rollout=rollout,
        start_deadline=deadline,
    )


def scopes_of(owner: Schedule, count: int) -> tuple[Scope, ...]:
    return tuple(Scope(uuid.uuid4(), owner.id, uuid.uuid4(), None, None, NOW - HOUR) for _ in range(count))


def racks_of(scopes: tuple[Scope, ...]) -> dict[uuid.UUID, RackRef]:
    return {sc.rack_id: RackRef(sc.rack_id, None) for sc in scopes}


def closing(kind: WindowKind, start: datetime, end: datetime) -> MaintenanceWindow:
    """A window over every rack and operation."""
    return MaintenanceWindow(
        id=uuid.uuid4(),
        name=kind.value,
        reason="",
        kind=kind,
        when=OneOff(start, end),
        all_racks=True,
        racks=(),
        domains=(),
        operations=frozenset(),
        created_at=NOW - HOUR,
        updated_at=NOW - HOUR,
    )


# An ALLOW window that opens in two hours: the racks are closed now, and open from then for an hour.
ALLOW_LATER = closing(WindowKind.ALLOW, NOW + 2 * HOUR, NOW + 3 * HOUR)


@pytest.mark.parametrize(
    ("overlap", "trigger", "expected"),
    [
        (OverlapPolicy.SKIP, "dispatch", "skipped_overlap"),
        (OverlapPolicy.QUEUE, "dispatch", "submit"),  # it queues behind the active task
        (OverlapPolicy.SKIP, "manual", "submit"),  # a manual firing runs no overlap check
    ],
)
def test_a_scope_whose_last_task_is_active(overlap: OverlapPolicy, trigger: Trigger, expected: str) -> None:
    owner = schedule(overlap=overlap)
    busy, idle = scopes_of(owner, 2)
    snapshot = Snapshot((owner,), {owner.id: (busy, idle)}, busy=frozenset({busy.id}))

    (firing,) = plan(snapshot, NOW, trigger)

    got = firing.decided[busy.id].outcome if busy.id in firing.decided else "submit"
    assert got == expected
    assert idle in firing.to_submit


@pytest.mark.parametrize(
    ("operation", "policy", "expected", "opens_at", "closes_at"),
    [
        (POWER_OFF, WindowPolicy.SKIP, "skipped_window", None, None),
        (POWER_OFF, WindowPolicy.DEFER, "defer", NOW + 2 * HOUR, NOW + 3 * HOUR),
        # A firmware upgrade with a window of its own waits for the overlap of both...
        (
            Operation(OperationKind.UPGRADE_FIRMWARE, window_start=NOW + 150 * timedelta(minutes=1)),
            WindowPolicy.DEFER,
            "defer",
            NOW + 150 * timedelta(minutes=1),
            NOW + 3 * HOUR,
        ),
        (
            Operation(OperationKind.UPGRADE_FIRMWARE, window_end=NOW + 150 * timedelta(minutes=1)),
            WindowPolicy.DEFER,
            "defer",
            NOW + 2 * HOUR,
            NOW + 150 * timedelta(minutes=1),
        ),
        # ... and is skipped when they do not meet.
        (
            Operation(OperationKind.UPGRADE_FIRMWARE, window_start=NOW + 5 * HOUR),
            WindowPolicy.DEFER,
            "skipped_window",
            None,
            None,
        ),
    ],
)
def test_a_rack_the_windows_close(
    operation: Operation,
    policy: WindowPolicy,
    expected: str,
    opens_at: datetime | None,
    closes_at: datetime | None,
) -> None:
    owner = schedule(window_policy=policy, operation=operation)
    (scope,) = scopes_of(owner, 1)
    snapshot = Snapshot((owner,), {owner.id: (scope,)}, windows=(ALLOW_LATER,), racks=racks_of((scope,)))

    (firing,) = plan(snapshot, NOW, "dispatch")

    if expected == "skipped_window":
        assert firing.decided[scope.id].outcome == "skipped_window"
        assert firing.decided[scope.id].error == firing.windows[scope.id].reason != ""
        assert firing.to_submit == []
        return
    deferral = firing.deferral(scope.id)
    assert deferral is not None and (deferral.opens_at, deferral.closes_at) == (opens_at, closes_at)
    assert firing.to_submit == [scope] and firing.decided == {}


@pytest.mark.parametrize(
    ("window", "trigger", "decided"),
    [
        (None, "dispatch", False),  # no window: every rack is open
        (closing(WindowKind.ALLOW, NOW - HOUR, NOW + HOUR), "dispatch", False),  # inside its ALLOW window
        (closing(WindowKind.FREEZE, NOW - HOUR, NOW + HOUR), "dispatch", True),  # inside a freeze
        (ALLOW_LATER, "manual", False),  # a manual firing obeys no ALLOW window
        (closing(WindowKind.FREEZE, NOW - HOUR, NOW + HOUR), "manual", False),  # (the freeze gate holds it)
    ],
)
def test_which_firings_the_windows_decide(
    window: MaintenanceWindow | None, trigger: Trigger, decided: bool
) -> None:
    owner = schedule()
    (scope,) = scopes_of(owner, 1)
    windows = (window,) if window is not None else ()
    snapshot = Snapshot((owner,), {owner.id: (scope,)}, windows=windows, racks=racks_of((scope,)))

    (firing,) = plan(snapshot, NOW, trigger)

    assert (scope.id in firing.decided) is decided


def test_a_deleted_rack_is_left_to_the_task_manager() -> None:
    owner = schedule()
    (scope,) = scopes_of(owner, 1)
    snapshot = Snapshot((owner,), {owner.id: (scope,)}, windows=(ALLOW_LATER,), racks={})

    (firing,) = plan(snapshot, NOW, "dispatch")

    assert firing.to_submit == [scope] and firing.windows == {}


def test_a_manual_firing_has_no_slot_and_decides_nothing() -> None:
    owner = schedule()
    busy, closed = scopes_of(owner, 2)
    snapshot = Snapshot(
        (owner,),
        {owner.id: (busy, closed)},
        busy=frozenset({busy.id}),
        windows=(ALLOW_LATER,),
        racks=racks_of((busy, closed)),
    )

    (manual,) = plan(snapshot, NOW, "manual")
    (dispatched,) = plan(snapshot, NOW, "dispatch")

    assert (manual.scheduled_for, manual.decided, manual.windows) == (None, {}, {})
    assert manual.to_submit == [busy, closed]
    assert dispatched.scheduled_for == owner.next_run_at
    assert {o.outcome for o in dispatched.decided.values()} == {"skipped_overlap", "skipped_window"}


def test_a_dispatched_run_is_named_by_its_slot_and_a_manual_one_by_now() -> None:
    """A dispatched run's id is minted at its slot's millisecond, so on PostgreSQL it names the partition
    its run is in (`store.run_partitions.of_runs`); a manual run has no slot, and its id is made now."""
    owner = replace(schedule(), next_run_at=NOW - timedelta(minutes=3, microseconds=1_500))
    snapshot = Snapshot((owner,), {owner.id: scopes_of(owner, 1)})
    before = datetime.now(UTC)
    (dispatched,) = plan(snapshot, NOW, "dispatch")
    (manual,) = plan(snapshot, NOW, "manual")
    late = replace(snapshot, schedules=(replace(owner, start_deadline=HOUR / 60),))
    (missed,) = plan(late, NOW, "dispatch")

    assert dispatched.run_id.version == manual.run_id.version == 7
    assert time_of(dispatched.run_id) == NOW - timedelta(minutes=3, milliseconds=2)  # the slot's millisecond
    assert time_of(missed.run_id) == time_of(dispatched.run_id) and missed.missed
    manual_at = time_of(manual.run_id)
    assert manual_at is not None and before - timedelta(milliseconds=1) <= manual_at <= datetime.now(UTC)
    assert len({dispatched.run_id, missed.run_id, run_id(owner.next_run_at)}) == 3  # random bits apart


def test_a_slot_before_1970_names_its_run_by_now() -> None:
    """A version 7 id holds no time before 1970: such a slot's run (in the DEFAULT partition, which every
    bounded statement reads) is named as a manual one is."""
    made = run_id(datetime(1969, 12, 31, 23, 59, tzinfo=UTC))
    at = time_of(made)
    assert made.version == 7 and at is not None and at.year >= 2026


@pytest.mark.parametrize(
    ("canaries", "busy_name", "expected"),
    [
        (0, None, [("a", "pending", False), ("b", "pending", False), ("c", "pending", False)]),
        (2, None, [("a", "pending", True), ("b", "pending", True), ("c", "pending", False)]),
        # A settled scope keeps its place in the order and its outcome, and is no canary.
        (2, "a", [("a", "skipped_overlap", False), ("b", "pending", True), ("c", "pending", True)]),
        (5, "b", [("a", "pending", True), ("b", "skipped_overlap", False), ("c", "pending", True)]),
    ],
)
def test_a_rollout_orders_its_scopes_by_rack_name_canaries_first(
    canaries: int, busy_name: str | None, expected: list[tuple[str, str, bool]]
) -> None:
    owner = schedule(rollout=RolloutPolicy(canary_racks=canaries))
    scopes = scopes_of(owner, 3)
    names = dict(zip((sc.rack_id for sc in scopes), ("c", "a", "b"), strict=True))
    busy = frozenset(sc.id for sc in scopes if names[sc.rack_id] == busy_name)
    places = {rack_id: RackPlace(name, None) for rack_id, name in names.items()}
    snapshot = Snapshot((owner,), {owner.id: scopes}, busy=busy, places=places)

    (firing,) = plan(snapshot, NOW, "dispatch")

    got = [(names[o.rack_id], o.outcome, o.canary) for o in firing.rollout_outcomes]
    assert got == expected
    assert not firing.skipped


def test_a_rollout_skipped_beside_a_rolling_one_is_not_told_to_resume_it() -> None:
    """A rolling run cannot be resumed (`run resume` refuses all but a halted one): the reason says what
    an operator can do, wait for it or cancel it."""
    owner = schedule(rollout=RolloutPolicy(max_concurrent_racks=1))
    live = LiveRollout(uuid.uuid4(), "rolling")
    snapshot = Snapshot((owner,), {owner.id: scopes_of(owner, 2)}, live_rollouts={owner.id: live})

    (firing,) = plan(snapshot, NOW, "manual")

    assert firing.skipped == (
        f"the schedule's previous rollout (run {live.run_id}) is still rolling "
        "(let it finish or cancel it first)"
    )


@pytest.mark.parametrize(("trigger", "refused"), [("dispatch", False), ("manual", True)])
def test_a_rollout_whose_previous_one_is_live_is_skipped(trigger: Trigger, refused: bool) -> None:
    owner = schedule(rollout=RolloutPolicy(max_concurrent_racks=1))
    scopes = scopes_of(owner, 2)
    live = LiveRollout(uuid.uuid4(), "halted")
    snapshot = Snapshot((owner,), {owner.id: scopes}, live_rollouts={owner.id: live})

    (firing,) = plan(snapshot, NOW, trigger)

    assert firing.skipped == (
        f"the schedule's previous rollout (run {live.run_id}) is still halted (resume or cancel it first)"
    )
    assert firing.refused is refused
    assert firing.rollout_outcomes == ()
    # The slot is spent all the same: the schedule still advances.
    assert firing.next_run_at == NOW + HOUR


@pytest.mark.parametrize(
    ("spec", "enabled", "expected"),
    [
        (ScheduleSpec(SpecType.INTERVAL, "90m"), True, (True, NOW + timedelta(minutes=90))),
        (ScheduleSpec(SpecType.CRON, "0 2 * * *"), True, (True, datetime(2030, 1, 2, 2, tzinfo=UTC))),
        (
            ScheduleSpec(SpecType.CRON, "0 2 * * *", "Europe/Berlin"),
            True,
            (True, datetime(2030, 1, 2, 1, tzinfo=UTC)),
        ),
        (ScheduleSpec(SpecType.ONE_TIME, "2030-01-01T11:59:55Z"), True, (False, None)),  # consumed
        (ScheduleSpec(SpecType.INTERVAL, "1h"), False, (False, NOW + HOUR)),  # fired by hand, stays paused
    ],
)
def test_the_next_time_after_a_firing(
    spec: ScheduleSpec, enabled: bool, expected: tuple[bool, datetime | None]
) -> None:
    owner = schedule(spec=spec, enabled=enabled)
    assert advance_after_firing(owner, NOW) == expected
    (firing,) = plan(Snapshot((owner,), {owner.id: ()}), NOW, "manual" if not enabled else "dispatch")
    assert (firing.enabled, firing.next_run_at) == expected


def test_planned_times_are_the_times_the_planner_advances_to() -> None:
    owner = replace(schedule(spec=ScheduleSpec(SpecType.INTERVAL, "1h")), next_run_at=NOW + HOUR)
    times = planned_times(owner, None, NOW, 3)
    assert times == [NOW + HOUR, NOW + 2 * HOUR, NOW + 3 * HOUR]
    assert advance_after_firing(owner, times[0])[1] == times[1]


def test_the_preview_shows_the_overlap_skip_and_the_windows() -> None:
    owner = schedule(window_policy=WindowPolicy.DEFER)
    busy, closed = scopes_of(owner, 2)
    snapshot = Snapshot(
        (owner,),
        {owner.id: (busy, closed)},
        busy=frozenset({busy.id}),
        windows=(ALLOW_LATER,),
        racks=racks_of((busy, closed)),
    )

    (firing,) = plan(snapshot, NOW, "dispatch")
    decisions = scope_decisions(firing)

    assert decisions[busy.id].action == "skip_overlap"
    assert decisions[closed.id].action == "defer"
    (later,) = plan(snapshot, NOW + 2 * HOUR, "dispatch")  # the window is open by then
    assert scope_decisions(later)[closed.id].action == "fire"


def _run_outcomes(scopes: tuple[Scope, ...]) -> tuple[ScopeOutcome, ...]:
    return tuple(ScopeOutcome(sc.id, sc.rack_id, "pending") for sc in scopes)


@pytest.mark.parametrize(
    ("trigger", "policy", "window", "expected"),
    [
        ("dispatch", WindowPolicy.SKIP, None, "submit"),
        ("dispatch", WindowPolicy.SKIP, ALLOW_LATER, "skipped_window"),
        ("dispatch", WindowPolicy.DEFER, ALLOW_LATER, "defer"),
        ("manual", WindowPolicy.SKIP, ALLOW_LATER, "submit"),  # a manual rollout obeys no ALLOW window
    ],
)
def test_a_rollout_step_starts_its_scopes_as_the_windows_allow(
    trigger: Trigger, policy: WindowPolicy, window: MaintenanceWindow | None, expected: str
) -> None:
    owner = schedule(window_policy=policy, rollout=RolloutPolicy(max_concurrent_racks=2))
    present, removed = scopes_of(owner, 2)
    windows = (window,) if window is not None else ()
    snapshot = Snapshot((owner,), {owner.id: (present,)}, windows=windows, racks=racks_of((present,)))

    starts = plan_starts(snapshot, _run_outcomes((present, removed)), [present.id, removed.id], trigger, NOW)

    assert starts.settled[removed.id].outcome == "not_started"
    assert starts.settled[removed.id].error == "removed from the schedule's scope"
    if expected == "skipped_window":
        assert starts.settled[present.id].outcome == "skipped_window"
        assert starts.submit == ()
        return
    ((scope, deferral),) = starts.submit
    assert scope == present and present.id not in starts.settled
    assert (deferral is not None and deferral.opens_at == NOW + 2 * HOUR) is (expected == "defer")


def test_a_batch_is_planned_schedule_by_schedule() -> None:
    """One snapshot, many schedules: each gets its own run, its own scopes and its own decisions."""
    skip, queue = schedule(overlap=OverlapPolicy.SKIP), schedule(overlap=OverlapPolicy.QUEUE)
    (a,), (b,) = scopes_of(skip, 1), scopes_of(queue, 1)
    snapshot = Snapshot((skip, queue), {skip.id: (a,), queue.id: (b,)}, busy=frozenset({a.id, b.id}))

    first, second = plan(snapshot, NOW, "dispatch")

    assert first.run_id != second.run_id
    assert (first.schedule, first.to_submit, second.schedule, second.to_submit) == (skip, [], queue, [b])


MINUTE = timedelta(minutes=1)


@pytest.mark.parametrize(
    ("own", "default", "late", "trigger", "missed"),
    [
        (None, None, 10 * HOUR, "dispatch", False),  # unset: however late, as the seeds do
        (15 * MINUTE, None, 16 * MINUTE, "dispatch", True),
        (15 * MINUTE, None, 15 * MINUTE, "dispatch", False),  # exactly at the deadline still fires
        (15 * MINUTE, None, 14 * MINUTE, "dispatch", False),
        (None, 15 * MINUTE, 16 * MINUTE, "dispatch", True),  # the server's default
        (HOUR, 15 * MINUTE, 16 * MINUTE, "dispatch", False),  # ... which the schedule's own overrides
        (timedelta(0), 15 * MINUTE, 16 * MINUTE, "dispatch", False),  # own zero: no deadline at all
        (15 * MINUTE, None, 10 * HOUR, "manual", False),  # a manual trigger is never missed
    ],
)
def test_the_start_deadline(
    own: timedelta | None, default: timedelta | None, late: timedelta, trigger: Trigger, missed: bool
) -> None:
    owner = schedule(deadline=own, late=late)
    scopes = scopes_of(owner, 2)
    snapshot = Snapshot((owner,), {owner.id: scopes})

    (firing,) = plan(snapshot, NOW, trigger, default_start_deadline=default)

    assert firing.missed is missed
    assert firing.enabled and firing.next_run_at == NOW + HOUR  # advanced as any firing
    if missed:
        assert firing.late_by == late
        assert firing.to_submit == []
        assert {o.outcome for o in firing.decided.values()} == {"missed"}
        assert "past its start deadline of" in firing.missed_reason
        assert scope_decisions(firing)[scopes[0].id].action == "missed"
    else:
        assert len(firing.to_submit) == 2


def test_a_missed_rollout_is_missed_not_skipped() -> None:
    owner = schedule(deadline=MINUTE, late=HOUR, rollout=RolloutPolicy(max_concurrent_racks=1))
    scopes = scopes_of(owner, 1)
    live = {owner.id: LiveRollout(uuid.uuid4(), "halted")}
    snapshot = Snapshot((owner,), {owner.id: scopes}, live_rollouts=live)

    (firing,) = plan(snapshot, NOW, "dispatch")

    assert firing.missed and not firing.skipped and firing.rollout_outcomes == ()


# The firing's slot is 5 s ago; ALLOW_LATER opens the racks in two hours, for an hour.
@pytest.mark.parametrize(
    ("deadline", "expected", "closes_at", "run_missed"),
    [
        (None, "defer", NOW + 3 * HOUR, False),  # no deadline: waits for the opening, as before
        (4 * HOUR, "defer", NOW + 3 * HOUR, False),  # the opening ends before the deadline
        (150 * MINUTE, "defer", NOW - timedelta(seconds=5) + 150 * MINUTE, False),  # capped at it
        (HOUR, "missed", None, True),  # opens after the deadline: nothing could start in time
        (2 * HOUR + timedelta(seconds=5), "missed", None, True),  # opening exactly at the deadline
    ],
)
def test_a_deferral_past_the_start_deadline(
    deadline: timedelta | None, expected: str, closes_at: datetime | None, run_missed: bool
) -> None:
    owner = schedule(window_policy=WindowPolicy.DEFER, deadline=deadline)
    scopes = scopes_of(owner, 2)
    snapshot = Snapshot((owner,), {owner.id: scopes}, windows=(ALLOW_LATER,), racks=racks_of(scopes))

    (firing,) = plan(snapshot, NOW, "dispatch")

    decision = scope_decisions(firing)[scopes[0].id]
    assert decision.action == expected
    assert decision.closes_at == closes_at
    assert firing.missed is run_missed
    if run_missed:
        assert firing.late_by == 2 * HOUR + timedelta(seconds=5)  # as late as its earliest opening
        assert "comes after the start deadline" in firing.decided[scopes[0].id].error


def test_a_deferral_past_the_deadline_misses_only_its_scope_when_others_fire() -> None:
    owner = schedule(window_policy=WindowPolicy.DEFER, deadline=HOUR)
    closed, open_ = scopes_of(owner, 2)
    window = replace(ALLOW_LATER, all_racks=False, racks=((closed.rack_id, "r1"),))
    snapshot = Snapshot(
        (owner,), {owner.id: (closed, open_)}, windows=(window,), racks=racks_of((closed, open_))
    )

    (firing,) = plan(snapshot, NOW, "dispatch")

    assert not firing.missed
    assert firing.decided[closed.id].outcome == "missed"
    assert firing.to_submit == [open_]


# A rollout of four scopes, fired 5 s after its slot with a deadline of an hour: its first wave, the
# scopes it starts as it fires, carry the deadline for its step; the later waves do not.
@pytest.mark.parametrize(
    ("policy", "deadline", "approval", "bound"),
    [
        (RolloutPolicy(max_concurrent_racks=2), HOUR, False, 2),
        (RolloutPolicy(canary_racks=1, max_concurrent_racks=2), HOUR, False, 1),  # the canary alone
        (RolloutPolicy(), HOUR, False, 4),  # no cap: every scope starts as it fires
        (RolloutPolicy(max_concurrent_racks=2), None, False, 0),  # no deadline
        (RolloutPolicy(max_concurrent_racks=2), HOUR, True, 2),  # awaiting approval: bound once approved
    ],
)
def test_a_rollouts_first_wave_carries_the_start_deadline(
    policy: RolloutPolicy, deadline: timedelta | None, approval: bool, bound: int
) -> None:
    owner = replace(
        schedule(rollout=policy, deadline=deadline),
        approval=ApprovalPolicy(HOUR) if approval else None,
    )
    scopes = scopes_of(owner, 4)
    places = {sc.rack_id: RackPlace(f"r{i}", None) for i, sc in enumerate(scopes)}

    (firing,) = plan(Snapshot((owner,), {owner.id: scopes}, places=places), NOW, "dispatch")

    deadline_at = NOW - timedelta(seconds=5) + HOUR
    assert [o.start_by for o in firing.rollout_outcomes] == [deadline_at] * bound + [None] * (4 - bound)


# ALLOW_LATER opens in two hours, for an hour: a first wave's scope (its outcome's `start_by`) deferred to
# it must start by the deadline, or is missed when it opens at or after it; a later wave's is not bound.
@pytest.mark.parametrize(
    ("start_by", "outcome", "closes_at"),
    [
        (None, "defer", NOW + 3 * HOUR),
        (NOW + 150 * MINUTE, "defer", NOW + 150 * MINUTE),
        (NOW + 4 * HOUR, "defer", NOW + 3 * HOUR),  # the opening ends first
        (NOW + 2 * HOUR, "missed", None),
    ],
)
def test_a_rollout_step_binds_its_first_waves_deferrals_by_the_start_deadline(
    start_by: datetime | None, outcome: str, closes_at: datetime | None
) -> None:
    owner = schedule(window_policy=WindowPolicy.DEFER, rollout=RolloutPolicy(max_concurrent_racks=1))
    (scope,) = scopes_of(owner, 1)
    snapshot = Snapshot((owner,), {owner.id: (scope,)}, windows=(ALLOW_LATER,), racks=racks_of((scope,)))
    pending = ScopeOutcome(scope.id, scope.rack_id, "pending", start_by=start_by)

    starts = plan_starts(snapshot, (pending,), [scope.id], "dispatch", NOW)

    if outcome == "missed":
        assert starts.submit == ()
        assert starts.settled[scope.id].outcome == "missed"
        assert "comes after the start deadline" in starts.settled[scope.id].error
        return
    ((_, deferral),) = starts.submit
    assert deferral is not None and deferral.closes_at == closes_at
    assert deadline_end(deferral) == start_by  # kept, whether or not it ends the wait first
    assert deferral.by_deadline is (closes_at == start_by)


@pytest.mark.parametrize("trigger", ["dispatch", "manual"])
def test_a_rollout_step_inside_an_allow_window_binds_its_task_to_the_windows_end(trigger: Trigger) -> None:
    """A scope started while an ALLOW window holds its rack (a rollout's turn, an approved run) carries the
    window's end, so that its task does not start after it; a manual firing's obeys no ALLOW window."""
    owner = schedule(rollout=RolloutPolicy(max_concurrent_racks=1))
    (scope,) = scopes_of(owner, 1)
    allow_now = closing(WindowKind.ALLOW, NOW - HOUR, NOW + HOUR)
    snapshot = Snapshot((owner,), {owner.id: (scope,)}, windows=(allow_now,), racks=racks_of((scope,)))

    pending = ScopeOutcome(scope.id, scope.rack_id, "pending")

    starts = plan_starts(snapshot, (pending,), [scope.id], trigger, NOW)

    ((_, bound),) = starts.submit
    if trigger == "manual":
        assert bound is None
        return
    assert bound is not None and (bound.action, bound.opens_at, bound.closes_at) == ("fire", None, NOW + HOUR)
    assert deadline_end(bound) is None


def test_the_schedules_zero_deadline_overrides_the_default() -> None:
    assert own_or_default(timedelta(0), HOUR) is None
    assert own_or_default(None, HOUR) == HOUR
    assert own_or_default(MINUTE, HOUR) == MINUTE


def _tally(finished: bool = True, failed: bool = True) -> RunTally:
    return RunTally(uuid.uuid4(), NOW, finished, failed)


F, OK, GOING = _tally(), _tally(failed=False), _tally(finished=False)


@pytest.mark.parametrize(
    ("newest_first", "limit", "pauses"),
    [
        ((F, F, F), 3, True),
        ((F, F, F, OK), 3, True),  # older successes do not matter
        ((F, F), 3, False),  # not enough runs yet
        ((F, OK, F), 3, False),  # a success breaks the streak
        ((GOING, F, F, F), 3, False),  # a newer run still going decides nothing yet
        ((F, F, F), 0, False),  # off
        ((F,), 1, True),
    ],
)
def test_pause_after_failed_runs(newest_first: tuple[RunTally, ...], limit: int, pauses: bool) -> None:
    streak = failing_streak(newest_first, limit)
    assert bool(streak) is pauses
    if pauses:
        assert streak == newest_first[:limit]


@pytest.mark.parametrize(
    ("state", "outcomes", "statuses", "finished", "failed"),
    [
        ("completed", ("submitted", "submitted"), (TaskStatus.COMPLETED, TaskStatus.FAILED), True, True),
        ("completed", ("submitted", "submitted"), (TaskStatus.COMPLETED, TaskStatus.RUNNING), False, False),
        ("completed", ("submitted", "failed"), (TaskStatus.COMPLETED,), True, True),  # not submitted
        ("completed", ("submitted",), (TaskStatus.TERMINATED,), True, False),
        ("running", ("submitted",), (TaskStatus.FAILED,), False, True),  # its write-back is to come
        ("rolling", ("submitted", "pending"), (TaskStatus.FAILED,), False, True),
        ("halted", ("submitted", "pending"), (TaskStatus.FAILED,), True, True),
    ],
)
def test_a_run_is_tallied_from_its_tasks_final_statuses(
    state: str, outcomes: tuple[str, ...], statuses: tuple[TaskStatus, ...], finished: bool, failed: bool
) -> None:
    task_ids = [uuid.uuid4() for _ in statuses]
    scope_outcomes = [
        ScopeOutcome(uuid.uuid4(), uuid.uuid4(), o, task_id=task_ids[i] if i < len(task_ids) else None)  # type: ignore[arg-type]
        for i, o in enumerate(outcomes)
    ]
    got = tally(uuid.uuid4(), NOW, state, scope_outcomes, dict(zip(task_ids, statuses, strict=True)))  # type: ignore[arg-type]
    assert (got.finished, got.failed) == (finished, failed)


# --- a firmware schedule past its own window (its operation's end_time) --------------------------------


def upgrade_until(end: datetime) -> Operation:
    return Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.1", window_end=end)


ENDED_AT = "its firmware window ended at 2030-01-01T11:00:00Z (its upgrade's end_time)"


@pytest.mark.parametrize(
    ("trigger", "refused", "pauses"), [("dispatch", False, True), ("manual", True, False)]
)
def test_a_firing_past_its_operations_window_submits_nothing_and_pauses_its_schedule(
    trigger: Trigger, refused: bool, pauses: bool
) -> None:
    """Every task it made would fail unrun at its claim: the firing is skipped whole with the reason (a
    dispatched one recorded, its slot spent, and its schedule paused; a manual one refused)."""
    owner = schedule(operation=upgrade_until(NOW - HOUR))
    scopes = scopes_of(owner, 2)

    (firing,) = plan(Snapshot((owner,), {owner.id: scopes}), NOW, trigger)

    assert firing.skipped.startswith(ENDED_AT)
    assert firing.window_ended == NOW - HOUR
    assert (firing.refused, firing.pauses) == (refused, pauses)
    assert {d.action for d in scope_decisions(firing).values()} == {"skip_run"}  # what the preview shows
    assert firing.next_run_at == NOW + HOUR  # advanced as any firing


@pytest.mark.parametrize(("end", "ended"), [(NOW, True), (NOW + MINUTE, False)])
def test_the_operations_window_is_half_open(end: datetime, ended: bool) -> None:
    owner = schedule(operation=upgrade_until(end))

    (firing,) = plan(Snapshot((owner,), {owner.id: scopes_of(owner, 1)}), NOW, "dispatch")

    assert (bool(firing.skipped), firing.pauses, len(firing.to_submit)) == (ended, ended, 1)


def test_a_window_ended_is_told_before_a_missed_deadline_a_live_rollout_or_an_approval() -> None:
    """Past its end the schedule can never fire a task again: that, not this slot's lateness, a live
    rollout or an approval to ask for, is what the operator must hear."""
    owner = replace(
        schedule(operation=upgrade_until(NOW - HOUR), deadline=MINUTE, late=HOUR),
        rollout=RolloutPolicy(max_concurrent_racks=1),
        approval=ApprovalPolicy(HOUR),
    )
    live = {owner.id: LiveRollout(uuid.uuid4(), "halted")}
    snapshot = Snapshot((owner,), {owner.id: scopes_of(owner, 2)}, live_rollouts=live)

    (firing,) = plan(snapshot, NOW, "dispatch")

    assert firing.skipped.startswith(ENDED_AT) and firing.pauses
    assert not firing.missed and firing.approval is None and firing.rollout_outcomes == ()


def test_a_one_time_firing_past_its_window_is_consumed_with_nothing_to_pause() -> None:
    owner = schedule(
        operation=upgrade_until(NOW - HOUR), spec=ScheduleSpec(SpecType.ONE_TIME, "2030-01-01T11:59:55Z")
    )

    (firing,) = plan(Snapshot((owner,), {owner.id: scopes_of(owner, 1)}), NOW, "dispatch")

    assert firing.skipped.startswith(ENDED_AT)
    assert (firing.enabled, firing.next_run_at, firing.pauses) == (False, None, False)
