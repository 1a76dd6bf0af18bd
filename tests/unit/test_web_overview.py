"""The overview's time axis: firings counted per slot to the end of the horizon, however dense."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rackflow.web.pages.overview import HORIZON, SLOTS, interval_slots, listed_slots, marks_of

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def test_every_ten_seconds_is_counted_in_every_slot_to_the_end() -> None:
    slots = interval_slots(NOW + timedelta(seconds=10), timedelta(seconds=10), NOW)
    assert sorted(slots) == list(range(SLOTS))
    assert sum(n for n, _, _ in slots.values()) == 8640  # 24 h of firings, the last one at the end
    # 15-minute slots: 10 s … 14:50 in the first, 90 in each between, and the last one ends at the end.
    assert slots[0] == (89, NOW + timedelta(seconds=10), NOW + timedelta(minutes=14, seconds=50))
    assert {slots[i][0] for i in range(1, SLOTS - 1)} == {90}
    assert slots[SLOTS - 1] == (91, NOW + HORIZON - timedelta(minutes=15), NOW + HORIZON)


def test_an_interval_counted_matches_its_firings_listed() -> None:
    first, step = NOW + timedelta(minutes=7, seconds=3), timedelta(minutes=2)
    times = [first + step * k for k in range(int((NOW + HORIZON - first) / step) + 1)]
    assert interval_slots(first, step, NOW) == listed_slots(times, NOW)
    assert sum(n for n, _, _ in interval_slots(first, step, NOW).values()) == 717


def test_an_interval_longer_than_the_horizon_fires_once_or_not_at_all() -> None:
    assert interval_slots(NOW + timedelta(hours=5), timedelta(days=7), NOW) == {
        20: (1, NOW + timedelta(hours=5), NOW + timedelta(hours=5))
    }
    assert interval_slots(NOW + HORIZON + timedelta(seconds=1), timedelta(hours=1), NOW) == {}


def test_a_lone_firing_is_drawn_where_it_falls_and_several_in_their_slots_middle() -> None:
    slots = listed_slots([NOW + timedelta(hours=6, minutes=1)], NOW) | {
        40: (3, NOW + timedelta(hours=10), NOW + timedelta(hours=10, minutes=10))
    }
    lone, several = marks_of(slots, NOW)
    assert (lone.count, round(lone.x, 3)) == (1, round((6 * 60 + 1) / (24 * 60) * 1000, 3))
    assert (several.count, several.x) == (3, (40.5 / SLOTS) * 1000)
