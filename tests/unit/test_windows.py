"""Maintenance windows, pure: occurrences across DST changes, validation, and how windows combine."""

from __future__ import annotations

import itertools
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rackflow.domain.tasks import OperationKind
from rackflow.domain.window_rules import closed_at, decide_firing, events, freeze_at, next_opening
from rackflow.domain.windows import (
    MaintenanceWindow,
    OneOff,
    RackRef,
    Recurring,
    When,
    WindowKind,
    WindowPolicy,
)

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "dst-cases.jsonl"
RACK = RackRef(uuid.uuid4(), uuid.uuid4())
OTHER = RackRef(uuid.uuid4(), None)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def window(
    name: str,
    kind: WindowKind,
    when: When,
    *,
    racks: tuple[RackRef, ...] = (),
    domains: tuple[uuid.UUID, ...] = (),
    operations: frozenset[OperationKind] = frozenset(),
) -> MaintenanceWindow:
    return MaintenanceWindow(
        id=uuid.uuid4(),
        name=name,
        reason="",
        kind=kind,
        when=when,
        all_racks=not racks and not domains,
        racks=tuple((r.rack_id, "r") for r in racks),
        domains=tuple((d, "d") for d in domains),
        operations=operations,
        created_at=T0,
        updated_at=T0,
    )


def _golden_crons() -> list[dict[str, Any]]:
    cases = [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]
    return [c for c in cases if c["kind"] == "cron" and c["expect"]["ok"]]


@pytest.mark.parametrize("case", _golden_crons(), ids=lambda c: f"{c['spec']}@{c['tz']}@{c['from']}")
def test_recurring_windows_open_at_the_golden_dst_times(case: dict[str, Any]) -> None:
    """A recurring window opens exactly when the cron golden rules say its expression fires, across DST."""
    recurring = Recurring(case["spec"], "1s", case["tz"])
    after = utc(case["from"])
    # occurrences(after + 1s) yields those ending after it: the ones starting after `after`.
    occurrences = recurring.occurrences(after + timedelta(seconds=1))
    starts = [o.start for o in itertools.islice(occurrences, case["n"])]
    assert [s.isoformat() for s in starts] == [utc(n).isoformat() for n in case["expect"]["next"]]


def test_weekly_berlin_window_across_the_spring_change() -> None:
    """Saturdays 22:00 for 6h in Europe/Berlin: 21:00Z before the change (CET), 20:00Z after (CEST); the
    worked example of docs/WINDOWS.md."""
    w = window("sat-night", WindowKind.ALLOW, Recurring("0 22 * * 6", "6h", "Europe/Berlin"))
    got = [(o.start, o.end) for o in itertools.islice(w.occurrences(utc("2026-03-27T00:00:00Z")), 2)]
    assert got == [
        (utc("2026-03-28T21:00:00Z"), utc("2026-03-29T03:00:00Z")),
        (utc("2026-04-04T20:00:00Z"), utc("2026-04-05T02:00:00Z")),
    ]
    assert w.occurrence_at(utc("2026-03-29T02:59:59Z")) is not None
    assert w.occurrence_at(utc("2026-03-29T03:00:00Z")) is None  # half-open
    assert w.occurrence_at(utc("2026-03-28T20:59:59Z")) is None


@pytest.mark.parametrize(
    ("recurring", "message"),
    [
        (Recurring("0 22 * * 6", "0s"), "window.recurring.duration: '0s' must be more than 0"),
        (Recurring("0 22 * * 6", "-1h"), "window.recurring.duration: '-1h' must be more than 0"),
        (Recurring("0 22 * * 6", "169h"), "window.recurring.duration: '169h' is longer than the 168h00m"),
        (Recurring("0 * * * *", "61m"), "window.recurring.duration: '61m' is longer than the 1h00m"),
        (Recurring("0 22 * * 6", "6x"), "window.recurring.duration: invalid duration"),
        (Recurring("61 22 * * 6", "1h"), "window.recurring.cron: "),
        (Recurring("0 22 * * 6", "1h", "Mars/Olympus"), "window.recurring.timezone: invalid time zone"),
    ],
)
def test_bad_recurring_windows_name_the_field(recurring: Recurring, message: str) -> None:
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        recurring.check(T0, "window.recurring")


def test_a_window_as_long_as_the_gap_is_accepted_even_across_dst() -> None:
    Recurring("0 22 * * 6", "167h", "Europe/Berlin").check(T0, "w")  # the spring week is 167h long
    with pytest.raises(ValueError, match="longer than the 167h00m"):
        Recurring("0 22 * * 6", "168h", "Europe/Berlin").check(T0, "w")


def test_one_off_end_must_follow_start() -> None:
    with pytest.raises(ValueError, match=r"^window.one_off.end: .* is not after window.one_off.start"):
        OneOff(T0, T0).check("window.one_off")


def test_coverage_by_rack_domain_operation_and_all() -> None:
    assert window("a", WindowKind.FREEZE, OneOff(T0, T0 + timedelta(1))).covers(OTHER)
    by_rack = window("r", WindowKind.FREEZE, OneOff(T0, T0 + timedelta(1)), racks=(RACK,))
    assert by_rack.covers(RACK) and not by_rack.covers(OTHER)
    assert RACK.domain_id is not None
    by_domain = window("d", WindowKind.FREEZE, OneOff(T0, T0 + timedelta(1)), domains=(RACK.domain_id,))
    assert by_domain.covers(RACK) and not by_domain.covers(OTHER)
    firmware = frozenset({OperationKind.UPGRADE_FIRMWARE})
    by_op = window("o", WindowKind.FREEZE, OneOff(T0, T0 + timedelta(1)), operations=firmware)
    assert by_op.covers(RACK, OperationKind.UPGRADE_FIRMWARE)
    assert not by_op.covers(RACK, OperationKind.POWER_ON)
    assert by_op.covers(RACK)  # "any operation": the window preview lists it
    deleted_racks = window("gone", WindowKind.FREEZE, OneOff(T0, T0 + timedelta(1)), racks=(RACK,))
    assert not MaintenanceWindow(**{**deleted_racks.__dict__, "racks": ()}).covers(RACK)


DAILY_2_TO_4 = Recurring("0 2 * * *", "2h")
FREEZE_JAN_2 = OneOff(utc("2026-01-02T00:00:00Z"), utc("2026-01-03T00:00:00Z"))
POWER = OperationKind.POWER_RESET


def test_any_allow_opens_any_freeze_closes() -> None:
    allow = window("nightly", WindowKind.ALLOW, DAILY_2_TO_4)
    allow_b = window("noon", WindowKind.ALLOW, Recurring("0 12 * * *", "1h"))
    freeze = window("launch", WindowKind.FREEZE, FREEZE_JAN_2)
    ws = [allow, allow_b, freeze]
    assert closed_at(ws, RACK, POWER, utc("2026-01-01T02:30:00Z")) is None
    assert closed_at(ws, RACK, POWER, utc("2026-01-01T12:30:00Z")) is None  # the other ALLOW
    outside = closed_at(ws, RACK, POWER, utc("2026-01-01T05:00:00Z"))
    assert outside is not None and outside.window is allow_b and outside.until == utc("2026-01-01T12:00:00Z")
    frozen = closed_at(ws, RACK, POWER, utc("2026-01-02T02:30:00Z"))  # inside ALLOW and FREEZE: closed
    assert frozen is not None and frozen.window is freeze and frozen.until == utc("2026-01-03T00:00:00Z")
    assert closed_at([allow], OTHER, POWER, utc("2026-01-01T05:00:00Z")) is not None  # all racks
    assert closed_at([], RACK, POWER, utc("2026-01-01T05:00:00Z")) is None


def test_task_starts_obey_freezes_only() -> None:
    allow = window("nightly", WindowKind.ALLOW, DAILY_2_TO_4)
    freeze = window("launch", WindowKind.FREEZE, FREEZE_JAN_2)
    assert freeze_at([allow, freeze], RACK, POWER, utc("2026-01-01T05:00:00Z")) is None
    held = freeze_at([allow, freeze], RACK, POWER, utc("2026-01-02T05:00:00Z"))
    assert held is not None and held.window is freeze


def test_decisions_fire_skip_and_defer() -> None:
    allow = window("nightly", WindowKind.ALLOW, DAILY_2_TO_4)
    freeze = window("launch", WindowKind.FREEZE, FREEZE_JAN_2)
    ws = [allow, freeze]
    at = utc("2026-01-01T05:00:00Z")
    assert decide_firing(ws, RACK, POWER, utc("2026-01-01T03:00:00Z"), WindowPolicy.SKIP).action == "fire"
    skipped = decide_firing(ws, RACK, POWER, at, WindowPolicy.SKIP)
    assert skipped.action == "skip_window" and skipped.closed is not None
    assert skipped.closed.window is allow
    assert "outside allow window 'nightly'" in skipped.reason
    # The next opening of the ALLOW window (2 Jan 02:00) lies in the freeze: the one after it.
    deferred = decide_firing(ws, RACK, POWER, at, WindowPolicy.DEFER)
    assert (deferred.action, deferred.opens_at, deferred.closes_at) == (
        "defer",
        utc("2026-01-03T02:00:00Z"),
        utc("2026-01-03T04:00:00Z"),
    )
    only_freeze = decide_firing([freeze], RACK, POWER, utc("2026-01-02T05:00:00Z"), WindowPolicy.DEFER)
    assert (only_freeze.opens_at, only_freeze.closes_at) == (utc("2026-01-03T00:00:00Z"), None)
    assert "inside freeze 'launch'" in only_freeze.reason


def test_a_firing_inside_an_allow_window_must_start_before_it_closes() -> None:
    """Fired while an ALLOW window holds the rack, its task must start before that window closes (ALLOW
    occurrences back to back count as one), or it would start outside every ALLOW window; with no ALLOW
    window covering the rack, nothing ends its wait (a freeze only holds it, at its start)."""
    allow = window("nightly", WindowKind.ALLOW, DAILY_2_TO_4)
    fired = decide_firing([allow], RACK, POWER, utc("2026-01-01T03:00:00Z"), WindowPolicy.SKIP)
    assert (fired.action, fired.opens_at, fired.closes_at) == ("fire", None, utc("2026-01-01T04:00:00Z"))
    assert fired.reason == ""
    then = window("then", WindowKind.ALLOW, OneOff(utc("2026-01-01T04:00:00Z"), utc("2026-01-01T05:00:00Z")))
    chained = decide_firing([allow, then], RACK, POWER, utc("2026-01-01T03:00:00Z"), WindowPolicy.DEFER)
    assert (chained.action, chained.closes_at) == ("fire", utc("2026-01-01T05:00:00Z"))
    freeze = window("launch", WindowKind.FREEZE, FREEZE_JAN_2)
    unbound = decide_firing([freeze], RACK, POWER, utc("2026-01-01T05:00:00Z"), WindowPolicy.SKIP)
    assert (unbound.action, unbound.closes_at) == ("fire", None)
    always = window("day", WindowKind.ALLOW, Recurring("0 0 * * *", "24h"))
    assert decide_firing([always], RACK, POWER, T0, WindowPolicy.SKIP).closes_at is None  # past the horizon
    # Open back to back past every occurrence read (a minute's ALLOW every minute): as open past it.
    minutes = window("minutes", WindowKind.ALLOW, Recurring("* * * * *", "1m"))
    assert decide_firing([minutes], RACK, POWER, T0, WindowPolicy.SKIP).closes_at is None
    # Back to back for days, then a gap inside the binding horizon: bound to the gap.
    weekdays = window("weekdays", WindowKind.ALLOW, Recurring("0 0 * * 1-5", "24h"))
    monday = utc("2026-01-05T12:00:00Z")
    assert decide_firing([weekdays], RACK, POWER, monday, WindowPolicy.SKIP).closes_at == utc(
        "2026-01-10T00:00:00Z"
    )


def test_a_freeze_ending_inside_an_allow_opens_at_its_end() -> None:
    allow = window("day", WindowKind.ALLOW, Recurring("0 0 * * *", "24h"))
    freeze = window(
        "morning", WindowKind.FREEZE, OneOff(utc("2026-01-02T00:00:00Z"), utc("2026-01-02T06:00:00Z"))
    )
    opening = next_opening([allow, freeze], RACK, POWER, utc("2026-01-02T01:00:00Z"))
    assert opening is not None and opening.start == utc("2026-01-02T06:00:00Z")


def test_defer_without_an_opening_skips() -> None:
    past_allow = window("once", WindowKind.ALLOW, OneOff(T0, T0 + timedelta(hours=1)))
    decision = decide_firing([past_allow], RACK, POWER, T0 + timedelta(days=1), WindowPolicy.DEFER)
    assert decision.action == "skip_window"
    assert "no opening left" in decision.reason


def test_window_events_for_a_rack() -> None:
    allow = window("nightly", WindowKind.ALLOW, DAILY_2_TO_4)
    elsewhere = window("elsewhere", WindowKind.FREEZE, FREEZE_JAN_2, racks=(OTHER,))
    freeze = window("launch", WindowKind.FREEZE, FREEZE_JAN_2, racks=(RACK,))
    got = events([allow, elsewhere, freeze], RACK, utc("2026-01-01T03:00:00Z"), 5)
    assert [(e.at, e.window.name, e.opens) for e in got] == [
        (utc("2026-01-01T04:00:00Z"), "nightly", False),  # open at `after`: only its closing
        (utc("2026-01-02T00:00:00Z"), "launch", True),
        (utc("2026-01-02T02:00:00Z"), "nightly", True),
        (utc("2026-01-02T04:00:00Z"), "nightly", False),
        (utc("2026-01-03T00:00:00Z"), "launch", False),
    ]


def test_occurrences_after_the_first_representable_time_start_there() -> None:
    """`after` near year 1 (the fuzz tests send it): no overflow, the first occurrence is found."""
    window = Recurring("0 22 * * 6", "6h", "UTC")
    first = next(window.occurrences(datetime(1, 1, 1, tzinfo=UTC)))
    assert first.start == datetime(1, 1, 6, 22, tzinfo=UTC) and first.end == datetime(1, 1, 7, 4, tzinfo=UTC)
