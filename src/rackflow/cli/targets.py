"""Options shared by task and schedule commands: what to act on, and how long to wait in a queue."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

import click

from rackflow.client import Operation, Targets, component_type
from rackflow.timespec import resolve_zone

F = TypeVar("F", bound=Callable[..., Any])

_DURATION = re.compile(r"(\d+)([hms])")
_SECONDS = {"h": 3600, "m": 60, "s": 1}
MAX_SECONDS = 100 * 365 * 24 * 3600


def parse_seconds(value: str) -> int:
    """`90`, `90s`, `30m`, `1h30m` -> whole seconds (queue timeouts are whole seconds on the wire), at most
    MAX_SECONDS: a time that far away is a typo, and past it a time from now overflows."""
    text = value.strip()
    if text.isdigit():
        seconds = int(text)
    else:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"{value!r} is not a duration like 90s, 30m or 1h30m")
        seconds = sum(int(number) * _SECONDS[unit] for number, unit in parts)
    if seconds > MAX_SECONDS:
        raise ValueError(f"{value!r} is longer than 100 years")
    return seconds


def parse_types(value: str) -> tuple[str, ...]:
    """`COMPUTE,NVSWITCH` -> ("COMPUTE", "NVSWITCH"), each checked against the known types."""
    names = tuple(name.strip().upper() for name in value.split(",") if name.strip())
    for name in names:
        component_type(name)
    return names


def parse_zone(value: str) -> str:
    """A tz database zone name, checked here: a zone only shown (previews) never reaches the server."""
    resolve_zone(value)
    return value


def parse_time(value: str) -> datetime:
    """An RFC 3339 time with an offset (`2026-06-01T04:00:00Z`)."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an RFC 3339 time like 2026-06-01T04:00:00Z") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no offset; add Z or +hh:mm")
    return parsed


def poll_interval_option(help_text: str = "How often to poll.") -> Callable[[Any], Any]:
    """`--interval DURATION` (default 1s) of the commands that follow something until it ends."""
    return click.option(
        "--interval",
        default="1s",
        metavar="DURATION",
        callback=checked(parse_seconds),
        show_default=True,
        help=help_text,
    )


def checked(parse: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that turns a parser's ValueError into a usage error naming the option."""

    def callback(_ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None or value == ():
            return value
        try:
            return tuple(parse(v) for v in value) if isinstance(value, tuple) else parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param=param) from None

    return callback


def target_options(*, required: bool = True) -> Callable[[F], F]:
    """--rack, --types, --component, --domain, handed to the command as one `targets: Targets` value.

    Exactly one kind of target (racks, components or domains); None when not `required` and none given.
    """
    options = [
        click.option(
            "--rack", "racks", multiple=True, metavar="NAME_OR_ID", help="A rack to target (repeatable)."
        ),
        click.option(
            "--types",
            callback=checked(parse_types),
            metavar="TYPE,…",
            help="Only these component types of the racks or domains, e.g. COMPUTE,NVSWITCH.",
        ),
        click.option(
            "--component",
            "components",
            multiple=True,
            metavar="ID|TYPE:EXTERNAL_ID",
            help="A component to target (repeatable).",
        ),
        click.option(
            "--domain", "domains", multiple=True, metavar="NAME_OR_ID", help="An NVLink domain (repeatable)."
        ),
    ]

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_targets(
            *args: Any,
            racks: tuple[str, ...],
            types: tuple[str, ...] | None,
            components: tuple[str, ...],
            domains: tuple[str, ...],
            **kwargs: Any,
        ) -> Any:
            targets = targets_from(racks, types, components, domains, required=required)
            return command(*args, targets=targets, **kwargs)

        wrapped: Any = with_targets
        for option in reversed(options):
            wrapped = option(wrapped)
        return cast(F, wrapped)

    return decorate


def queue_options(command: F) -> F:
    """--queue and --queue-timeout: wait behind a conflicting task instead of being refused."""
    command = click.option(
        "--queue-timeout",
        callback=checked(parse_seconds),
        metavar="DURATION",
        help="With --queue: how long the task may wait (e.g. 30m; server default 1h).",
    )(command)
    return click.option("--queue", is_flag=True, help="Queue behind a conflicting task instead of failing.")(
        command
    )


def targets_from(
    racks: Sequence[str],
    types: Sequence[str] | None,
    components: Sequence[str],
    domains: Sequence[str],
    *,
    required: bool = True,
) -> Targets | None:
    """The `Targets` the options name; a usage error when they are missing or mixed."""
    given = [
        name
        for name, values in (("--rack", racks), ("--component", components), ("--domain", domains))
        if values
    ]
    if not given:
        if required or types:
            raise click.UsageError("give the targets: --rack, --component or --domain")
        return None
    if len(given) > 1:
        raise click.UsageError(f"{' and '.join(given)} cannot be combined: give one kind of target")
    if types and components:
        raise click.UsageError("--types narrows --rack or --domain, not --component")
    targets = Targets(racks=racks, components=components, domains=domains, types=types or ())
    try:
        targets.to_proto()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return targets


def valid(operation: Operation) -> Operation:
    """`operation`, or a usage error when its options do not fit it (e.g. --forced on power-on)."""
    try:
        operation.to_proto()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return operation
