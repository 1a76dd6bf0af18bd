"""`rackflow check …`: pre-flight checks (docs/CHECKS.md), and `rackflow task override-checks`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    table,
    utc_text,
    when,
)
from rackflow.cli.tasks import rack_names, schedule_name, task, task_view
from rackflow.cli.windows import covers_text
from rackflow.client import OPERATION_RPCS, operation_name
from rackflow.domain.checks import EVERY_ALERT_WHY, MATCHES_EVERY_ALERT, matches_every_alert
from rackflow.ids import is_uuid
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import shown
from rackflow.words import counted

F = TypeVar("F", bound=Callable[..., Any])
_OPERATIONS = click.Choice([operation_label(o) for o in OPERATION_RPCS])
_ref = click.argument("check_ref", metavar="NAME_OR_ID")


@click.group(cls=Group)
def check() -> None:
    """Pre-flight checks: what must hold on a rack before a task starts there (no alert firing, a drain
    hook that says ready, no other disruptive task running); tasks wait, held, until it does."""


def _target(value: str) -> pb.WindowTarget:
    return pb.WindowTarget(id=pb.UUID(id=value)) if is_uuid(value) else pb.WindowTarget(name=value)


def every_alert(c: pb.PreflightCheck) -> bool:
    """An Alertmanager check stored with no matcher, before such a check was refused: it matches every
    alert (`domain.checks.matches_every_alert`)."""
    return c.WhichOneof("kind") == "alertmanager" and matches_every_alert(c.alertmanager.matchers)


def warn_of_every_alert(checks: Sequence[pb.PreflightCheck]) -> None:
    """Say on stderr, whatever the output (`-o json` keeps its stdout the message), of each check that
    matches every alert: it holds every task it applies to on any alert, and would be refused today."""
    for c in checks:
        if every_alert(c):
            click.echo(
                f"warning: pre-flight check '{shown(c.name)}' {MATCHES_EVERY_ALERT}. {EVERY_ALERT_WHY}",
                err=True,
            )


def kind_text(c: pb.PreflightCheck) -> str:
    which = c.WhichOneof("kind")
    if which == "alertmanager":
        closed = "" if c.alertmanager.fail_closed else ", fail open"
        if every_alert(c):
            return f"alertmanager {c.alertmanager.url} ({MATCHES_EVERY_ALERT}){closed}"
        return f"alertmanager {c.alertmanager.url} {' '.join(c.alertmanager.matchers)}{closed}"
    if which == "webhook":
        signed = ", signed" if c.webhook.secret else ""
        return f"webhook {c.webhook.url} (timeout {c.webhook.timeout}{signed})"
    busy = ", ".join(operation_label(o) for o in c.rack_idle.busy_operations) or "-"
    within = f", last failure within {c.rack_idle.failed_within}" if c.rack_idle.failed_within else ""
    return f"rack idle of {busy}{within}"


def _ops(operations: Sequence[str]) -> str:
    return ", ".join(operation_label(o) for o in operations) if operations else "all"


def checks_table(checks: Sequence[pb.PreflightCheck]) -> Listing:
    result = table(
        "NAME",
        "KIND",
        free_text("OPERATIONS"),
        free_text("COVERS"),
        "INTERVAL",
        "MAX WAIT",
        title=counted(len(checks), "check"),
    )
    for c in checks:
        result.add_row(c.name, kind_text(c), _ops(c.operations), covers_text(c), c.interval, c.max_wait)
    return result


def check_view(c: pb.PreflightCheck) -> Table:
    return details(
        [
            ("name", c.name),
            ("id", c.id.id),
            ("kind", kind_text(c)),
            ("operations", _ops(c.operations)),
            ("covers", covers_text(c)),
            ("interval", c.interval),
            ("max wait", c.max_wait),
            ("created", utc_text(when(c.created_at))),
            ("updated", utc_text(when(c.updated_at))),
        ]
    )


def _show(session: Session, found: pb.PreflightCheck) -> None:
    session.emit(found, lambda: check_view(found))
    warn_of_every_alert([found])


def _kind_options(f: F) -> F:
    options = [
        click.option("--alertmanager", "alertmanager", metavar="URL", help="Kind alertmanager: its URL."),
        click.option(
            "--matcher",
            "matchers",
            multiple=True,
            help='Alertmanager matcher (repeatable, at least one), templated: rack="{rack.name}"; '
            'any alert: alertname=~".+".',
        ),
        click.option("--fail-open", is_flag=True, help="Alertmanager: pass when it cannot be asked."),
        click.option(
            "--webhook", "webhook", metavar="URL", help="Kind webhook: the URL to POST the task to."
        ),
        click.option(
            "--secret", default="", metavar="REF", help="Webhook: env:NAME or file:/path of the key."
        ),
        click.option("--timeout", default="", metavar="DURATION", help="Webhook: answer within (10s)."),
        click.option("--rack-idle", is_flag=True, help="Kind rack_idle (built in)."),
        click.option(
            "--busy",
            "busy",
            multiple=True,
            type=_OPERATIONS,
            help="Rack idle: an operation that must not run.",
        ),
        click.option(
            "--failed-within",
            default="",
            metavar="DURATION",
            help="Rack idle: the last same task did not fail within.",
        ),
        click.option(
            "--op", "operations", multiple=True, type=_OPERATIONS, help="An operation it applies to."
        ),
        click.option(
            "--rack", "racks", multiple=True, metavar="RACK", help="A rack it applies to (name or id)."
        ),
        click.option(
            "--domain", "domains", multiple=True, metavar="DOMAIN", help="An NVLink domain it applies to."
        ),
        click.option(
            "--interval", default="", metavar="DURATION", help="Ask again this often while it holds (30s)."
        ),
        click.option("--max-wait", default="", metavar="DURATION", help="Fail a task held this long (1h)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


# Each kind's settings: (the parameter, its option), by the kind's option.
_SETTINGS: dict[str, tuple[tuple[str, str], ...]] = {
    "alertmanager": (("matchers", "--matcher"), ("fail_open", "--fail-open")),
    "webhook": (("secret", "--secret"), ("timeout", "--timeout")),
    "rack_idle": (("busy", "--busy"), ("failed_within", "--failed-within")),
}
_KIND_OPTIONS = {"alertmanager": "--alertmanager", "webhook": "--webhook", "rack_idle": "--rack-idle"}


def _set_kind(message: pb.PreflightCheck, given: dict[str, Any]) -> bool:
    """Fill the kind the options name into `message`; whether one was named (a usage error for two, and for
    a kind's setting without that kind's option, which was dropped unsaid: `update drained --timeout 30s`
    changed nothing, and said only "nothing to change")."""
    named = [k for k in ("alertmanager", "webhook") if given[k]] + (
        ["rack_idle"] if given["rack_idle"] else []
    )
    if len(named) > 1:
        raise click.UsageError("give one of --alertmanager, --webhook or --rack-idle")
    for kind, settings in _SETTINGS.items():
        stray = [option for parameter, option in settings if given[parameter] and kind not in named]
        if stray:
            raise click.UsageError(
                f"{', '.join(stray)} {'is a setting' if len(stray) == 1 else 'are settings'} of "
                f"{_KIND_OPTIONS[kind]} checks: give {_KIND_OPTIONS[kind]} with all its settings "
                "(it replaces the kind's settings)"
            )
    if not named:
        return False
    if named[0] == "alertmanager":
        message.alertmanager.CopyFrom(
            pb.AlertmanagerCheck(
                url=given["alertmanager"], matchers=given["matchers"], fail_closed=not given["fail_open"]
            )
        )
    elif named[0] == "webhook":
        message.webhook.CopyFrom(
            pb.WebhookCheck(url=given["webhook"], secret=given["secret"], timeout=given["timeout"])
        )
    else:
        message.rack_idle.CopyFrom(
            pb.RackIdleCheck(
                busy_operations=[operation_name(o) for o in given["busy"]],
                failed_within=given["failed_within"],
            )
        )
    return True


def _message(name: str, given: dict[str, Any]) -> pb.PreflightCheck:
    return pb.PreflightCheck(
        name=name,
        operations=[operation_name(o) for o in given["operations"]],
        racks=[_target(r) for r in given["racks"]],
        nvl_domains=[_target(d) for d in given["domains"]],
        interval=given["interval"],
        max_wait=given["max_wait"],
    )


@check.command()
@click.argument("name")
@_kind_options
@click.pass_context
def create(ctx: click.Context, /, name: str, **given: Any) -> None:
    """Create a check of one kind: --alertmanager, --webhook or --rack-idle.

    \b
    Example:
      rackflow check create no-alerts --alertmanager http://alertmanager:9093 \\
          --matcher 'rack="{rack.name}"' --matcher 'severity=~"critical|warning"' --op upgrade-firmware
      rackflow check create drained --webhook https://scheduler/drain --secret env:DRAIN_KEY --max-wait 2h
      rackflow check create idle --rack-idle --busy power-reset --failed-within 1h --op upgrade-firmware
    """
    message = _message(name, given)
    if not _set_kind(message, given):
        raise click.UsageError("give one of --alertmanager, --webhook or --rack-idle")
    session = pass_session(ctx)
    _show(session, session.client.create_check(message))


@check.command()
@_ref
@click.pass_context
def show(ctx: click.Context, check_ref: str) -> None:
    """Show one check.

    \b
    Example:
      rackflow check show no-alerts -o yaml
    """
    session = pass_session(ctx)
    _show(session, session.client.get_check(check_ref))


@check.command(name="list")
@click.pass_context
def list_checks(ctx: click.Context) -> None:
    """List checks by name.

    \b
    Example:
      rackflow check list -o json
    """
    session = pass_session(ctx)
    found = session.client.list_checks()
    session.emit(found, lambda: checks_table(found.checks))
    warn_of_every_alert(found.checks)


@check.command()
@_ref
@click.option("--name", default=None, help="A new name.")
@click.option("--all-operations", is_flag=True, help="Apply to every operation.")
@click.option("--all-racks", is_flag=True, help="Apply to every rack.")
@_kind_options
@click.pass_context
def update(
    ctx: click.Context,
    /,
    check_ref: str,
    name: str | None,
    all_operations: bool,
    all_racks: bool,
    **given: Any,
) -> None:
    """Change a check: what is given replaces what it was (a kind option replaces the kind and all its
    settings). Tasks it holds are asked again at once.

    \b
    Example:
      rackflow check update drained --max-wait 4h
      rackflow check update no-alerts --alertmanager http://am-2:9093 --matcher 'rack="{rack.name}"'
    """
    message = _message(name or "", given)
    paths = [
        path
        for path, present in (
            ("check.name", name is not None),
            ("check.operations", bool(given["operations"]) or all_operations),
            ("check.racks", bool(given["racks"]) or all_racks),
            ("check.nvl_domains", bool(given["domains"]) or all_racks),
            ("check.kind", _set_kind(message, given)),
            ("check.interval", bool(given["interval"])),
            ("check.max_wait", bool(given["max_wait"])),
        )
        if present
    ]
    if not paths:
        raise click.UsageError("nothing to change")
    session = pass_session(ctx)
    _show(session, session.client.update_check(check_ref, message, paths))


@check.command()
@_ref
@click.pass_context
def delete(ctx: click.Context, check_ref: str) -> None:
    """Delete a check; the tasks it held are looked at again at once.

    \b
    Example:
      rackflow check delete drained
    """
    session = pass_session(ctx)
    session.client.delete_check(check_ref)
    session.emit(Empty(), lambda: f"deleted check {check_ref}")


@task.command(name="override-checks")
@click.argument("task_id")
@click.option("--reason", required=True, help="Why it may start whatever its checks say (shown, audited).")
@click.option(
    "--check",
    "checks",
    multiple=True,
    metavar="NAME_OR_ID",
    help="Override only this check (repeatable); the task's other checks still count. Default: all.",
)
@click.pass_context
def override_checks(ctx: click.Context, task_id: str, reason: str, checks: tuple[str, ...]) -> None:
    """Let one pending task start whatever its pre-flight checks say, or only the `--check` ones say
    (operator role; audited).

    \b
    Example:
      rackflow task override-checks 41eb5ceb-842b-4d7e-99ed-f840d9c05c4b --reason "INC-4411: alert is stale"
      rackflow task override-checks 41eb5ceb-842b-4d7e-99ed-f840d9c05c4b --check no-alerts \\
          --reason "INC-4411: the RackOverheat alert is stale; the drain hook still counts"
    """
    session = pass_session(ctx)
    found = session.client.override_checks(task_id, reason, checks)
    session.emit(
        found,
        lambda: task_view(
            found, rack_names(session, {found.rack_id.id}), schedule_name(session, found.schedule_id.id)
        ),
    )
