"""How windows combine, written once: any covering FREEZE occurrence closes a rack, and when ALLOW windows
cover it, scheduled work may start only inside one of their occurrences.

Every caller asks these functions: the dispatcher's firing (`decide_firing`, per scope), the schedule
preview (the same `decide_firing` for each previewed time), the executor's start gate (`freeze_at`: FREEZE
only, since ALLOW windows bind scheduled work, not a task someone submitted) and the window preview
(`events`). So a preview cannot disagree with what then happens.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from rackflow.domain.tasks import OperationKind
from rackflow.domain.windows import MaintenanceWindow, Occurrence, RackRef, WindowKind, WindowPolicy
from rackflow.timespec import format_rfc3339

# DEFER looks this far ahead for the rack's next opening; with none by then the scope is skipped.
OPENING_HORIZON = timedelta(days=366)
# ... and reads at most this many occurrences of each window while looking.
OCCURRENCES_SCANNED = 2000
# A firing inside ALLOW windows that stay open, back to back, this long from it is not bound to their end
# (`allowed_until`): following an ALLOW open all day every day to its first gap took 6 ms a firing.
ALLOW_BINDING_HORIZON = timedelta(days=7)


@dataclass(frozen=True)
class Closed:
    """Why a rack is closed at some time: `window`, until `until` (a freeze's end, or the next opening of
    an ALLOW window; None when no ALLOW occurrence is left)."""

    window: MaintenanceWindow
    until: datetime | None


# "skip_overlap", "missed" (a deferral whose opening comes after the start deadline) and "skip_run" (the
# whole firing skipped: the schedule's previous rollout is live, or its previous run awaits approval) are
# the planner's (`domain.firing`), never the windows'.
Action = Literal["fire", "skip_window", "defer", "skip_overlap", "missed", "skip_run"]


@dataclass(frozen=True)
class Decision:
    """What a firing does for one scope: fire, the task to start before `closes_at` when ALLOW windows
    open the rack (None: nothing ends its wait); skip it (`closed` says which window); or defer it, the
    task waiting for the opening `[opens_at, closes_at)` (closes_at None: open past the horizon). The planner
    adds "skip_overlap": the scope's last task is still active, and caps a deferral's `closes_at` at the
    firing's start deadline (`by_deadline`), so that a task failed there says so rather than blaming the
    window; it keeps that deadline on every deferral, and every fire with an end, it binds (`deadline`),
    so that the wait can be decided again under it when a window changes (`domain.firing.redeferral`)."""

    action: Action
    closed: Closed | None = None
    opens_at: datetime | None = None
    closes_at: datetime | None = None
    by_deadline: bool = False
    deadline: datetime | None = None

    @property
    def reason(self) -> str:
        """The words a run's outcome and a deferred task carry."""
        if self.closed is None:
            return ""
        window = self.closed.window
        if self.action == "missed":
            assert self.opens_at is not None
            return (
                f"{_closed_words(self.closed)}; its opening at {format_rfc3339(self.opens_at)} comes after "
                "the start deadline"
            )
        if self.action == "defer":
            assert self.opens_at is not None
            until = f" until {format_rfc3339(self.closes_at)}" if self.closes_at else ""
            if self.by_deadline:
                until += ", its start deadline"
            return (
                f"{_closed_words(self.closed)}; waits for the opening at "
                f"{format_rfc3339(self.opens_at)}{until}"
            )
        if window.kind is WindowKind.FREEZE or self.closed.until is not None:
            return _closed_words(self.closed)
        return f"outside {window.kind.value} window {window.name!r}, which has no opening left"


FIRE = Decision("fire")


def _closed_words(closed: Closed) -> str:
    window = closed.window
    if window.kind is WindowKind.FREEZE:
        until = f" until {format_rfc3339(closed.until)}" if closed.until else ""
        return f"inside freeze {window.name!r}{until}"
    return (
        f"outside allow window {window.name!r} "
        f"(opens at {format_rfc3339(closed.until) if closed.until else '?'})"
    )


def covering(
    windows: Sequence[MaintenanceWindow], rack: RackRef, operation: OperationKind | None
) -> list[MaintenanceWindow]:
    return [w for w in windows if w.covers(rack, operation)]


def freeze_at(
    windows: Sequence[MaintenanceWindow], rack: RackRef, operation: OperationKind, t: datetime
) -> Closed | None:
    """The covering FREEZE holding `t` that ends last, if any: what a task start waits for."""
    held = [
        Closed(w, o.end)
        for w in covering(windows, rack, operation)
        if w.kind is WindowKind.FREEZE and (o := w.occurrence_at(t)) is not None
    ]
    return max(held, key=lambda c: (c.until, c.window.name), default=None)


def closed_at(
    windows: Sequence[MaintenanceWindow], rack: RackRef, operation: OperationKind, t: datetime
) -> Closed | None:
    """Why scheduled work may not start on `rack` at `t` (None: it may): a covering FREEZE holds `t`, or
    ALLOW windows cover the rack and none holds `t` (then the one opening next is named)."""
    frozen = freeze_at(windows, rack, operation, t)
    if frozen is not None:
        return frozen
    allows = [w for w in covering(windows, rack, operation) if w.kind is WindowKind.ALLOW]
    if not allows or any(w.occurrence_at(t) is not None for w in allows):
        return None
    upcoming = [(o.start, w.name, w) for w in allows if (o := next(w.occurrences(t), None)) is not None]
    if not upcoming:
        return Closed(min(allows, key=lambda w: w.name), None)
    start, _, window = min(upcoming, key=lambda item: (item[0], item[1]))
    return Closed(window, start)


def allowed_until(
    windows: Sequence[MaintenanceWindow], rack: RackRef, operation: OperationKind, t: datetime
) -> datetime | None:
    """When the covering ALLOW occurrences holding `t` close (occurrences back to back count as one):
    scheduled work fired at `t` must start before then, or it would start outside every ALLOW window. None
    when no ALLOW occurrence holds `t`, or they stay open past ALLOW_BINDING_HORIZON (or past the
    OCCURRENCES_SCANNED they may take to follow). Freezes are left out: they hold a task at its start, until
    they end (`freeze_at`)."""
    allows = tuple(w for w in covering(windows, rack, operation) if w.kind is WindowKind.ALLOW)
    return _allowed_until(allows, t) if allows else None


@functools.lru_cache(maxsize=256)
def _allowed_until(allows: tuple[MaintenanceWindow, ...], t: datetime) -> datetime | None:
    """`allowed_until` over these ALLOW windows, remembered: a claim decides its whole batch's scopes at
    one time against the same windows (docs/PERFORMANCE.md, "The twentieth stop")."""
    end = t
    for _ in range(OCCURRENCES_SCANNED):
        ends = [o.end for w in allows if (o := w.occurrence_at(end)) is not None]
        if not ends:
            return end if end > t else None
        end = max(ends)
        if end >= t + ALLOW_BINDING_HORIZON:
            return None
    return None  # open back to back past every occurrence read: as open past the horizon


def next_opening(
    windows: Sequence[MaintenanceWindow], rack: RackRef, operation: OperationKind, after: datetime
) -> Occurrence | None:
    """The first stretch from `after` on when scheduled work may start on `rack` (its end at OPENING_HORIZON
    if it lasts past it), or None if none starts within the horizon.

    A sweep over the covering windows' occurrences: between two of their starts or ends nothing changes.
    """
    horizon = after + OPENING_HORIZON
    relevant = covering(windows, rack, operation)
    has_allow = any(w.kind is WindowKind.ALLOW for w in relevant)
    # (time, change in open ALLOWs, change in open FREEZEs); the first entry makes `after` itself a step.
    changes: list[tuple[datetime, int, int]] = [(after, 0, 0)]
    for window in relevant:
        allow = window.kind is WindowKind.ALLOW
        for occurrence in itertools.islice(window.occurrences(after), OCCURRENCES_SCANNED):
            if occurrence.start >= horizon:
                break
            start = max(occurrence.start, after)
            changes.append((start, int(allow), int(not allow)))
            changes.append((occurrence.end, -int(allow), -int(not allow)))
    changes.sort(key=lambda change: change[0])
    allows = freezes = 0
    opened: datetime | None = None
    for moment, group in itertools.groupby(changes, key=lambda change: change[0]):
        for _, allow_change, freeze_change in group:
            allows += allow_change
            freezes += freeze_change
        is_open = freezes == 0 and (allows > 0 or not has_allow)
        if opened is None and is_open and moment < horizon:
            opened = moment
        elif opened is not None and not is_open:
            return Occurrence(opened, moment)
    return Occurrence(opened, horizon) if opened is not None else None


def decide_firing(
    windows: Sequence[MaintenanceWindow],
    rack: RackRef,
    operation: OperationKind,
    at: datetime,
    policy: WindowPolicy,
) -> Decision:
    """The one decision, per scope, of a dispatched firing at `at` and of the schedule preview.

    Open: fire, by the end of the ALLOW window that opens the rack (`allowed_until`), as a deferred task
    starts by its opening's end. Closed under SKIP: skip, naming the window. Closed under DEFER: defer to the
    next opening (skip when none starts within OPENING_HORIZON).
    """
    closed = closed_at(windows, rack, operation, at)
    if closed is None:
        until = allowed_until(windows, rack, operation, at)
        return FIRE if until is None else Decision("fire", closes_at=until)
    if policy is WindowPolicy.DEFER:
        opening = next_opening(windows, rack, operation, at)
        if opening is not None:
            closes_at = None if opening.end >= at + OPENING_HORIZON else opening.end
            return Decision("defer", closed, opening.start, closes_at)
    return Decision("skip_window", closed)


@dataclass(frozen=True)
class WindowEvent:
    at: datetime
    window: MaintenanceWindow
    opens: bool


def events(
    windows: Sequence[MaintenanceWindow], rack: RackRef, after: datetime, count: int
) -> list[WindowEvent]:
    """The next `count` openings and closings, after `after`, of the windows covering `rack` (any
    operation), in time order; an occurrence holding `after` contributes its closing only."""

    def of(window: MaintenanceWindow) -> Iterator[WindowEvent]:
        for occurrence in window.occurrences(after):
            if occurrence.start > after:
                yield WindowEvent(occurrence.start, window, True)
            yield WindowEvent(occurrence.end, window, False)

    merged = heapq.merge(
        *(of(w) for w in covering(windows, rack, None)), key=lambda e: (e.at, e.opens, e.window.name)
    )
    return list(itertools.islice(merged, count))
