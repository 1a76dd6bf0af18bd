"""What every client command shares: the session (server, output format, client, clock) and rendering.

Tables are for people (times in UTC, schedules also in their own zone, relative to now); `-o json` and
`-o yaml` print the full protobuf message (proto field names, defaults included) for scripts.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
import yaml
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from rackflow.api.convert import message_json
from rackflow.client import DEFAULT_TARGET, RackflowClient
from rackflow.clock import Clock, SystemClock
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import escaped_when_shown, shown

OUTPUT_FORMATS = ("table", "json", "yaml")
# Wide enough that ids and times never wrap when output goes to a pipe or a file.
PIPE_WIDTH = 200


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


@dataclass
class Session:
    """Per-invocation state, stored as the click context object; tests pass their own."""

    server: str = DEFAULT_TARGET
    output: str = "table"
    connect: Callable[[str], RackflowClient] = RackflowClient
    clock: Clock = field(default_factory=SystemClock)
    sleep: Callable[[float], None] = time.sleep
    console: Console = field(default_factory=_console)
    _client: RackflowClient | None = None

    @property
    def client(self) -> RackflowClient:
        if self._client is None:
            self._client = self.connect(self.server)
        return self._client

    @property
    def for_people(self) -> bool:
        return self.output == "table"

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    @contextmanager
    def progress(self, what: str, total: int | None) -> Iterator[Callable[[int], None]]:
        """Count `total` things (None: not known) that a table waits for over several calls, on a
        transient bar: for people on a terminal, not in a pipe, a file or -o json|yaml, where it would be
        in the way. The bar appears once something has been counted and more remains, so a table that one
        call answers never flashes one."""
        bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=self.console,
            transient=True,
            disable=not (self.for_people and self.console.is_terminal),
        )
        counted = bar.add_task(what, total=total)

        def advance(done: int) -> None:
            bar.advance(counted, done)
            if not bar.live.is_started and not bar.finished:
                bar.start()

        try:
            yield advance
        finally:
            if bar.live.is_started:
                bar.stop()

    def emit(self, message: Message | dict[str, Any], view: Callable[[], RenderableType]) -> None:
        """Print `message` as JSON/YAML, or `view()` (a rich renderable or markup) for people."""
        if self.output == "json":
            click.echo(json.dumps(to_dict(message), indent=2))
        elif self.output == "yaml":
            click.echo(yaml.safe_dump(to_dict(message), sort_keys=False), nl=False)
        elif self.console.is_terminal:  # uncropped: a table's ids stay whole even wider than the console
            self.console.print(view(), crop=False)
        else:  # a pipe or a file: no padding at line ends, so `grep`/`awk`/diffs see clean lines
            with self.console.capture() as captured:
                self.console.print(view(), crop=False)
            click.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def pass_session(ctx: click.Context) -> Session:
    return ctx.ensure_object(Session)


def _set_output(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.ensure_object(Session).output = value


def output_option() -> click.Option:
    return click.Option(
        ["-o", "--output"],
        type=click.Choice(OUTPUT_FORMATS),
        expose_value=False,
        is_eager=True,
        callback=_set_output,
        help="table (default), json or yaml.",
    )


class Command(click.Command):
    """A client command: also takes `-o/--output` after its own arguments (`rackflow rack list -o json`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(output_option())


class Group(click.Group):
    """A noun (rack, task, schedule…) whose commands and subgroups are rackflow's own classes."""

    command_class = Command
    group_class = type

    # Former names still accepted but not listed: each group shows one object with `show`, as budgets and
    # runs always did (`get` was the word of racks, tasks, windows and schedules).
    ALIASES: ClassVar[dict[str, str]] = {"get": "show"}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in self.ALIASES:
            return super().get_command(ctx, self.ALIASES[cmd_name])
        return found


def to_dict(message: Message | dict[str, Any]) -> dict[str, Any]:
    if isinstance(message, dict):
        return message
    return message_json(message)


# Between two columns of a table.
GAP = 2
# A free-text column that would get fewer cells than this (and than its text needs) moves under its rows.
TEXT_MIN = 16


@dataclass(frozen=True)
class Column:
    """A column of `table`. A key column (an id, name, time, state or count) is always shown whole, on one
    line, at any width; a free-text column (an error, message or description) gives way first."""

    header: str
    key: bool = True


def free_text(header: str) -> Column:
    return Column(header, key=False)


class Listing:
    """An aligned, borderless table in the style of kubectl that never hides the column a row is known by.

    Rich's own table shrinks every column alike when the console is narrow, so a long error squeezed the
    run id and the time to `6f1c2d3e-4b5…` and dropped whole columns. Here the key columns take the width
    their values need; the free-text columns share what is left and wrap in it. A free-text column that
    would get less than `TEXT_MIN` cells moves under each row (`error: …`, on one indented line with the
    others moved, wrapped), and so, when the key columns alone are too wide, do key columns from the right:
    a value is moved, never cut or dropped.
    """

    def __init__(self, columns: Sequence[Column], title: str | None = None) -> None:
        self.columns = list(columns)
        self.title = title
        self.rows: list[list[RenderableType]] = []

    def add_row(self, *cells: RenderableType) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(self.columns)} columns")
        self.rows.append(list(cells))

    def _cells(self, console: Console) -> list[list[Text]]:
        return [[_as_text(console, cell) for cell in row] for row in self.rows]

    def _naturals(self, cells: list[list[Text]]) -> list[int]:
        return [
            max([len(column.header), *(_text_width(row[index]) for row in cells)])
            for index, column in enumerate(self.columns)
        ]

    def _fit(self, naturals: list[int], width: int) -> tuple[dict[int, int], list[int]]:
        """The width of each column shown in line, and the columns moved under the rows: free text first
        (widest first), then key columns from the right; never the first column, which names the row."""
        inline = list(range(len(self.columns)))
        while True:
            text = [i for i in inline if not self.columns[i].key]
            keys = sum(naturals[i] for i in inline if self.columns[i].key)
            room = width - keys - GAP * (len(inline) - 1)
            shares = _share(room, {i: naturals[i] for i in text})
            if room >= 0 and all(shares[i] >= min(naturals[i], TEXT_MIN) for i in text):
                break
            if text:
                inline.remove(max(text, key=lambda i: naturals[i]))
            elif len(inline) > 1:
                inline.pop()
            else:
                break
        below = [i for i in range(len(self.columns)) if i not in inline]
        return {i: shares.get(i, naturals[i]) for i in inline}, below

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        cells = self._cells(console)
        widths, below = self._fit(self._naturals(cells), options.max_width)
        if self.title:
            yield from _lines([Text(self.title, style="table.title")], console)
        header = [Text(self.columns[i].header, style="bold") for i in widths]
        yield from _lines(_join([[h] for h in header], list(widths.values())), console)
        for row in cells:
            parts = [
                list(row[i].split("\n") if self.columns[i].key else row[i].wrap(console, w, overflow="fold"))
                for i, w in widths.items()
            ]
            yield from _lines(_join(parts, list(widths.values())), console)
            under = [
                Text.assemble((f"{_label(self.columns[i].header)}: ", "dim"), row[i])
                for i in below
                if row[i].plain.strip() not in ("", "-")
            ]
            if under:
                wrapped = (
                    Text("   ")
                    .join(under)
                    .wrap(console, max(options.max_width - 4, TEXT_MIN), overflow="fold")
                )
                for line in wrapped:
                    line.rstrip()
                yield from _lines([Text("    ") + line for line in wrapped], console)


def _label(header: str) -> str:
    """`ERROR` -> `error`, `LAST TASK` -> `last task`; a header that is a value (a time) stays."""
    return header.lower() if header.replace(" ", "").isalpha() else header


def _as_text(console: Console, cell: RenderableType) -> Text:
    if isinstance(cell, Text):
        return shown_text(cell)
    if isinstance(cell, str):  # as rich tables: no colours guessed in values
        return shown_text(console.render_str(cell, highlight=False))
    raise TypeError(f"a table cell is text, not {type(cell).__name__}")


def shown_text(text: Text) -> Text:
    """`text` as `validation.shown` writes it, each escape in reverse video; its styles kept."""
    at = [index for index, char in enumerate(text.plain) if escaped_when_shown(char)]
    if not at:
        return text
    result = text.blank_copy()
    for piece in text.divide(sorted({*at, *(index + 1 for index in at)})):
        if len(piece) == 1 and escaped_when_shown(piece.plain):
            result.append(shown(piece.plain), style="reverse")
        else:
            result.append_text(piece)
    return result


def _text_width(text: Text) -> int:
    return max((line.cell_len for line in text.split("\n")), default=0)


def _share(room: int, naturals: dict[int, int]) -> dict[int, int]:
    """`room` cells shared among columns wanting `naturals`: none gets more than it needs, and what one
    does not need goes to the others (narrowest first)."""
    shares = {}
    left = room
    for done, (index, natural) in enumerate(sorted(naturals.items(), key=lambda item: item[1])):
        shares[index] = min(natural, left // (len(naturals) - done))
        left -= shares[index]
    return shares


def _join(parts: Sequence[Sequence[Text]], widths: list[int]) -> list[Text]:
    """Cells of one row (each a list of lines) side by side, padded to their widths."""
    height = max(len(lines) for lines in parts)
    result = []
    for number in range(height):
        line = Text()
        for index, (lines, width) in enumerate(zip(parts, widths, strict=True)):
            piece = lines[number].copy() if number < len(lines) else Text()
            if index < len(parts) - 1:
                piece.pad_right(width - piece.cell_len + GAP)
            line.append_text(piece)
        line.rstrip()
        result.append(line)
    return result


def _lines(lines: Iterable[Text], console: Console) -> RenderResult:
    for line in lines:
        yield from line.render(console)
        yield Segment.line()


def table(*columns: str | Column, title: str | None = None) -> Listing:
    """A `Listing`; a column given by its header alone is a key column."""
    return Listing([c if isinstance(c, Column) else Column(c) for c in columns], title)


def details(rows: Iterable[tuple[str, RenderableType]]) -> Table:
    """A two-column key/value view of one object."""
    result = Table(box=None, show_header=False, pad_edge=False)
    result.add_column(style="bold")
    result.add_column()
    for key, value in rows:
        if isinstance(value, str):
            value = shown(value)
        elif isinstance(value, Text):
            value = shown_text(value)
        result.add_row(key, value)
    return result


# --- times ---------------------------------------------------------------------------------------


def when(ts: Timestamp) -> datetime | None:
    """The aware UTC time of a Timestamp field, None when unset."""
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToDatetime(tzinfo=UTC)


def _clock(value: datetime) -> str:
    return value.strftime("%H:%M" if value.second == 0 else "%H:%M:%S")


def utc_text(value: datetime | None) -> str:
    """`2026-12-01 10:00Z` (seconds only when not zero); `-` for no time."""
    if value is None:
        return "-"
    value = value.astimezone(UTC)
    return f"{value:%Y-%m-%d} {_clock(value)}Z"


def zone_of(name: str) -> ZoneInfo:
    """The named zone, UTC for "" or a name this machine does not know (display only)."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def zoned_text(value: datetime | None, zone: str) -> str:
    """`2026-12-01 02:00 PST (10:00Z)`, or just the UTC form when the zone is UTC."""
    if value is None:
        return "-"
    local = value.astimezone(zone_of(zone))
    if local.utcoffset() == timedelta(0) and zone in ("", "UTC", "Etc/UTC"):
        return utc_text(value)
    return f"{local:%Y-%m-%d} {_clock(local)} {local.tzname()} ({_clock(value.astimezone(UTC))}Z)"


def relative_text(value: datetime, now: datetime) -> str:
    """`in 3h 12m`, `5m 3s ago`, `now`: the two largest units, whole seconds."""
    seconds = round((value - now).total_seconds())
    if seconds == 0:
        return "now"
    span = _span(abs(seconds))
    return f"in {span}" if seconds > 0 else f"{span} ago"


_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def _span(seconds: int) -> str:
    """The largest unit and, when not zero, the next one: `3h 12m`, `2d`, `45s`."""
    for index, (unit, size) in enumerate(_UNITS[:-1]):
        if seconds >= size:
            major, rest = divmod(seconds, size)
            minor_unit, minor_size = _UNITS[index + 1]
            minor = rest // minor_size
            return f"{major}{unit} {minor}{minor_unit}" if minor else f"{major}{unit}"
    return f"{seconds}s"


def schedule_time_text(ts: Timestamp, zone: str, now: datetime) -> str:
    """`2026-12-01 02:00 PST (10:00Z), in 3h 12m` — what an operator wants to know about a firing."""
    value = when(ts)
    if value is None:
        return "-"
    return f"{zoned_text(value, zone)}, {relative_text(value, now)}"


# --- enums and specs -----------------------------------------------------------------------------

STATUS_STYLES = {
    "COMPLETED": "green",
    "FAILED": "red",
    "TERMINATED": "magenta",
    "RUNNING": "cyan",
    "PENDING": "yellow",
    "WAITING": "yellow",
}


def status_name(status: pb.TaskStatus.ValueType) -> str:
    return pb.TaskStatus.Name(status).removeprefix("TASK_STATUS_")


def styled_status(status: pb.TaskStatus.ValueType) -> str:
    name = status_name(status)
    style = STATUS_STYLES.get(name)
    return f"[{style}]{name}[/]" if style else name


def component_type_name(ctype: pb.ComponentType.ValueType) -> str:
    return pb.ComponentType.Name(ctype).removeprefix("COMPONENT_TYPE_")


def spec_text(spec: pb.ScheduleSpec) -> str:
    """`every 24h`, `cron "0 2 * * 1" America/Los_Angeles`, `once at 2026-06-01T04:00:00Z`."""
    if spec.type == pb.SCHEDULE_SPEC_TYPE_INTERVAL:
        return f"every {spec.spec}"
    if spec.type == pb.SCHEDULE_SPEC_TYPE_CRON:
        return f'cron "{spec.spec}" {spec.timezone or "UTC"}'
    if spec.type == pb.SCHEDULE_SPEC_TYPE_ONE_TIME:
        return f"once at {spec.spec}"
    return spec.spec


def overlap_name(policy: pb.OverlapPolicy.ValueType) -> str:
    return pb.OverlapPolicy.Name(policy).removeprefix("OVERLAP_POLICY_").lower()


def window_policy_name(policy: pb.WindowPolicy.ValueType) -> str:
    return pb.WindowPolicy.Name(policy).removeprefix("WINDOW_POLICY_").lower()


def operation_label(operation: str) -> str:
    """`power_on` -> `power-on`, the CLI's spelling."""
    return operation.replace("_", "-")
