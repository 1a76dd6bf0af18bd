"""A schedule's resume and its firmware window's end as pure rules (`rackflow.domain.schedules`): what a
resume makes of a schedule, when it would be too late, and the pause kept at its end instead. No database
and no clock: tests/store/test_schedules_pause.py and tests/api/test_schedules_api.py prove the same through
the service on both databases."""

from __future__ import annotations

from dataclasses import replace

from rackflow.domain.schedules import (
    SKIPPED_ALL,
    Pause,
    after_its_window,
    kept_paused,
    resumed,
    too_late_to_resume,
)
from rackflow.domain.tasks import Operation, OperationKind
from rackflow.timespec import ScheduleSpec, SpecType
from tests.unit.test_planner import HOUR, MINUTE, NOW, schedule

END = NOW + 90 * MINUTE  # 2030-01-01T13:30:00Z
WINDOW = "its firmware window's end at 2030-01-01T13:30:00Z (its upgrade's end_time)"


def _pause() -> Pause:
    """An operator's pause made an hour ago, to end in two."""
    return Pause("rack move", "ann", NOW - HOUR, resume_at=NOW + 2 * HOUR)


def test_a_resume_restarts_interval_and_cron_from_then_and_keeps_a_one_time_s_instant() -> None:
    """Resumed at `at`: enabled, its pause forgotten; an interval's next firing a period after `at` (no
    catch-up), an unfired one-time's its instant; a consumed one-time only forgets its pause."""
    paused = replace(schedule(), enabled=False, pause=_pause())
    after = resumed(paused, NOW)
    assert (after.enabled, after.pause, after.next_run_at, after.updated_at) == (True, None, NOW + HOUR, NOW)
    once = replace(
        paused, spec=ScheduleSpec(SpecType.ONE_TIME, "2030-01-02T00:00:00Z"), next_run_at=NOW + HOUR
    )
    assert resumed(once, NOW).next_run_at == NOW + HOUR
    consumed = replace(once, next_run_at=None)
    assert resumed(consumed, NOW) == replace(consumed, pause=None, updated_at=NOW)


def test_a_firmware_schedule_resumed_at_or_past_its_end_or_firing_past_it_is_too_late() -> None:
    """Resumed at or past its end_time (the window is half-open), or where its next firing once resumed
    would be, it could only skip its firings; before that, or without an end, or consumed, it may resume.
    Kept paused then, by rackflow, saying why, its end dropped and its start kept."""
    upgrade = Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.1", window_end=END)
    paused = replace(schedule(operation=upgrade), enabled=False, pause=_pause())
    assert too_late_to_resume(paused, NOW + 20 * MINUTE) is None  # its next firing at 13:20
    assert too_late_to_resume(paused, NOW + 40 * MINUTE) == (
        "its next firing once resumed at 2030-01-01T12:40:00Z would be at 2030-01-01T13:40:00Z, not before "
        f"{WINDOW}"
    )
    assert too_late_to_resume(paused, END) == f"{WINDOW} is not after 2030-01-01T13:30:00Z"
    assert too_late_to_resume(replace(paused, operation=replace(upgrade, window_end=None)), END) is None
    assert (
        too_late_to_resume(
            replace(paused, spec=ScheduleSpec(SpecType.ONE_TIME, "2030-01-01T12:00:00Z"), next_run_at=None),
            END,
        )
        is None
    )

    assert kept_paused(paused, NOW + 20 * MINUTE) is None
    kept = kept_paused(paused, END + HOUR)
    assert kept is not None and not kept.enabled and kept.updated_at == END + HOUR
    assert kept.pause == Pause(
        f"its pause ended at 2030-01-01T14:30:00Z: {WINDOW} is not after 2030-01-01T14:30:00Z, "
        f"{SKIPPED_ALL}; it stays paused: create a new schedule with a later end_time",
        "rackflow",
        NOW - HOUR,
    )


def test_a_firing_at_or_past_the_end_is_refused_naming_the_field_and_the_firing() -> None:
    upgrade = Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.1", window_end=END)
    late = replace(schedule(operation=upgrade), next_run_at=END)
    assert after_its_window(late, "schedule.spec", "its next firing") == (
        "schedule.spec: its next firing at 2030-01-01T13:30:00Z is not before its operation's end_time "
        f"2030-01-01T13:30:00Z, {SKIPPED_ALL}; give a later end_time, or none"
    )
