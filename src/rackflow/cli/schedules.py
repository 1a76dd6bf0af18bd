"""`rackflow schedule …`: task schedules, their scopes, previews, runs and conflicts."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

import click
from google.protobuf.empty_pb2 import Empty
from rich.console import RenderableType
from rich.table import Table

from rackflow.cli.output import (
    Group,
    Listing,
    Session,
    component_type_name,
    details,
    free_text,
    operation_label,
    overlap_name,
    pass_session,
    relative_text,
    schedule_time_text,
    spec_text,
    table,
    utc_text,
    when,
    window_policy_name,
    zone_of,
    zoned_text,
)
from rackflow.cli.paging import emit_page, name_filter, page_options, page_title, searched_on
from rackflow.cli.requests import request_id_option, send_again
from rackflow.cli.rollouts import (
    FAILED_TASKS,
    approval_text,
    failed,
    failed_task_ids,
    hold_text,
    policy_from,
    policy_text,
    progress_text,
    retry_options,
    retry_policy_from,
    retry_text,
    rollout_options,
    task_messages,
)
from rackflow.cli.targets import checked, parse_seconds, parse_time, parse_zone, target_options, valid
from rackflow.cli.tasks import rack_names, submitted_view
from rackflow.client import (
    OPERATION_RPCS,
    VIEWS,
    Operation,
    Spec,
    Targets,
    operation_name,
    with_targets,
)
from rackflow.domain.firing import late_text
from rackflow.domain.inventory import short_search
from rackflow.timespec import parse_go_duration
from rackflow.v1 import flow_pb2 as pb

F = TypeVar("F", bound=Callable[..., Any])
_OPERATIONS = click.Choice([operation_label(o) for o in OPERATION_RPCS])


def _operation_callback(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    return operation_name(value) if value else None


@click.group(cls=Group)
def schedule() -> None:
    """Task schedules: run an operation on an interval, a cron calendar in a time zone, or once."""


def spec_options(*, required: bool) -> Callable[[F], F]:
    """--interval | --cron | --at, handed to the command as `spec: Spec | None`; --tz is passed as is."""
    options = [
        click.option("--interval", metavar="DURATION", help="Every DURATION (Go syntax: 30m, 24h, 1h30m)."),
        click.option("--cron", metavar="EXPR", help='A 5-field cron expression, e.g. "0 2 * * 1".'),
        click.option(
            "--tz",
            metavar="ZONE",
            callback=checked(parse_zone),
            help="IANA zone cron is read in and times are shown in (default UTC; previewing a schedule: "
            "the schedule's zone).",
        ),
        click.option("--at", metavar="TIME", help="Once, at an RFC 3339 time (2026-06-01T04:00:00Z)."),
    ]

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_spec(
            *args: Any, interval: str | None, cron: str | None, at: str | None, **kwargs: Any
        ) -> Any:
            spec = spec_from(interval, cron, kwargs["tz"], at)
            if spec is None and required:
                raise click.UsageError("give when it fires: --interval, --cron or --at")
            return command(*args, spec=spec, **kwargs)

        wrapped: Any = with_spec
        for option in reversed(options):
            wrapped = option(wrapped)
        return cast(F, wrapped)

    return decorate


def spec_from(interval: str | None, cron: str | None, tz: str | None, at: str | None) -> Spec | None:
    """The spec the options give (None when none is given); a usage error for more than one."""
    given = [
        (kind, value) for kind, value in (("interval", interval), ("cron", cron), ("one_time", at)) if value
    ]
    if len(given) > 1:
        raise click.UsageError("give one of --interval, --cron or --at")
    if not given:
        return None
    kind, value = given[0]
    return Spec(kind, value, tz or "")


def _state(s: pb.TaskSchedule) -> str:
    if s.enabled:
        return "[green]enabled[/]"
    return "paused" if when(s.next_run_at) else "[dim]done[/]"


def _pause_rows(s: pb.TaskSchedule, now: datetime) -> list[tuple[str, str]]:
    """Why, since when, by whom and until when a paused schedule is paused (nothing when not paused)."""
    if s.enabled or not s.HasField("paused_at"):
        return []
    by = f" by {s.paused_by}" if s.paused_by else ""
    rows = [("paused", f"{utc_text(when(s.paused_at))}{by}"), ("reason", s.pause_reason or "-")]
    resumes = "when resumed"
    if s.HasField("resume_at"):
        resumes = schedule_time_text(s.resume_at, s.spec.timezone, now)
    return [*rows, ("resumes", resumes)]


def schedules_table(
    schedules: Sequence[pb.TaskSchedule], session: Session, title: str | None = None
) -> Listing:
    now = session.clock.now()
    result = table(
        "NAME", free_text("OPERATION"), free_text("SPEC"), "STATE", "OVERLAP", "NEXT", "LAST", title=title
    )
    for s in schedules:
        result.add_row(
            s.name,
            s.summary,
            spec_text(s.spec),
            _state(s),
            overlap_name(s.overlap_policy),
            schedule_time_text(s.next_run_at, s.spec.timezone, now) if s.enabled else "-",
            utc_text(when(s.last_run_at)),
        )
    return result


def schedule_view(s: pb.TaskSchedule, session: Session) -> Table:
    now = session.clock.now()
    return details(
        [
            ("name", s.name),
            ("id", s.id.id),
            ("operation", s.summary),
            ("spec", spec_text(s.spec)),
            ("state", _state(s)),
            *_pause_rows(s, now),
            ("overlap", overlap_name(s.overlap_policy)),
            ("windows", window_policy_name(s.window_policy)),
            ("next", schedule_time_text(s.next_run_at, s.spec.timezone, now) if s.enabled else "-"),
            ("last", schedule_time_text(s.last_run_at, s.spec.timezone, now)),
            ("rollout", policy_text(s.rollout) if s.HasField("rollout") else "-"),
            (
                "approval",
                f"{s.approval.min_approvers} approver(s) within {s.approval.timeout}"
                if s.HasField("approval")
                else "-",
            ),
            ("last edited by", s.last_edited_by or "-"),
            ("start deadline", _deadline_text(s.start_deadline)),
            (
                "pause after",
                f"{s.pause_after_failed_runs} failing runs" if s.pause_after_failed_runs else "-",
            ),
            ("retries", retry_text(s.retry) if s.HasField("retry") else "-"),
            ("description", s.description or "-"),
            ("created", utc_text(when(s.created_at))),
            ("updated", utc_text(when(s.updated_at))),
        ]
    )


def _deadline_text(deadline: str) -> str:
    if not deadline:
        return "server default"
    return "none" if deadline == "0s" else deadline


_deadline_option = click.option(
    "--start-deadline",
    default=None,
    metavar="DURATION",
    help="Record a firing found later than its slot plus this as missed, submitting nothing (Go duration; "
    '"0s": none, whatever the server default; "" the server default). docs/SAFETY.md',
)
_pause_after_option = click.option(
    "--pause-after-failed-runs",
    type=int,
    default=None,
    metavar="N",
    help="Pause the schedule after N consecutive runs with a failed rack (0: never).",
)


def _show(ctx: click.Context, call: Callable[[Session], pb.TaskSchedule]) -> None:
    session = pass_session(ctx)
    found = call(session)
    session.emit(found, lambda: schedule_view(found, session))


_name_or_id = click.argument("schedule_ref", metavar="NAME_OR_ID")
_approval_timeout = click.option(
    "--approval-timeout",
    metavar="DURATION",
    help="Each firing awaits approval, expiring after DURATION (4h); docs/SAFETY.md.",
)
_min_approvers = click.option(
    "--min-approvers", type=int, metavar="N", help="With approval: N distinct approvers (default 1)."
)


def _approval(timeout: str | None, min_approvers: int | None) -> pb.ApprovalPolicy | None:
    """The approval policy the flags give (None: no flag); the server checks it and names the field."""
    if timeout is None and min_approvers is None:
        return None
    return pb.ApprovalPolicy(required=True, timeout=timeout or "", min_approvers=min_approvers or 0)


_overlap_help = "A scope whose last task is still active: skip it, or queue behind it."
_window_help = "A rack maintenance windows close at a firing: skip it, or defer its task to the next opening."


@schedule.command()
@click.argument("name")
@spec_options(required=True)
@click.option(
    "--op",
    "operation",
    type=_OPERATIONS,
    callback=_operation_callback,
    required=True,
    help="The operation to run.",
)
@target_options()
@click.option(
    "--overlap", type=click.Choice(["skip", "queue"]), default="skip", show_default=True, help=_overlap_help
)
@click.option(
    "--window-policy",
    type=click.Choice(["skip", "defer"]),
    default="skip",
    show_default=True,
    help=_window_help,
)
@click.option("--forced", is_flag=True, help="power-off / power-reset: skip the graceful shutdown.")
@click.option("--version", default="", help="upgrade-firmware: the version to install.")
@click.option(
    "--queue-timeout",
    callback=checked(parse_seconds),
    metavar="DURATION",
    help="With --overlap queue: how long a queued task may wait (server default 1h).",
)
@click.option("--description", default="", help="Free text kept with the schedule's tasks.")
@_deadline_option
@_pause_after_option
@rollout_options(removable=False)
@_approval_timeout
@_min_approvers
@retry_options(removable=False)
@click.pass_context
def create(
    ctx: click.Context,
    name: str,
    spec: Spec,
    tz: str | None,  # already in `spec`
    operation: str,
    targets: Targets,
    overlap: str,
    window_policy: str,
    forced: bool,
    version: str,
    queue_timeout: int | None,
    description: str,
    start_deadline: str | None,
    pause_after_failed_runs: int | None,
    rollout: dict[str, Any] | None,
    approval_timeout: str | None,
    min_approvers: int | None,
    retry: dict[str, Any] | None,
) -> None:
    """Create a schedule; its targets become the schedule's scope.

    With any rollout flag, each firing rolls out: in waves within the caps, canaries first, halting
    when too many racks failed (docs/ROLLOUTS.md). With --approval-timeout, each firing awaits approval
    (`rackflow run approve`) before anything starts; with --retries, a task whose failure the backend calls
    retryable is tried again after a back-off (docs/SAFETY.md).

    \b
    Example:
      rackflow schedule create nightly-reset --cron "0 2 * * *" --tz America/Los_Angeles \\
          --op power-reset --rack rack-01 --rack rack-02 --types COMPUTE
      rackflow schedule create daily-ingest --interval 24h --op ingest --domain nvl-a
      rackflow schedule create fw-2-1 --at 2026-06-01T04:00:00Z --op upgrade-firmware --version 2.1 \\
          --domain nvl-a --domain nvl-b --max-per-domain 1 --canary 2 --bake 15m --halt-after 2
      rackflow schedule create fw-2-2 --cron "0 3 * * SAT" --op upgrade-firmware --version 2.2 \\
          --domain nvl-a --approval-timeout 4h --min-approvers 2
      rackflow schedule create nightly-off --cron "0 1 * * *" --op power-off --rack rack-01 \\
          --start-deadline 15m --pause-after-failed-runs 3
      rackflow schedule create nightly-on --cron "0 6 * * *" --op power-on --domain nvl-a \\
          --retries 3 --retry-backoff 1m
    """
    run = valid(
        Operation(
            operation, targets, description, forced=forced, version=version, queue_timeout=queue_timeout or 0
        )
    )
    policy = policy_from(rollout) if rollout is not None else None
    retry_policy = retry_policy_from(retry) if retry is not None else None
    _show(
        ctx,
        lambda session: session.client.create_schedule(
            name,
            spec,
            run,
            overlap=overlap,
            window_policy=window_policy,
            rollout=policy,
            approval=_approval(approval_timeout, min_approvers),
            start_deadline=start_deadline or "",
            pause_after_failed_runs=pause_after_failed_runs or 0,
            retry=retry_policy,
        ),
    )


@schedule.command()
@_name_or_id
@click.pass_context
def show(ctx: click.Context, schedule_ref: str) -> None:
    """Show a schedule, its next firing in UTC and in its own zone.

    \b
    Example:
      rackflow schedule show nightly-reset -o yaml
    """
    _show(ctx, lambda session: session.client.get_schedule(schedule_ref))


@schedule.command(name="list")
@click.option("--rack", default="", metavar="NAME_OR_ID", help="Only schedules with this rack in scope.")
@click.option("--enabled-only", is_flag=True, help="Leave out paused and finished schedules.")
@click.option("--paused-only", is_flag=True, help="Only paused (and finished) schedules.")
@name_filter("schedules")
@click.option("--op", "operation", type=_OPERATIONS, default=None, help="Only schedules of this operation.")
@click.option(
    "--sort",
    default="",
    metavar="FIELD",
    help="created_at (default), name, next_run_at or last_run_at; add ' desc' to reverse.",
)
@page_options(limit=0, noun="schedules", order="in the --sort order")
@click.pass_context
def list_schedules(
    ctx: click.Context,
    rack: str,
    enabled_only: bool,
    paused_only: bool,
    name_contains: str,
    operation: str | None,
    sort: str,
    limit: int,
    offset: int,
    page_token: str,
) -> None:
    """List schedules, oldest first (or as --sort says), with their next firing.

    \b
    Example:
      rackflow schedule list --rack rack-01 --enabled-only
      rackflow schedule list --name-contains nightly --sort "next_run_at"
    """
    session = pass_session(ctx)

    def page(limit: int, page_token: str, offset: int = offset) -> pb.ListTaskSchedulesResponse:
        return session.client.list_schedules(
            rack=rack,
            enabled_only=enabled_only,
            paused_only=paused_only,
            name_contains=name_contains,
            operation=operation or "",
            order_by=sort,
            offset=offset,
            limit=limit,
            page_token=page_token,
        )

    found = (
        searched_on(session, page, limit, page_token, "task_schedules")
        if short_search(name_contains)
        else page(limit, page_token)
    )
    title = page_title(len(found.task_schedules), found, "schedule")
    emit_page(session, found, lambda: schedules_table(found.task_schedules, session, title))


@schedule.command()
@_name_or_id
@click.option("--name", default=None, help="A new name.")
@spec_options(required=False)
@click.option("--overlap", type=click.Choice(["skip", "queue"]), default=None, help="A new overlap policy.")
@click.option(
    "--window-policy", type=click.Choice(["skip", "defer"]), default=None, help="A new window policy."
)
@_deadline_option
@_pause_after_option
@rollout_options(removable=True)
@_approval_timeout
@_min_approvers
@click.option("--no-approval", is_flag=True, help="Firings no longer await approval.")
@retry_options(removable=True)
@click.pass_context
def update(
    ctx: click.Context,
    schedule_ref: str,
    name: str | None,
    spec: Spec | None,
    tz: str | None,
    overlap: str | None,
    window_policy: str | None,
    start_deadline: str | None,
    pause_after_failed_runs: int | None,
    rollout: dict[str, Any] | None,
    no_rollout: bool,
    approval_timeout: str | None,
    min_approvers: int | None,
    no_approval: bool,
    retry: dict[str, Any] | None,
    no_retries: bool,
) -> None:
    """Change a schedule's name, timing, overlap, rollout or retry policy (its operation and scope stay).

    --tz alone changes only the zone of the current spec. Rollout flags change only what they name in
    the current rollout policy (or start one); --no-rollout removes it. Retry flags and --no-retries
    do the same for the retry policy.

    \b
    Example:
      rackflow schedule update nightly-reset --cron "30 3 * * *" --tz Europe/Berlin
      rackflow schedule update fw-2-1 --halt-after 10% --no-pause-on-halt
      rackflow schedule update nightly-reset --start-deadline 15m --pause-after-failed-runs 3
      rackflow schedule update nightly-on --retries 5
    """
    if no_rollout and rollout is not None:
        raise click.UsageError("--no-rollout removes the rollout policy: give no other rollout flag with it")
    if no_retries and retry is not None:
        raise click.UsageError("--no-retries removes the retry policy: give no other retry flag with it")
    if (
        name is None
        and spec is None
        and tz is None
        and overlap is None
        and window_policy is None
        and start_deadline is None
        and pause_after_failed_runs is None
        and rollout is None
        and not no_rollout
        and approval_timeout is None
        and min_approvers is None
        and not no_approval
        and retry is None
        and not no_retries
    ):
        raise click.UsageError(
            "nothing to change: give --name, --interval/--cron/--at, --tz, --overlap, --window-policy, "
            "--start-deadline, --pause-after-failed-runs, a rollout flag, --no-rollout, an approval flag, "
            "--no-approval, a retry flag or --no-retries"
        )
    if no_approval and (approval_timeout is not None or min_approvers is not None):
        raise click.UsageError(
            "--no-approval removes the approval policy: give no other approval flag with it"
        )

    def call(session: Session) -> pb.TaskSchedule:
        policy = retry_policy = approval = None
        if any(flag is not None for flag in (rollout, retry, approval_timeout, min_approvers)):
            current = session.client.get_schedule(schedule_ref)
            if rollout is not None:
                policy = policy_from(rollout, current.rollout if current.HasField("rollout") else None)
            if retry is not None:
                retry_policy = retry_policy_from(retry, current.retry if current.HasField("retry") else None)
            if approval_timeout is not None or min_approvers is not None:
                approval = _approval(
                    approval_timeout or current.approval.timeout,
                    min_approvers if min_approvers is not None else current.approval.min_approvers,
                )
        return session.client.update_schedule(
            schedule_ref,
            name=name,
            spec=spec,
            timezone=tz,
            overlap=overlap,
            window_policy=window_policy,
            rollout=policy,
            remove_rollout=no_rollout,
            approval=approval,
            remove_approval=no_approval,
            start_deadline=start_deadline,
            pause_after_failed_runs=pause_after_failed_runs,
            retry=retry_policy,
            remove_retry=no_retries,
        )

    _show(ctx, call)


@schedule.command()
@_name_or_id
@click.option("--reason", default="", help="Why, for the next operator (shown by `schedule show`).")
@click.option("--until", callback=checked(parse_time), help="Resume by itself at this RFC 3339 time.")
@click.option("--for", "for_", callback=checked(parse_seconds), help="Resume by itself after this long (2h).")
@click.pass_context
def pause(
    ctx: click.Context, schedule_ref: str, reason: str, until: datetime | None, for_: int | None
) -> None:
    """Stop a schedule from firing until it is resumed (its running tasks continue).

    With --until or --for, rackflow resumes it at that time exactly as `schedule resume` would. Pausing a
    paused schedule with a new reason or end replaces its pause, both together: without --until or --for
    the automatic resume is removed (the command says so), so give the end again to keep one.

    \b
    Example:
      rackflow schedule pause nightly-reset --reason "rack-07 PSU swap, INC-4411" --for 2h
      rackflow schedule pause fw-rollout --until 2026-12-24T06:00:00Z --reason "holiday freeze"
    """
    if until is not None and for_ is not None:
        raise click.UsageError("give one of --until or --for")
    if for_ == 0:
        raise click.BadParameter(
            "must be longer than 0s (a pause that ends as it begins)", param_hint="--for"
        )
    session = pass_session(ctx)
    resume_at = until if for_ is None else session.clock.now() + timedelta(seconds=for_)

    def call(session: Session) -> pb.TaskSchedule:
        # Only a re-pause that leaves something out can remove it: the schedule is read first then.
        before = session.client.get_schedule(schedule_ref) if not (reason and resume_at) else None
        paused = session.client.pause_schedule(schedule_ref, reason=reason, resume_at=resume_at)
        if before is not None and (reason or resume_at is not None):
            for note in _removed_by_pause(before, reason, resume_at):
                click.echo(f"note: {note}", err=True)
        return paused

    _show(ctx, call)


def _removed_by_pause(before: pb.TaskSchedule, reason: str, resume_at: datetime | None) -> list[str]:
    """What a new pause of `before` (paused) removes, said for people: the pause is replaced whole, its
    reason and end together (docs/SCHEDULES.md), and an automatic resume lost without a word left a
    schedule paused for good when an operator only meant to update its reason."""
    if before.enabled or not before.HasField("paused_at"):
        return []
    notes = []
    if resume_at is None and before.HasField("resume_at"):
        notes.append(
            f"this pause has no end, so its automatic resume at {utc_text(when(before.resume_at))} was "
            f"removed: {before.name} stays paused until resumed; give --until or --for to keep one"
        )
    if not reason and before.pause_reason:
        notes.append(f"this pause has no reason, so its reason {before.pause_reason!r} was removed")
    return notes


@schedule.command()
@_name_or_id
@click.pass_context
def resume(ctx: click.Context, schedule_ref: str) -> None:
    """Let a paused schedule fire again, from its next time after now.

    \b
    Example:
      rackflow schedule resume nightly-reset
    """
    _show(ctx, lambda session: session.client.resume_schedule(schedule_ref))


@schedule.command()
@_name_or_id
@click.pass_context
def delete(ctx: click.Context, schedule_ref: str) -> None:
    """Delete a schedule and its scope; tasks it already submitted are not cancelled.

    \b
    Example:
      rackflow schedule delete nightly-reset
    """
    session = pass_session(ctx)
    session.client.delete_schedule(schedule_ref)
    session.emit(Empty(), lambda: f"deleted schedule {schedule_ref}")


@schedule.command()
@_name_or_id
@click.option(
    "--approve",
    is_flag=True,
    help="For a schedule that needs approval: approve this firing as you trigger it (approver role).",
)
@request_id_option("trigger")
@click.pass_context
def trigger(ctx: click.Context, schedule_ref: str, approve: bool, request_id: str | None) -> None:
    """Fire a schedule now, on every scope, whatever its overlap policy or pause.

    Safe to run again: the trigger carries a request id (--request-id, else a new one), and is sent again
    with it, up to 4 times, when its answer is lost (UNAVAILABLE, DEADLINE_EXCEEDED; said on stderr): the
    server fires it once and answers each time with the tasks that firing submitted. When the answer is an
    earlier request's, stderr says so ("request ID had already fired run RUN at TIME: nothing new fired");
    when a try sent again fired, that it fired now.

    When every scope fails, exits 1 naming each rack and why (the firing is still in `schedule runs`);
    sent again, that refusal is the earlier request's answer, and stderr says so ("request ID had already
    fired run RUN at TIME: it submitted no task; nothing new fired").
    A schedule that needs approval records the firing awaiting it (`rackflow run approve RUN_ID`), unless
    --approve counts your approval.

    \b
    Example:
      rackflow schedule trigger nightly-reset
      rackflow schedule trigger fw-2-2 --approve
      rackflow schedule trigger nightly-reset --request-id change-4711
    """
    session = pass_session(ctx)
    response = send_again(
        lambda rid: session.client.trigger_schedule(schedule_ref, approve=approve, request_id=rid),
        request_id,
        session.sleep,
        lambda answer: answer.run_id.id,
    )

    def view() -> RenderableType:
        if not response.task_ids:
            (latest,) = session.client.list_runs(schedule_ref, limit=1).runs or (None,)
            if latest is not None and latest.state == "awaiting_approval":
                hint = f"[dim]rackflow run approve {latest.id.id}[/]"
                return f"run {latest.id.id}: {approval_text(latest)}\n{hint}"
        return submitted_view(response)

    session.emit(response, view)


@schedule.command()
@click.argument("schedule_ref", metavar="[NAME_OR_ID]", required=False)
@spec_options(required=False)
@click.option("-n", "count", default=10, show_default=True, help="How many times (at most 100).")
@click.option(
    "--after",
    callback=checked(parse_time),
    metavar="TIME",
    # A saved schedule never fires before its next_run_at (nor before now): an earlier --after is that.
    help="Start after this time (default now); a schedule's preview starts at its next firing at the "
    "earliest.",
)
@click.option(
    "--resume-at",
    callback=checked(parse_time),
    metavar="TIME",
    help="A schedule: as if paused until this time, showing the slots a late resume would miss.",
)
@click.pass_context
def preview(
    ctx: click.Context,
    schedule_ref: str | None,
    spec: Spec | None,
    tz: str | None,
    count: int,
    after: datetime | None,
    resume_at: datetime | None,
) -> None:
    """Show when a spec would fire, in UTC and in its zone, before creating a schedule; or, for an existing
    schedule, what each of its next firings will do on each rack (fire, skip for a window, defer to an
    opening, paused, or missed past its start deadline), decided as the dispatcher decides, in UTC and in
    the schedule's zone (or --tz).

    \b
    Example:
      rackflow schedule preview --cron "0 2 * * *" --tz America/Los_Angeles -n 5
      rackflow schedule preview nightly-reset -n 14 --tz Europe/Berlin
      rackflow schedule preview fw-2-1 --resume-at 2026-06-01T09:00:00Z
    """
    session = pass_session(ctx)
    if resume_at is not None and schedule_ref is None:
        raise click.UsageError("--resume-at previews a schedule: give its NAME_OR_ID")
    if schedule_ref is not None:
        if spec is not None:
            raise click.UsageError("give a schedule or a spec (--interval, --cron, --at), not both")
        planned = session.client.preview_schedule(schedule_ref, count=count, after=after, resume_at=resume_at)
        if session.for_people and tz is None:
            tz = session.client.get_schedule(schedule_ref).spec.timezone
        zone = tz or "UTC"
        session.emit(planned, lambda: planned_table(planned, zone))
        return
    if spec is None:
        raise click.UsageError("give a schedule, or when it fires: --interval, --cron or --at")
    found = session.client.preview(spec, count=count, after=after)

    def view() -> Listing:
        now = session.clock.now()
        zone = tz or "UTC"
        result = table("#", "UTC", zone_of(zone).key, "WHEN")
        for index, ts in enumerate(found.times, start=1):
            moment = ts.ToDatetime(tzinfo=UTC)
            result.add_row(str(index), utc_text(moment), zoned_text(moment, zone), relative_text(moment, now))
        return result

    session.emit(found, view)


def _decision_text(decision: pb.ScopeDecision, zone: str) -> str:
    if decision.decision == "fire":  # inside an ALLOW window, its task must start before that closes
        closes = when(decision.closes_at)
        return f"[green]fire[/] (by {zoned_text(closes, zone)})" if closes else "[green]fire[/]"
    if decision.decision == "skip_overlap":
        return "[yellow]skip[/] (still running)"
    if decision.decision == "skip_window":
        return f"[yellow]skip[/] ({decision.window_name})"
    if decision.decision == "defer":
        return f"defer → {zoned_text(when(decision.until), zone)}"
    if decision.decision == "missed":
        return "[red]missed[/] (past the start deadline)"
    if decision.decision == "skip_run":  # the whole firing: its reason says why
        return f"[yellow]skip[/] ({_skipped_whole_because(decision.reason)})"
    until = when(decision.until)
    return f"[dim]paused{f' until {zoned_text(until, zone)}' if until else ''}[/]"


def _skipped_whole_because(reason: str) -> str:
    """Why a whole firing is skipped, in a word or two, from its reason (`domain.firing`: the schedule's
    operation's window ended, its previous run awaits approval, or its previous rollout is live)."""
    if reason.startswith("its firmware window ended"):
        return "firmware window ended"
    return "awaiting approval" if "approval" in reason else "rollout live"


# Up to this many racks are columns, one decision a cell; more, and each firing lists its racks by decision.
PREVIEW_COLUMNS = 6


def planned_table(planned: pb.PreviewTaskScheduleResponse, zone: str) -> Listing:
    """A row per firing, in UTC and in `zone` (decision times too): a column per rack, or, for many racks,
    the racks grouped by what the firing does to them; racks by name, the order a rollout starts them in
    (the server sends them in scope order, which reads as a shuffle). With an approval policy, APPROVAL
    marks each firing that would await approval before anything of it starts (`needs_approval`: not a
    missed one)."""
    racks = sorted({d.rack_name for f in planned.firings for d in f.scopes})
    few = len(racks) <= PREVIEW_COLUMNS
    approvals = any(f.needs_approval for f in planned.firings)
    result = table(
        "FIRES (UTC)",
        zone_of(zone).key,
        *(["APPROVAL"] if approvals else []),
        *(racks if few else [free_text("RACKS")]),
    )
    for firing in planned.firings:
        moment = firing.at.ToDatetime(tzinfo=UTC)
        decided = {d.rack_name: _decision_text(d, zone) for d in firing.scopes}
        if few:
            cells = [decided.get(rack, "-") for rack in racks]
        else:
            by_decision: dict[str, list[str]] = {}
            for rack, text in sorted(decided.items()):
                by_decision.setdefault(text, []).append(rack)
            cells = ["; ".join(f"{text}: {', '.join(names)}" for text, names in by_decision.items())]
        marked = ["awaits approval" if firing.needs_approval else "-"] if approvals else []
        result.add_row(utc_text(moment), zoned_text(moment, zone), *marked, *cells)
    return result


def runs_table(found: pb.ListTaskScheduleRunsResponse, messages: dict[str, str]) -> Listing:
    """One run a row: TASKS the racks it submitted a task to, FAILED the racks whose submission or task
    failed, SKIPPED the racks it left alone (overlap or window), HELD the racks whose task a gate or
    window holds now; ERROR why it halted, or the first failed submission's error, or the first failed
    task's message (`messages`, by task id), or else what holds the first held rack and why."""
    columns = (
        "RUN",
        "FIRED",
        "STATE",
        "LATE",
        "TASKS",
        "FAILED",
        "SKIPPED",
        "HELD",
        free_text("ROLLOUT"),
        free_text("ERROR"),
    )
    result = table(*columns, title=page_title(len(found.runs), found, "run"))
    for run in found.runs:
        fired = utc_text(when(run.fired_at)) + (f" ({run.trigger})" if run.trigger != "dispatch" else "")
        failed_tasks = (messages.get(task_id, "") for task_id in failed_task_ids(run))
        held = [hold_text(o) for o in run.outcomes if o.held_by]
        error = (
            run.reason
            or (approval_text(run) if run.state == "awaiting_approval" else "")
            or next((o.error for o in run.outcomes if o.error), "")
            or next(failed_tasks, "")
            or next(iter(held), "")
        )
        result.add_row(
            run.id.id + _part_text(run),
            fired,
            run.state,
            late_text(timedelta(microseconds=parse_go_duration(run.late_by) // 1000)) if run.late_by else "-",
            *(_counted(run) if run.outcome_counts else _listed(run, held)),
            progress_text(run) or "-",
            error,
        )
    return result


def _part_text(run: pb.TaskScheduleRun) -> str:
    """ " (racks 501-1000 of 10000)" for a part of a run (a FULL page carries at most 500 racks' outcomes:
    the next page goes on with the same run), "" for a run whole."""
    if not run.outcomes or len(run.outcomes) >= run.outcome_count:
        return ""
    return f" (racks {run.first_outcome + 1}-{run.first_outcome + len(run.outcomes)} of {run.outcome_count})"


def _listed(run: pb.TaskScheduleRun, held: Sequence[str]) -> tuple[str, str, str, str]:
    """TASKS, FAILED, SKIPPED and HELD of a run whose outcomes came whole (the FULL view)."""
    return (
        str(sum(o.outcome == "submitted" for o in run.outcomes)),
        str(sum(failed(o) for o in run.outcomes)),
        str(sum(o.outcome.startswith("skipped") for o in run.outcomes)),
        str(len(held)),
    )


def _counted(run: pb.TaskScheduleRun) -> tuple[str, str, str, str]:
    """The same from a BASIC view's counts: `failed` per rack, as its submission failed or its task
    failed or was terminated (but for the tasks of racks under another outcome than submitted: a
    cancelled rollout's, terminated before they began, as `failed` says); HELD is not counted ("-":
    `rackflow run show` lists the held racks)."""
    racks = {c.outcome: c.racks for c in run.outcome_counts}
    failed_tasks = sum(c.tasks for c in run.task_counts if c.status in FAILED_TASKS)
    not_begun = sum(c.with_task for c in run.outcome_counts if c.outcome != "submitted")
    return (
        str(racks.get("submitted", 0)),
        str(racks.get("failed", 0) + max(0, failed_tasks - not_begun)),
        str(sum(n for outcome, n in racks.items() if outcome.startswith("skipped"))),
        "-",
    )


@schedule.command()
@_name_or_id
@page_options(limit=20, noun="runs", order="newest first")
@click.option(
    "--view",
    type=click.Choice(VIEWS),
    default="full",
    show_default=True,
    help="basic: count each run's racks instead of listing them (a schedule of thousands of racks).",
)
@click.pass_context
def runs(ctx: click.Context, schedule_ref: str, limit: int, offset: int, page_token: str, view: str) -> None:
    """Show a schedule's recent firings and what each did per scope (a rollout: its progress; follow
    one with `rackflow run show RUN_ID --watch`).

    TASKS counts the racks a task was submitted to, FAILED the racks whose submission or task failed
    (or was terminated), SKIPPED the racks left alone (overlap or window), HELD the racks whose task
    waits, held by a start gate (freeze, budget, pre-flight check) or its window; ERROR says why (a
    failure first, else what holds the first held rack: `rackflow run show` lists each).

    A page lists at most 500 racks' outcomes: a run of more comes in parts, a page each, its RUN saying
    which racks ("racks 1-500 of 10000") and the counts those racks'. With --view basic each run's racks
    are counted by the server instead of listed, the whole run at once; HELD is then "-".

    \b
    Example:
      rackflow schedule runs nightly-reset -o json
      rackflow schedule runs big-fleet --view basic
    """
    session = pass_session(ctx)
    found = session.client.list_runs(
        schedule_ref, offset=offset, limit=limit, page_token=page_token, view=view
    )

    def shown() -> Listing:
        first_failed = [ids[0] for ids in map(failed_task_ids, found.runs) if ids]
        return runs_table(found, task_messages(session, first_failed))

    emit_page(session, found, shown)


@schedule.command()
@click.argument("schedule_ref", metavar="[NAME_OR_ID]", required=False)
@click.option(
    "--op",
    "operation",
    type=_OPERATIONS,
    callback=_operation_callback,
    help="The proposed operation (without NAME_OR_ID).",
)
@target_options(required=False)
@click.option("--exclude", default="", metavar="NAME_OR_ID", help="Leave this schedule out of the check.")
@click.pass_context
def conflicts(
    ctx: click.Context, schedule_ref: str | None, operation: str | None, targets: Targets | None, exclude: str
) -> None:
    """List enabled schedules on the same racks whose operation could collide with this one (advisory).

    The task manager's conflict rules decide, taking both operations to touch the whole rack: it may
    report a pair that would run side by side, never one that could collide.

    Check a proposal (--op and targets) or an existing schedule (NAME_OR_ID: its operation and scope).

    \b
    Example:
      rackflow schedule conflicts --op power-reset --rack rack-01
      rackflow schedule conflicts nightly-reset
    """
    session = pass_session(ctx)
    if schedule_ref:
        if operation or targets:
            raise click.UsageError("give NAME_OR_ID or --op with targets, not both")
        existing = session.client.get_schedule(schedule_ref)
        scope_racks = [s.rack_id.id for s in session.client.list_scopes(existing.id.id).scopes]
        proposal: Operation | pb.ScheduledOperation = with_targets(
            existing.operation, Targets(racks=scope_racks)
        )
        exclude = exclude or existing.id.id
    elif operation and targets:
        proposal = valid(Operation(operation, targets))
    else:
        raise click.UsageError("give NAME_OR_ID, or --op with targets")
    found = session.client.check_conflicts(proposal, exclude=exclude)

    def view() -> Listing | str:
        return schedules_table(found.conflicts, session, "conflicts") if found.conflicts else "no conflicts"

    session.emit(found, view)


# --- scope ---------------------------------------------------------------------------------------


@schedule.group(cls=Group)
def scope() -> None:
    """The racks (and component filters) a schedule acts on."""


def _filter_text(entry: pb.TaskScheduleScope) -> str:
    kind = entry.WhichOneof("component_filter")
    if kind == "types":
        return ",".join(component_type_name(t) for t in entry.types.types)
    if kind == "components":
        return f"{len(entry.components.targets)} listed"
    return "all"


def scopes_view(
    scopes: Sequence[pb.TaskScheduleScope], session: Session, title: str | None = None
) -> Listing:
    named = all(entry.rack_name for entry in scopes)  # a list's page names its racks; add/update do not
    racks = {} if named else rack_names(session, {entry.rack_id.id for entry in scopes})
    result = table("ID", "RACK", "COMPONENTS", "LAST TASK", "CREATED", title=title)
    for entry in scopes:
        rack = entry.rack_name or racks.get(entry.rack_id.id, entry.rack_id.id)
        created = utc_text(when(entry.created_at))
        result.add_row(entry.id.id, rack, _filter_text(entry), entry.last_task_id.id or "-", created)
    return result


@scope.command()
@_name_or_id
@target_options()
@click.pass_context
def add(ctx: click.Context, schedule_ref: str, targets: Targets) -> None:
    """Add racks to a schedule's scope (filters of racks already in scope are merged).

    \b
    Example:
      rackflow schedule scope add nightly-reset --rack rack-03 --types COMPUTE
    """
    session = pass_session(ctx)
    found = session.client.add_scope(schedule_ref, targets)
    session.emit(found, lambda: scopes_view(found.scopes, session))


@scope.command(name="update")
@_name_or_id
@target_options()
@click.pass_context
def update_scope(ctx: click.Context, schedule_ref: str, targets: Targets) -> None:
    """Replace a schedule's scope with exactly these targets.

    \b
    Example:
      rackflow schedule scope update nightly-reset --rack rack-01 --rack rack-04
    """
    session = pass_session(ctx)
    found = session.client.update_scope(schedule_ref, targets)
    title = f"added {found.added}, removed {found.removed}, updated {found.updated}"
    session.emit(found, lambda: scopes_view(found.scopes, session, title))


@scope.command()
@click.argument("scope_id", metavar="SCOPE_ID")
@click.pass_context
def remove(ctx: click.Context, scope_id: str) -> None:
    """Remove one scope entry (see `schedule scope list`); the last one cannot be removed.

    \b
    Example:
      rackflow schedule scope remove 2a7e4c1b-9f3d-4e8a-b6c5-1d2e3f4a5b6c
    """
    session = pass_session(ctx)
    session.client.remove_scope(scope_id)
    session.emit(Empty(), lambda: f"removed scope {scope_id}")


@scope.command(name="list")
@_name_or_id
@page_options(limit=0, noun="scope entries", order="by rack id")
@click.pass_context
def list_scopes(ctx: click.Context, schedule_ref: str, limit: int, offset: int, page_token: str) -> None:
    """List a schedule's scope: one entry per rack, in rack id order (a page token continues it).

    \b
    Example:
      rackflow schedule scope list nightly-reset
      rackflow schedule scope list big-fleet --limit 500
    """
    session = pass_session(ctx)
    found = session.client.list_scopes(schedule_ref, offset=offset, limit=limit, page_token=page_token)
    title = page_title(len(found.scopes), found, "scope entry", "scope entries")
    emit_page(session, found, lambda: scopes_view(found.scopes, session, title))
