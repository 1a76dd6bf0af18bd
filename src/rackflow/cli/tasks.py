"""`rackflow task …`: submit operations, list, inspect, cancel and watch tasks."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import click
import grpc
from rich.console import Group as Stack
from rich.console import RenderableType
from rich.live import Live
from rich.spinner import Spinner
from rich.table import Table

from rackflow.api.convert import MAX_PAGE_SIZE
from rackflow.cli.output import (
    Group,
    Listing,
    Session,
    details,
    free_text,
    operation_label,
    pass_session,
    relative_text,
    status_name,
    styled_status,
    table,
    utc_text,
    when,
)
from rackflow.cli.paging import emit_page, page_options, page_title
from rackflow.cli.targets import (
    checked,
    parse_time,
    poll_interval_option,
    queue_options,
    target_options,
    valid,
)
from rackflow.client import TASK_STATUSES, Operation, RackflowClientError, Targets
from rackflow.domain.checks import HELD_BY_CHECKS
from rackflow.domain.tasks import TaskStatus
from rackflow.v1 import flow_pb2 as pb
from rackflow.words import counted

FINISHED = {pb.TASK_STATUS_COMPLETED, pb.TASK_STATUS_FAILED, pb.TASK_STATUS_TERMINATED}


@click.group(cls=Group)
def task() -> None:
    """Submit operations as tasks (one per rack) and follow them."""


def rack_names(session: Session, rack_ids: Collection[str]) -> dict[str, str]:
    """Rack names by id, for people, of `rack_ids` alone (a rack deleted since is left out, and shown by
    its id): a ListRacks by id for each 1,000 of them (`RackflowClient.racks_by_id`), counted on a progress
    bar when there are more. The whole rack list is 20 pages at 20,000 racks, which a run of 250 racks read
    (docs/PERFORMANCE.md, "The CLI at full size")."""
    ids = sorted(rack_ids)
    names: dict[str, str] = {}
    with session.progress("reading rack names", len(ids)) as advance:
        for start in range(0, len(ids), MAX_PAGE_SIZE):
            batch = ids[start : start + MAX_PAGE_SIZE]
            found = session.client.racks_by_id(batch)
            if found is None:
                return _rack_names_from_an_older_server(session, ids)
            names.update((r.id.id, r.name) for r in found)
            advance(len(batch))
    return names


# Racks read one by one (GetRack) from a server that takes no ids in ListRacks, rather than every rack.
FEW_RACKS = 100


def _rack_names_from_an_older_server(session: Session, rack_ids: Sequence[str]) -> dict[str, str]:
    """`rack_names` from a server of a release before ListRacksRequest.ids: each read by its id when they
    are few, else every rack's, a page at a time (`RackflowClient.all_racks`), as that release's CLI did."""
    names: dict[str, str] = {}
    if len(rack_ids) > FEW_RACKS:
        with session.progress("reading every rack's name", None) as advance:
            for rack in session.client.all_racks():
                names[rack.id.id] = rack.name
                advance(1)
        return names
    for rack_id in rack_ids:
        try:
            names[rack_id] = session.client.get_rack(rack_id).name
        except RackflowClientError as error:
            if error.code != grpc.StatusCode.NOT_FOUND:
                raise
    return names


def schedule_name(session: Session, schedule_id: str) -> str:
    """A schedule's name for people; its id when it is gone (deleted since), "" for no schedule."""
    if not schedule_id:
        return ""
    try:
        return session.client.get_schedule(schedule_id).name
    except RackflowClientError as exc:
        if exc.code != grpc.StatusCode.NOT_FOUND:
            raise
        return schedule_id


def tasks_table(tasks: Sequence[pb.Task], racks: dict[str, str], title: str | None = None) -> Listing:
    columns = ("ID", "OPERATION", "RACK", "STATUS", "CREATED", "FINISHED", free_text("MESSAGE"))
    result = table(*columns, title=title)
    for t in tasks:
        result.add_row(
            t.id.id,
            operation_label(t.operation),
            racks.get(t.rack_id.id, t.rack_id.id),
            styled_status(t.status),
            utc_text(when(t.created_at)),
            utc_text(when(t.finished_at)),
            t.message or "",
        )
    return result


def task_view(t: pb.Task, racks: dict[str, str], schedule: str) -> Table:
    """One task; `schedule` is the name of the schedule that submitted it (`schedule_name`)."""
    rows: list[tuple[str, RenderableType]] = [
        ("id", t.id.id),
        ("operation", operation_label(t.operation)),
        ("rack", racks.get(t.rack_id.id, t.rack_id.id)),
        ("components", str(len(t.component_ids)) if t.component_ids else "all"),
        ("status", styled_status(t.status)),
        ("message", t.message or "-"),
        ("description", t.description or "-"),
        ("created", utc_text(when(t.created_at))),
        ("started", utc_text(when(t.started_at))),
        ("finished", utc_text(when(t.finished_at))),
    ]
    if t.status == pb.TASK_STATUS_WAITING:
        rows.append(("queue expires", utc_text(when(t.queue_expires_at))))
    if t.schedule_id.id:
        rows.append(("schedule", schedule))
    if t.held_by:
        since = utc_text(when(t.held_since))
        rows.append(("held by", f"{t.held_by} since {since}: {t.held_reason}"))
    if t.HasField("refusal"):
        # Shown from the claim that refused it on: a RUNNING task with one is ending, not running.
        end = (
            "never ran" if t.status in FINISHED else f"ends {status_name(t.refusal.ends_as)} without running"
        )
        rows.append(("refused", f"by a start gate: {t.refusal.reason} ({end})"))
    if when(t.not_before):
        # The hold's end, no start time: the task is looked at again then (a check's hold ends at its
        # maximum wait, and the task fails then if the checks still hold it).
        until = utc_text(when(t.not_before))
        if t.held_by == HELD_BY_CHECKS:
            until += " (asked again then; it fails once a check's maximum wait has run out)"
        rows.append(("held at most until", until))
    if when(t.not_after):
        rows.append(("not after", utc_text(when(t.not_after))))
    if t.ignore_windows:
        rows.append(("windows", "ignored (submitted with --ignore-windows)"))
    if t.max_attempts > 1:
        # An ended task whose `attempt` has no record of its own ended before it began (cancelled during
        # its back-off, its window's end): said so, lest "2 of 3" beside TERMINATED read as a cut attempt.
        never = t.status in FINISHED and t.attempt not in {a.attempt for a in t.attempts}
        rows.append(
            (
                "attempt",
                f"{t.attempt} of {t.max_attempts}"
                + (" (never started: the task ended before it)" if never else ""),
            )
        )
    for c in t.checks:  # its pre-flight checks' answers in their last round
        answer = "passed" if c.passed else "holds it"
        reason = c.reason.removeprefix(f"pre-flight check {c.check!r}: ")
        rows.append(
            (f"check {c.check}", f"{answer} (round {c.round}, {utc_text(when(c.checked_at))}): {reason}")
        )
    for a in t.attempts:
        ended = "completed" if a.status == pb.TASK_STATUS_COMPLETED else f"{status_name(a.status)}"
        kind = " (retryable)" if a.retryable else ""
        error = f": {a.message}" if a.status != pb.TASK_STATUS_COMPLETED else ""
        rows.append(
            (
                f"attempt {a.attempt}",
                f"{utc_text(when(a.started_at))} - {utc_text(when(a.finished_at))} {ended}{kind}{error}",
            )
        )
    return details(rows)


def submitted_view(response: pb.SubmitTaskResponse) -> Stack:
    ids = table("TASK", title=f"submitted {counted(len(response.task_ids), 'task')}")
    for task_id in response.task_ids:
        ids.add_row(task_id.id)
    hint = "[dim]follow one with: rackflow task watch TASK[/]" if response.task_ids else ""
    return Stack(ids, hint)


# --- operations ----------------------------------------------------------------------------------


def _operation_command(
    operation: str, summary: str, example: str, extra: Sequence[Callable[[Any], Any]] = ()
) -> None:
    """Register `rackflow task <operation>` with the target, queue and description options."""

    def run(
        ctx: click.Context,
        targets: Targets,
        queue: bool,
        queue_timeout: int | None,
        description: str,
        ignore_windows: bool,
        **specific: Any,
    ) -> None:
        if queue_timeout is not None and not queue:
            # Without --queue a conflicting task is refused at once, so the timeout would do nothing.
            raise click.UsageError("--queue-timeout applies with --queue: add --queue, or drop the timeout")
        submit = valid(
            Operation(
                operation,
                targets,
                description,
                queue=queue,
                queue_timeout=queue_timeout or 0,
                ignore_windows=ignore_windows,
                **specific,
            )
        )
        session = pass_session(ctx)
        response = session.client.submit(submit)
        session.emit(response, lambda: submitted_view(response))

    run.__doc__ = f"{summary}\n\n\b\nExample:\n  {example}"
    command: Any = click.pass_context(run)
    description = click.option("--description", default="", help="Free text kept with each task.")
    ignore = click.option(
        "--ignore-windows", is_flag=True, help="Start even inside a FREEZE window (operator; audited)."
    )
    for decorate in (*extra, ignore, description, queue_options, target_options()):
        command = decorate(command)
    task.command(name=operation_label(operation))(command)


_forced = click.option("--forced", is_flag=True, help="Skip the graceful shutdown of the hosts.")
_version = click.option("--version", required=True, help="The firmware version to install.")
_start = click.option(
    "--start", callback=checked(parse_time), metavar="TIME", help="Maintenance window start (RFC 3339)."
)
_end = click.option("--end", callback=checked(parse_time), metavar="TIME", help="Maintenance window end.")

_operation_command(
    "power_on",
    "Power on racks or components (one task per rack).",
    "rackflow task power-on --rack rack-01 --types COMPUTE",
)
_operation_command(
    "power_off", "Power off racks or components.", "rackflow task power-off --domain nvl-a --queue", [_forced]
)
_operation_command(
    "power_reset",
    "Power-cycle racks or components.",
    "rackflow task power-reset --component COMPUTE:BMC-0042 --forced",
    [_forced],
)
_operation_command(
    "bring_up",
    "Bring racks up: power, discover and validate.",
    "rackflow task bring-up --rack rack-01 --rack rack-02",
)
_operation_command(
    "ingest", "Ingest racks: read their components and firmware.", "rackflow task ingest --rack rack-03"
)
_operation_command(
    "upgrade_firmware",
    "Upgrade firmware, optionally within a maintenance window.",
    "rackflow task upgrade-firmware --rack rack-01 --types NVSWITCH --version 2.4.1",
    [_version, _start, _end],
)


# --- tasks ---------------------------------------------------------------------------------------


@task.command(name="list")
@click.option("--rack", default="", metavar="NAME_OR_ID", help="Only tasks on this rack.")
@click.option("--schedule", default="", metavar="NAME_OR_ID", help="Only tasks this schedule submitted.")
@click.option("--active", is_flag=True, help="Only WAITING, PENDING and RUNNING tasks.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([s.lower() for s in TASK_STATUSES], case_sensitive=False),
    help="Only tasks in this status (repeat for several).",
)
@page_options(limit=50, noun="tasks", order="newest first")
@click.pass_context
def list_tasks(
    ctx: click.Context,
    rack: str,
    schedule: str,
    active: bool,
    statuses: tuple[str, ...],
    limit: int,
    offset: int,
    page_token: str,
) -> None:
    """List tasks, newest first.

    \b
    Example:
      rackflow task list --schedule nightly-reset --active
      rackflow task list --status failed --status terminated
    """
    if active and (idle := [s for s in statuses if not TaskStatus(s.lower()).is_active]):
        # Both filters apply (ListTasks): the list would be empty whatever the tasks are.
        raise click.UsageError(
            f"--active lists WAITING, PENDING and RUNNING tasks: --status {', '.join(idle)} is none of them"
        )
    session = pass_session(ctx)
    found = session.client.list_tasks(
        rack=rack,
        schedule=schedule,
        active_only=active,
        statuses=statuses,
        offset=offset,
        limit=limit,
        page_token=page_token,
    )
    title = page_title(len(found.tasks), found, "task")
    emit_page(
        session,
        found,
        lambda: tasks_table(found.tasks, rack_names(session, {t.rack_id.id for t in found.tasks}), title),
    )


@task.command()
@click.argument("task_ids", nargs=-1, required=True, metavar="ID...")
@click.pass_context
def show(ctx: click.Context, task_ids: tuple[str, ...]) -> None:
    """Show tasks by id.

    \b
    Example:
      rackflow task show 6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f
    """
    session = pass_session(ctx)
    found = session.client.get_tasks(task_ids)
    missing = sorted(set(task_ids) - {t.id.id for t in found.tasks})
    if missing:
        raise RackflowClientError(grpc.StatusCode.NOT_FOUND, f"task {missing[0]!r} not found")

    def view() -> Listing | Table:
        racks = rack_names(session, {t.rack_id.id for t in found.tasks})
        if len(found.tasks) == 1:
            return task_view(found.tasks[0], racks, schedule_name(session, found.tasks[0].schedule_id.id))
        return tasks_table(found.tasks, racks)

    session.emit(found, view)


@task.command()
@click.argument("task_id", metavar="ID")
@click.pass_context
def cancel(ctx: click.Context, task_id: str) -> None:
    """Cancel a task: it stops and becomes TERMINATED (a finished task cannot be cancelled).

    \b
    Example:
      rackflow task cancel 6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f
    """
    session = pass_session(ctx)
    response = session.client.cancel_task(task_id)
    session.emit(
        response,
        lambda: task_view(
            response.task,
            rack_names(session, {response.task.rack_id.id}),
            schedule_name(session, response.task.schedule_id.id),
        ),
    )


def watch_view(t: pb.Task, racks: dict[str, str], schedule: str, session: Session) -> RenderableType:
    now = session.clock.now()
    started = when(t.started_at) or when(t.created_at)
    since = f"started {relative_text(started, now)}" if started else ""
    headline: RenderableType
    if t.status in FINISHED:
        headline = f"{styled_status(t.status)} {t.message}"
    else:
        headline = Spinner("dots", text=f"{status_name(t.status)} {since}  {t.message}")
    return Stack(headline, "", task_view(t, racks, schedule))


@task.command()
@click.argument("task_id", metavar="ID")
@poll_interval_option()
@click.pass_context
def watch(ctx: click.Context, task_id: str, interval: int) -> None:
    """Follow a task until it finishes; exit 0 if it COMPLETED, 1 otherwise.

    \b
    Example:
      rackflow task watch 6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f && echo done
    """
    session = pass_session(ctx)
    current = session.client.get_task(task_id)
    racks = rack_names(session, {current.rack_id.id}) if session.for_people else {}
    schedule = schedule_name(session, current.schedule_id.id) if session.for_people else ""
    if session.for_people and session.console.is_terminal:
        with Live(
            watch_view(current, racks, schedule, session), console=session.console, refresh_per_second=8
        ) as live:
            while current.status not in FINISHED:
                session.sleep(interval)
                current = session.client.get_task(task_id)
                live.update(watch_view(current, racks, schedule, session))
    else:  # a pipe, a file or -o json|yaml: no animation, just the finished task
        while current.status not in FINISHED:
            session.sleep(interval)
            current = session.client.get_task(task_id)
        session.emit(current, lambda: watch_view(current, racks, schedule, session))
    ctx.exit(0 if current.status == pb.TASK_STATUS_COMPLETED else 1)
