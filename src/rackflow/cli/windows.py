"""`rackflow window …`: maintenance windows (ALLOW) and change freezes (FREEZE), and their next openings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from google.protobuf.empty_pb2 import Empty
from rich.table import Table

from rackflow.cli.output import (
    Group,
    Listing,
    Session,
    details,
    free_text,
    operation_label,
    pass_session,
    relative_text,
    table,
    utc_text,
    when,
    zoned_text,
)
from rackflow.cli.targets import checked, parse_time, parse_zone
from rackflow.client import OPERATION_RPCS, Recurrence, Span, Window, operation_name
from rackflow.domain.windows import NO_RACK_LEFT
from rackflow.v1 import flow_pb2 as pb
from rackflow.words import counted

F = TypeVar("F", bound=Callable[..., Any])
_OPERATIONS = click.Choice([operation_label(o) for o in OPERATION_RPCS])


@click.group(cls=Group)
def window() -> None:
    """Maintenance windows: scheduled work on their racks starts only inside an ALLOW window, and nothing
    starts inside a FREEZE (docs/WINDOWS.md)."""


def _kind_name(kind: pb.WindowKind.ValueType) -> str:
    return pb.WindowKind.Name(kind).removeprefix("WINDOW_KIND_").lower()


def when_text(w: pb.MaintenanceWindow) -> str:
    """`cron "0 22 * * 6" Europe/Berlin for 6h`, or `2026-06-01 04:00Z → 2026-06-02 04:00Z`."""
    if w.HasField("recurring"):
        r = w.recurring
        return f'cron "{r.cron}" {r.timezone or "UTC"} for {r.duration}'
    return f"{utc_text(when(w.one_off.start))} → {utc_text(when(w.one_off.end))}"


def covers_text(w: pb.MaintenanceWindow | pb.PreflightCheck) -> str:
    """What a window or a pre-flight check covers, as the console says it (`web.pages.windows`)."""
    if w.covers_no_rack:
        return NO_RACK_LEFT
    parts = [t.name for t in w.racks] + [f"domain {t.name}" for t in w.nvl_domains]
    return ", ".join(parts) if parts else "all racks"


def _ops_text(operations: Sequence[str]) -> str:
    return ", ".join(operation_label(o) for o in operations) if operations else "all"


def windows_table(windows: Sequence[pb.MaintenanceWindow], title: str | None = None) -> Listing:
    columns = ("NAME", "KIND", "WHEN", free_text("COVERS"), free_text("OPERATIONS"), free_text("REASON"))
    result = table(*columns, title=title)
    for w in windows:
        kind = _kind_name(w.kind)
        styled = f"[red]{kind}[/]" if w.kind == pb.WINDOW_KIND_FREEZE else f"[green]{kind}[/]"
        result.add_row(w.name, styled, when_text(w), covers_text(w), _ops_text(w.operations), w.reason or "-")
    return result


def window_view(w: pb.MaintenanceWindow) -> Table:
    return details(
        [
            ("name", w.name),
            ("id", w.id.id),
            ("kind", _kind_name(w.kind)),
            ("when", when_text(w)),
            ("covers", covers_text(w)),
            ("operations", _ops_text(w.operations)),
            ("reason", w.reason or "-"),
            ("created", utc_text(when(w.created_at))),
            ("updated", utc_text(when(w.updated_at))),
        ]
    )


def _when_from(
    cron: str | None,
    duration: str | None,
    tz: str | None,
    start: datetime | None,
    end: datetime | None,
    current: Callable[[], pb.MaintenanceWindow] | None = None,
) -> Recurrence | Span | None:
    """The timing the options give (None when none); a usage error for a mix or a half.

    `current` (an update: the window as it is, read only when needed): what the options leave out of the
    timing of the same kind is the window's own, so `--duration 4h` keeps its cron and zone; a window in
    Europe/Berlin given --cron and --duration without --tz moved to UTC, an hour off. A change of kind
    takes the whole new timing."""
    recurring = cron is not None or duration is not None or tz is not None
    one_off = start is not None or end is not None
    if recurring and one_off:
        raise click.UsageError("give --cron/--duration/--tz or --start/--end, not both")
    if current is not None and (recurring or one_off):
        window = current()
        if recurring and window.HasField("recurring"):
            was = window.recurring
            cron, duration = cron or was.cron, duration or was.duration
            tz = was.timezone if tz is None else tz
        elif one_off and window.HasField("one_off"):
            start = start or window.one_off.start.ToDatetime(tzinfo=UTC)
            end = end or window.one_off.end.ToDatetime(tzinfo=UTC)
    if recurring:
        if cron is None or duration is None:
            raise click.UsageError("a recurring window needs --cron and --duration")
        return Recurrence(cron, duration, tz or "")
    if one_off:
        if start is None or end is None:
            raise click.UsageError("a one-off window needs --start and --end")
        return Span(start, end)
    return None


def _kind_from(allow: bool, freeze: bool) -> str | None:
    if allow and freeze:
        raise click.UsageError("give --allow or --freeze, not both")
    return "allow" if allow else "freeze" if freeze else None


def _show(session: Session, found: pb.MaintenanceWindow) -> None:
    session.emit(found, lambda: window_view(found))


_ref = click.argument("window_ref", metavar="NAME_OR_ID")
_timing = [
    click.option("--cron", default=None, metavar="EXPR", help='Recurring: starts, e.g. "0 22 * * 6".'),
    click.option("--duration", default=None, metavar="DURATION", help="Recurring: how long each lasts (6h)."),
    click.option("--tz", default=None, metavar="ZONE", help="Recurring: the zone --cron is read in (UTC)."),
    click.option("--start", callback=checked(parse_time), metavar="TIME", help="One-off: RFC 3339 start."),
    click.option("--end", callback=checked(parse_time), metavar="TIME", help="One-off: RFC 3339 end."),
]
_coverage = [
    click.option(
        "--rack", "racks", multiple=True, metavar="NAME_OR_ID", help="A rack it covers (repeatable)."
    ),
    click.option(
        "--domain",
        "domains",
        multiple=True,
        metavar="NAME_OR_ID",
        help="An NVLink domain it covers (repeatable).",
    ),
    click.option(
        "--op",
        "operations",
        multiple=True,
        type=_OPERATIONS,
        help="An operation it applies to (repeatable; default all).",
    ),
]


def _with(options: Sequence[Callable[[F], F]]) -> Callable[[F], F]:
    """Several click options as one decorator (shared by create and update)."""

    def decorate(command: F) -> F:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


@window.command()
@click.argument("name")
@click.option("--allow", is_flag=True, help="Scheduled operations on its racks start only inside it.")
@click.option("--freeze", is_flag=True, help="No operation starts inside it on its racks.")
@_with(_timing)
@_with(_coverage)
@click.option("--reason", default="", help="Why (shown wherever the window holds something back).")
@click.pass_context
def create(
    ctx: click.Context,
    name: str,
    allow: bool,
    freeze: bool,
    cron: str | None,
    duration: str | None,
    tz: str | None,
    start: datetime | None,
    end: datetime | None,
    racks: tuple[str, ...],
    domains: tuple[str, ...],
    operations: tuple[str, ...],
    reason: str,
) -> None:
    """Create a window. Without --rack or --domain it covers every rack.

    \b
    Example:
      rackflow window create sat-night --allow --cron "0 22 * * 6" --duration 6h --tz Europe/Berlin \\
          --domain nvl-a --op upgrade-firmware --reason "agreed with the tenants"
      rackflow window create launch-week --freeze --start 2026-12-07T00:00:00Z --end 2026-12-14T00:00:00Z
    """
    kind = _kind_from(allow, freeze)
    if kind is None:
        raise click.UsageError("give --allow or --freeze")
    timing = _when_from(cron, duration, tz, start, end)
    if timing is None:
        raise click.UsageError("give when: --cron EXPR --duration D [--tz Z], or --start T --end T")
    ops = [operation_name(o) for o in operations]
    session = pass_session(ctx)
    _show(session, session.client.create_window(name, Window(kind, timing, racks, domains, ops, reason)))


@window.command()
@_ref
@click.pass_context
def show(ctx: click.Context, window_ref: str) -> None:
    """Show one window.

    \b
    Example:
      rackflow window show sat-night -o yaml
    """
    session = pass_session(ctx)
    _show(session, session.client.get_window(window_ref))


@window.command(name="list")
@click.option("--rack", default="", metavar="NAME_OR_ID", help="Only the windows covering this rack.")
@click.pass_context
def list_windows(ctx: click.Context, rack: str) -> None:
    """List windows by name.

    \b
    Example:
      rackflow window list --rack rack-01
    """
    session = pass_session(ctx)
    found = session.client.list_windows(rack=rack)
    session.emit(found, lambda: windows_table(found.windows, counted(len(found.windows), "window")))


@window.command()
@_ref
@click.option("--name", default=None, help="A new name.")
@click.option("--allow", is_flag=True, help="Make it an ALLOW window.")
@click.option("--freeze", is_flag=True, help="Make it a FREEZE.")
@_with(_timing)
@_with(_coverage)
@click.option("--all-racks", is_flag=True, help="Cover every rack (drops its racks and domains).")
@click.option("--all-ops", is_flag=True, help="Apply to every operation (drops its operations).")
@click.option("--reason", default=None, help="A new reason.")
@click.pass_context
def update(
    ctx: click.Context,
    window_ref: str,
    name: str | None,
    allow: bool,
    freeze: bool,
    cron: str | None,
    duration: str | None,
    tz: str | None,
    start: datetime | None,
    end: datetime | None,
    racks: tuple[str, ...],
    domains: tuple[str, ...],
    operations: tuple[str, ...],
    all_racks: bool,
    all_ops: bool,
    reason: str | None,
) -> None:
    """Change a window. --rack and --domain replace what it covers (give both to keep both); the timing
    options replace its timing, the window's own cron, duration and zone (or start and end) standing for
    those not given. Tasks a changed freeze held are looked at again.

    \b
    Example:
      rackflow window update launch-week --end 2026-12-10T00:00:00Z
      rackflow window update sat-night --duration 4h
    """
    if all_racks and (racks or domains):
        raise click.UsageError("give --all-racks or --rack/--domain, not both")
    if all_ops and operations:
        raise click.UsageError("give --all-ops or --op, not both")
    coverage = all_racks or racks or domains
    session = pass_session(ctx)
    changes = {
        "name": name,
        "reason": reason,
        "kind": _kind_from(allow, freeze),
        "when": _when_from(cron, duration, tz, start, end, lambda: session.client.get_window(window_ref)),
        "racks": racks if coverage else None,
        "domains": domains if coverage else None,
        "operations": [operation_name(o) for o in operations] if all_ops or operations else None,
    }
    if all(value is None for value in changes.values()):
        raise click.UsageError("nothing to change")
    _show(session, session.client.update_window(window_ref, **changes))  # type: ignore[arg-type]


@window.command()
@_ref
@click.pass_context
def delete(ctx: click.Context, window_ref: str) -> None:
    """Delete a window; tasks it held start at once if nothing else holds them.

    \b
    Example:
      rackflow window delete launch-week
    """
    session = pass_session(ctx)
    session.client.delete_window(window_ref)
    session.emit(Empty(), lambda: f"deleted window {window_ref}")


@window.command()
@click.argument("rack", metavar="RACK")
@click.option(
    "-n", "count", default=10, show_default=True, help="How many openings and closings (at most 100)."
)
@click.option(
    "--after", callback=checked(parse_time), metavar="TIME", help="Start after this time (default now)."
)
@click.option(
    "--tz",
    default="UTC",
    metavar="ZONE",
    callback=checked(parse_zone),
    help="Also show the times in this zone.",
)
@click.pass_context
def preview(ctx: click.Context, rack: str, count: int, after: datetime | None, tz: str) -> None:
    """Show the next openings and closings of the windows covering a rack.

    \b
    Example:
      rackflow window preview rack-01 -n 6 --tz Europe/Berlin
    """
    session = pass_session(ctx)
    found = session.client.preview_windows(rack, count=count, after=after)

    def view() -> Listing:
        now = session.clock.now()
        result = table("UTC", tz, "WHEN", "WINDOW", "KIND", "CHANGE", free_text("OPERATIONS"))
        for event in found.events:
            moment = event.at.ToDatetime(tzinfo=UTC)
            result.add_row(
                utc_text(moment),
                zoned_text(moment, tz),
                relative_text(moment, now),
                event.window_name,
                _kind_name(event.kind),
                event.change,
                _ops_text(event.operations),
            )
        return result

    session.emit(found, view)
