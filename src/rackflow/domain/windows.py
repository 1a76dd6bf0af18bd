"""Maintenance windows: when each one is open, and which racks and operations it covers.

Pure values and functions (no clock, no I/O): the caller passes the time in. Occurrences are half-open,
`[start, end)`, in aware UTC. A recurring window starts at every time its cron expression names, read in
its zone with the schedules' DST rule (`rackflow.timespec.cron`), and lasts its duration; the duration may
not exceed the shortest gap between two starts, so occurrences of one window never overlap and "the
occurrence holding t" is the one starting in `(t - duration, t]`.
"""

from __future__ import annotations

import enum
import functools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from rackflow.domain.tasks import OperationKind
from rackflow.timespec import CronExpr, parse_go_duration, resolve_zone

# How many starts of a recurring window are compared to find its shortest gap (a weekly window: about
# 19 years, so the DST changes and the odd calendar all take their turn).
PERIOD_SAMPLE = 1000


class WindowKind(enum.StrEnum):
    """ALLOW: scheduled operations on its racks may start only inside it. FREEZE: no operation may start
    inside it on its racks. The value is the stored form."""

    ALLOW = "allow"
    FREEZE = "freeze"


class WindowPolicy(enum.StrEnum):
    """What a dispatched firing does for a rack the windows close: skip it, or submit a task that waits for
    the next opening (and expires if that closes first). The value is the stored form."""

    SKIP = "skip"
    DEFER = "defer"


@dataclass(frozen=True)
class Occurrence:
    start: datetime
    end: datetime

    def holds(self, t: datetime) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True)
class Recurring:
    """Every start `cron` names in `timezone` ("" is UTC), lasting `duration` (a Go duration)."""

    cron: str
    duration: str
    timezone: str = ""

    @functools.cached_property
    def _expr(self) -> CronExpr:
        return CronExpr.parse(self.cron)

    @functools.cached_property
    def _zone(self) -> ZoneInfo:
        return resolve_zone(self.timezone)

    @functools.cached_property
    def length(self) -> timedelta:
        return timedelta(microseconds=parse_go_duration(self.duration) // 1000)

    def check(self, now: datetime, field: str) -> None:
        """ValueError naming the bad field (`<field>.cron: …`) unless every part parses, the duration is
        more than 0, and it is not longer than the shortest gap between starts from `now` on."""
        for name, parse in (("cron", lambda: self._expr), ("timezone", lambda: self._zone)):
            try:
                parse()
            except ValueError as exc:
                raise ValueError(f"{field}.{name}: {exc}") from None
        try:
            length = self.length
        except ValueError as exc:
            raise ValueError(f"{field}.duration: {exc}") from None
        if length <= timedelta(0):
            raise ValueError(f"{field}.duration: {self.duration!r} must be more than 0")
        gap = self.shortest_gap(now)
        if gap is not None and length > gap:
            raise ValueError(
                f"{field}.duration: {self.duration!r} is longer than the {_span(gap)} between two starts "
                f"of {self.cron!r}; occurrences of one window may not overlap"
            )

    def shortest_gap(self, now: datetime) -> timedelta | None:
        """The shortest time between two consecutive starts among the next PERIOD_SAMPLE (None: fewer
        than two starts are left)."""
        gap: timedelta | None = None
        previous = self._expr.next_after(now, self._zone)
        for _ in range(PERIOD_SAMPLE):
            if previous is None:
                break
            following = self._expr.next_after(previous, self._zone)
            if following is None:
                break
            gap = min(gap, following - previous) if gap is not None else following - previous
            previous = following
        return gap

    def occurrences(self, after: datetime) -> Iterator[Occurrence]:
        """The occurrences that end after `after`, in order (the first may have started already)."""
        length = self.length
        # From `length` before `after`, or from the first representable time when that is earlier.
        earliest = datetime.min.replace(tzinfo=after.tzinfo)
        current = after - length if after - earliest > length else earliest
        while (start := self._expr.next_after(current, self._zone)) is not None:
            yield Occurrence(start, start + length)
            current = start


@dataclass(frozen=True)
class OneOff:
    start: datetime
    end: datetime

    def check(self, field: str) -> None:
        if self.end <= self.start:
            raise ValueError(
                f"{field}.end: {self.end.isoformat()} is not after {field}.start {self.start.isoformat()}"
            )

    def occurrences(self, after: datetime) -> Iterator[Occurrence]:
        if self.end > after:
            yield Occurrence(self.start, self.end)


When = Recurring | OneOff


@dataclass(frozen=True)
class RackRef:
    """What decides whether a window covers a rack: its id and its NVLink domain."""

    rack_id: uuid.UUID
    domain_id: uuid.UUID | None


# What a window or a check that named racks or domains, all deleted since, covers: no rack, said so (both
# lists are empty then, as for one that covers every rack).
NO_RACK_LEFT = "no rack (its racks were deleted)"


class Coverage(Protocol):
    """What a window or a pre-flight check covers: every rack, or these racks and these domains' racks."""

    @property
    def all_racks(self) -> bool: ...
    @property
    def racks(self) -> tuple[tuple[uuid.UUID, str], ...]: ...
    @property
    def domains(self) -> tuple[tuple[uuid.UUID, str], ...]: ...


def covers_no_rack(coverage: Coverage) -> bool:
    """Whether it named racks or domains and all of them have been deleted: it covers nothing, not every
    rack (`all_racks` keeps the two apart)."""
    return not coverage.all_racks and not coverage.racks and not coverage.domains


@dataclass(frozen=True)
class MaintenanceWindow:
    """`racks` and `domains` as (id, name) pairs; `all_racks` when the window names neither (kept apart,
    so a window whose racks were all deleted covers nothing rather than everything)."""

    id: uuid.UUID
    name: str
    reason: str
    kind: WindowKind
    when: When
    all_racks: bool
    racks: tuple[tuple[uuid.UUID, str], ...]
    domains: tuple[tuple[uuid.UUID, str], ...]
    operations: frozenset[OperationKind]
    created_at: datetime
    updated_at: datetime

    def covers(self, rack: RackRef, operation: OperationKind | None = None) -> bool:
        """Whether the window applies to `operation` (None: to any) on `rack`."""
        if operation is not None and self.operations and operation not in self.operations:
            return False
        if self.all_racks:
            return True
        return any(rack.rack_id == i for i, _ in self.racks) or (
            rack.domain_id is not None and any(rack.domain_id == i for i, _ in self.domains)
        )

    def occurrences(self, after: datetime) -> Iterator[Occurrence]:
        return self.when.occurrences(after)

    def occurrence_at(self, t: datetime) -> Occurrence | None:
        first = next(self.occurrences(t), None)
        return first if first is not None and first.holds(t) else None


def _span(gap: timedelta) -> str:
    seconds = int(gap.total_seconds())
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
