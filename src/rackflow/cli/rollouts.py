"""Rollouts from the command line: the policy flags of `schedule create/update`, a run's progress in
`schedule runs`, and `rackflow run show|resume|cancel|retry` for one run (`show --watch` follows it
live), `rackflow run approve|reject` for a run awaiting approval, and the retry policy's flags of
`schedule create/update` (docs/SAFETY.md)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from rich.console import Group as Stack
from rich.console import RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar

from rackflow.api.convert.policies import retry_policy_from as retry_policy_from_pb
from rackflow.api.convert.policies import rollout_of
from rackflow.api.tasks import MAX_TASK_IDS
from rackflow.cli.output import (
    Group,
    Session,
    details,
    free_text,
    pass_session,
    styled_status,
    table,
    utc_text,
    when,
)
from rackflow.cli.requests import request_id_option, send_again
from rackflow.cli.targets import checked, poll_interval_option
from rackflow.cli.tasks import rack_names, schedule_name
from rackflow.domain.rollouts import bakes_without_canaries
from rackflow.v1 import flow_pb2 as pb

F = TypeVar("F", bound=Callable[..., Any])

# A run in one of these states changes no more, except for its started tasks ending.
LIVE_STATES = ("rolling", "halted", "running")


def parse_halt(value: str) -> tuple[int, float]:
    """`--halt-after 3` (racks) or `--halt-after 10%` (of the racks): (count, percent)."""
    text = value.strip()
    try:
        if text.endswith("%"):
            return 0, float(text[:-1])
        return int(text), 0.0
    except ValueError:
        raise ValueError(f"{value!r} is neither a number of racks (3) nor a percentage (10%)") from None


_FLAGS = ("max_concurrent", "max_per_domain", "canary", "bake", "halt_after", "pause_on_halt")


def rollout_options(*, removable: bool) -> Callable[[F], F]:
    """The policy flags; the command receives `rollout` (the flags given, for `policy_from`, or None when
    none was) and, with `removable`, `no_rollout`."""
    options = [
        click.option(
            "--max-concurrent", type=int, metavar="N", help="Rollout: at most N racks' tasks active at once."
        ),
        click.option(
            "--max-per-domain",
            type=int,
            metavar="N",
            help="Rollout: at most N racks of one NVLink domain at once.",
        ),
        click.option(
            "--canary", type=int, metavar="N", help="Rollout: the first N racks (by name) go first and alone."
        ),
        click.option(
            "--bake", metavar="DURATION", help="Rollout: wait this long after the canaries succeeded (15m)."
        ),
        click.option(
            "--halt-after",
            metavar="N|P%",
            callback=checked(parse_halt),
            help="Rollout: halt when N racks (or P% of them) failed.",
        ),
        click.option(
            "--pause-on-halt/--no-pause-on-halt",
            default=None,
            help=(
                "Rollout: pause the schedule when the rollout halts or completes over its failure limit"
                " (default: pause)."
            ),
        ),
    ]
    if removable:
        options.append(click.option("--no-rollout", is_flag=True, help="Remove the rollout policy."))

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_rollout(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in _FLAGS}
            kwargs["rollout"] = given if any(v is not None for v in given.values()) else None
            return command(*args, **kwargs)

        wrapped: Any = with_rollout
        for option in reversed(options):
            wrapped = option(wrapped)
        return wrapped  # type: ignore[no-any-return]

    return decorate


def policy_from(flags: dict[str, Any], base: pb.RolloutPolicy | None = None) -> pb.RolloutPolicy:
    """The flags given over `base` (a schedule's current policy, when updating); the server checks them.

    A bake is the wait after the canaries, so a policy that would bake without any is a usage error: it
    was stored and did nothing, and the operator believed the rollout paused after its first racks."""
    policy = pb.RolloutPolicy()
    if base is not None:
        policy.CopyFrom(base)
    max_concurrent, max_per_domain, canary, bake, halt_after, pause_on_halt = (flags[f] for f in _FLAGS)
    if max_concurrent is not None:
        policy.max_concurrent_racks = max_concurrent
    if max_per_domain is not None:
        policy.max_per_domain = max_per_domain
    if canary is not None:
        policy.canary_racks = canary
    if bake is not None:
        policy.bake_time = bake
    if halt_after is not None:
        policy.halt_after_failures, policy.halt_after_failure_percent = halt_after
    if pause_on_halt is not None:
        policy.pause_on_halt = pause_on_halt
    if bakes_without_canaries(policy.canary_racks, bool(policy.bake_time)):  # the server's rule, in flags
        kept = "" if bake is not None else f" (the schedule's bake {policy.bake_time} stays)"
        raise click.UsageError(
            f"--bake applies with --canary: the bake is the wait after the canaries{kept}; "
            "add --canary N, or drop the bake (--bake '')"
        )
    return policy


def approval_text(run: pb.TaskScheduleRun) -> str:
    """`awaiting 1 more of 2 approver(s) by 2026-…`, `approved by ann (checked CHG-2231), bob`, `rejected by
    ann: why`, or "": each approver with what they said, if anything, as the run page shows them."""
    if not run.HasField("approval"):
        return ""
    a = run.approval
    names = ", ".join(x.principal + (f" ({x.comment})" if x.comment else "") for x in a.approvers)
    if run.state == "awaiting_approval":
        left = a.min_approvers - len(a.approvers)
        so_far = f" (approved by {names})" if names else ""
        return (
            f"awaiting {left} more of {a.min_approvers} approver(s) by {utc_text(when(a.expires_at))}{so_far}"
        )
    if a.rejected_by:
        return f"rejected by {a.rejected_by}: {a.comment}"
    if run.state == "expired":
        return f"expired at {utc_text(when(a.expires_at))}"
    return f"approved by {names}" if names else ""


def policy_text(policy: pb.RolloutPolicy) -> str:
    """`max 5, 1 per domain, 2 canaries, bake 15m, halt after 2, pause on halt` (`RolloutPolicy.describe`)."""
    return rollout_of(policy).describe()  # as stored, even a bake without canaries stored before the rule


def progress_text(run: pb.TaskScheduleRun) -> str:
    """`12/40 ok, 1 failed, 3 active, 24 pending` ("" for a firing of every scope at once)."""
    if not run.HasField("progress"):
        return ""
    p = run.progress
    parts = [f"{p.succeeded}/{p.total} ok"]
    for count, label in (
        (p.failed, "failed"),
        (p.active, "active"),
        (p.pending, "pending"),
        (p.not_started, "not started"),
        (p.skipped, "skipped"),
    ):
        if count:
            parts.append(f"{count} {label}")
    if p.wave:
        parts.append(
            f"wave {p.wave}" + (f" until {utc_text(when(p.bake_until))}" if p.wave == "bake" else "")
        )
    return ", ".join(parts)


# A rack whose task ended so failed in its run, as the rollout's progress counts it.
FAILED_TASKS = (pb.TASK_STATUS_FAILED, pb.TASK_STATUS_TERMINATED)


def failed(outcome: pb.ScopeOutcome) -> bool:
    """The rack failed in this run: its task could not be submitted, or it failed or was terminated (not
    a "not_started" rack's, whose task its rollout's cancel ended before it began)."""
    return outcome.outcome == "failed" or (
        outcome.outcome == "submitted" and outcome.task_status in FAILED_TASKS
    )


def hold_text(outcome: pb.ScopeOutcome) -> str:
    """Why the rack's task waits ("held by preflight: pre-flight check 'drained': …"), or "" when nothing
    holds it."""
    return f"held by {outcome.held_by}: {outcome.held_reason}" if outcome.held_by else ""


def failed_task_ids(run: pb.TaskScheduleRun) -> list[str]:
    return [o.task_id.id for o in run.outcomes if o.task_id.id and failed(o)]


def task_messages(session: Session, task_ids: Sequence[str]) -> dict[str, str]:
    """Why these (failed) tasks failed, by task id: a run's outcomes carry only the errors of submissions,
    the task its own message. At most 1,000 a call, GetTasksByIDs' limit (a run of more failed racks was
    refused in one), counted on a progress bar past one call."""
    messages: dict[str, str] = {}
    with session.progress("reading failed tasks", len(task_ids)) as advance:
        for start in range(0, len(task_ids), MAX_TASK_IDS):
            batch = task_ids[start : start + MAX_TASK_IDS]
            messages.update((t.id.id, t.message) for t in session.client.get_tasks(batch).tasks)
            advance(len(batch))
    return messages


def run_view(
    run: pb.TaskScheduleRun, racks: dict[str, str], schedule: str, messages: dict[str, str]
) -> RenderableType:
    """A run of the schedule named `schedule`: its state and reason, the rollout's progress bar and
    counters, and each rack's scope (the error of a failed task from `messages`; of a waiting one, what
    holds it and why)."""
    head = details(
        [
            ("run", run.id.id),
            ("schedule", schedule or "-"),
            ("fired", f"{utc_text(when(run.fired_at))} ({run.trigger})"),
            ("state", run.state),
            *((("approval", approval_text(run)),) if run.HasField("approval") else ()),
            *((("reason", run.reason),) if run.reason else ()),
            *((("rollout", policy_text(run.rollout)),) if run.HasField("rollout") else ()),
            *((("progress", progress_text(run)),) if run.HasField("progress") else ()),
            *((("retry of", run.retry_of.id),) if run.retry_of.id else ()),
            *((("retried by", ", ".join(i.id for i in run.retried_by)),) if run.retried_by else ()),
        ]
    )
    parts: list[RenderableType] = [head]
    if run.HasField("progress") and run.progress.total:
        p = run.progress
        ended = p.succeeded + p.failed + p.not_started + p.skipped
        parts += ["", ProgressBar(total=p.total, completed=ended, width=60)]
    scopes = table("RACK", "OUTCOME", "TASK", "STATUS", free_text("ERROR"))
    for o in run.outcomes:
        rack = racks.get(o.rack_id.id, o.rack_id.id)
        scopes.add_row(
            f"{rack} (canary)" if o.canary else rack,
            o.outcome,
            o.task_id.id or "-",
            styled_status(o.task_status) if o.task_status else "-",
            o.error or hold_text(o) or messages.get(o.task_id.id, ""),
        )
    return Stack(*parts, "", scopes)


def run_racks(run: pb.TaskScheduleRun) -> set[str]:
    """The ids of the racks a run's table names, read by id (`rack_names`), not the whole rack list (20
    pages at 20,000 racks)."""
    return {o.rack_id.id for o in run.outcomes}


_ACTIVE_TASK = (pb.TASK_STATUS_WAITING, pb.TASK_STATUS_PENDING, pb.TASK_STATUS_RUNNING)


def _finished(run: pb.TaskScheduleRun) -> bool:
    """Nothing more will change: not live, and no started task still active: a rollout's progress
    counts them; a run without a rollout is "completed" once it submitted, so its racks' tasks say."""
    if run.state in LIVE_STATES or (run.HasField("progress") and run.progress.active):
        return False
    return not any(o.task_status in _ACTIVE_TASK for o in run.outcomes)


@click.group(cls=Group)
def run() -> None:
    """One firing of a schedule (a run): show it, resume or cancel a rollout, approve or reject a run
    awaiting approval, retry its failed racks."""


_run_id = click.argument("run_id", metavar="RUN_ID")


@run.command()
@_run_id
@click.option(
    "--watch",
    is_flag=True,
    help="Follow the run until it halts or ends and its racks' tasks have ended (exit 1 unless it "
    "completed).",
)
@poll_interval_option("With --watch: how often to poll.")
@click.pass_context
def show(ctx: click.Context, run_id: str, watch: bool, interval: int) -> None:
    """Show a run: each rack's outcome and task status; a rollout's progress and why it halted.

    \b
    Example:
      rackflow run show 6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f --watch
    """
    session = pass_session(ctx)
    current = session.client.get_run(run_id)
    racks = rack_names(session, run_racks(current)) if session.for_people else {}
    schedule = schedule_name(session, current.schedule_id.id) if session.for_people else ""

    def view(r: pb.TaskScheduleRun) -> RenderableType:
        return run_view(r, racks, schedule, task_messages(session, failed_task_ids(r)))

    if not watch:
        session.emit(current, lambda: view(current))
        return

    def done(r: pb.TaskScheduleRun) -> bool:
        return _finished(r) or r.state == "halted"  # a halted run waits for a person

    if session.for_people and session.console.is_terminal:
        with Live(view(current), console=session.console, refresh_per_second=4) as live:
            while not done(current):
                session.sleep(interval)
                current = session.client.get_run(run_id)
                live.update(view(current))
    else:  # a pipe, a file or -o json|yaml: no animation, just the run as it ended
        while not done(current):
            session.sleep(interval)
            current = session.client.get_run(run_id)
        session.emit(current, lambda: view(current))
    ctx.exit(0 if current.state == "completed" else 1)


@run.command()
@_run_id
@click.pass_context
def resume(ctx: click.Context, run_id: str) -> None:
    """Continue a halted rollout: its not-started racks wait their turn again and failures count from
    zero. Its schedule stays paused (`rackflow schedule resume` fires it again).

    \b
    Example:
      rackflow run resume 6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f
    """
    _act(ctx, lambda session: session.client.resume_run(run_id))


@run.command()
@_run_id
@click.pass_context
def cancel(ctx: click.Context, run_id: str) -> None:
    """End a rolling or halted rollout: racks not started yet never start. Tasks already started are not
    cancelled (`rackflow task cancel` does that).

    \b
    Example:
      rackflow run cancel 6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f
    """
    _act(ctx, lambda session: session.client.cancel_run(run_id))


@run.command()
@_run_id
@click.option("--comment", default="", help="Why, for the run's record and the audit trail.")
@click.pass_context
def approve(ctx: click.Context, run_id: str, comment: str) -> None:
    """Approve a run awaiting approval (approver role; not the schedule's last editor). With enough
    approvers it starts at once, exactly once (docs/SAFETY.md).

    \b
    Example:
      rackflow run approve 6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f --comment "checked the change ticket"
    """
    _act(ctx, lambda session: session.client.approve_run(run_id, comment))


@run.command()
@_run_id
@click.option("--comment", required=True, help="Why it is rejected (required).")
@click.pass_context
def reject(ctx: click.Context, run_id: str, comment: str) -> None:
    """Reject a run awaiting approval: nothing of it starts (approver role).

    \b
    Example:
      rackflow run reject 6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f --comment "not during the freeze"
    """
    _act(ctx, lambda session: session.client.reject_run(run_id, comment))


@run.command()
@_run_id
@click.option("--all", "all_racks", is_flag=True, help="Re-run every rack of the run, not only the failed.")
@request_id_option("retry")
@click.pass_context
def retry(ctx: click.Context, run_id: str, all_racks: bool, request_id: str | None) -> None:
    """Re-run a finished or halted run's failed and not-started racks as a new run, linked to it, with
    its rollout policy (a halted rollout is cancelled first). Shows the new run.

    Safe to run again, as `schedule trigger`: the retry carries a request id and is sent again with it when
    its answer is lost; the server makes one new run and shows it each time, and stderr says when the
    answer is an earlier request's run (nothing new fired).

    \b
    Example:
      rackflow run retry 6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f
      rackflow run retry 6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f --all
    """
    _act(
        ctx,
        lambda session: send_again(
            lambda rid: session.client.retry_run(run_id, only_failed=not all_racks, request_id=rid),
            request_id,
            session.sleep,
            lambda answer: answer.id.id,
        ),
    )


_RETRY_FLAGS = ("retries", "retry_backoff", "retry_multiplier", "retry_max_backoff")


def retry_options(*, removable: bool) -> Callable[[F], F]:
    """The retry policy's flags; the command receives `retry` (the flags given, for `retry_policy_from`,
    or None when none was) and, with `removable`, `no_retries`."""
    options = [
        click.option(
            "--retries",
            type=int,
            metavar="N",
            help="Retry: N attempts in all for a failure the backend calls retryable (timeouts, 5xx).",
        ),
        click.option(
            "--retry-backoff", metavar="DURATION", help="Retry: wait before the second attempt (30s)."
        ),
        click.option(
            "--retry-multiplier",
            type=float,
            metavar="X",
            help="Retry: each later wait is X times the last (2).",
        ),
        click.option("--retry-max-backoff", metavar="DURATION", help="Retry: the longest wait (10m)."),
    ]
    if removable:
        options.append(click.option("--no-retries", is_flag=True, help="Remove the retry policy."))

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_retry(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in _RETRY_FLAGS}
            kwargs["retry"] = given if any(v is not None for v in given.values()) else None
            return command(*args, **kwargs)

        wrapped: Any = with_retry
        for option in reversed(options):
            wrapped = option(wrapped)
        return wrapped  # type: ignore[no-any-return]

    return decorate


def retry_policy_from(flags: dict[str, Any], base: pb.RetryPolicy | None = None) -> pb.RetryPolicy:
    """The flags given over `base` (a schedule's current policy, when updating); the server checks them
    and fills what is left unset with its defaults."""
    policy = pb.RetryPolicy()
    if base is not None:
        policy.CopyFrom(base)
    retries, backoff, multiplier, max_backoff = (flags[f] for f in _RETRY_FLAGS)
    if retries is not None:
        policy.max_attempts = retries
    if backoff is not None:
        policy.initial_backoff = backoff
    if multiplier is not None:
        policy.multiplier = multiplier
    if max_backoff is not None:
        policy.max_backoff = max_backoff
    return policy


def retry_text(policy: pb.RetryPolicy) -> str:
    """`3 attempts, back-off 30s x2 up to 10m` (`RetryPolicy.describe`)."""
    return retry_policy_from_pb(policy).describe()


def _act(ctx: click.Context, call: Callable[[Session], pb.TaskScheduleRun]) -> None:
    session = pass_session(ctx)
    found = call(session)
    racks = rack_names(session, run_racks(found)) if session.for_people else {}
    schedule = schedule_name(session, found.schedule_id.id) if session.for_people else ""
    session.emit(
        found, lambda: run_view(found, racks, schedule, task_messages(session, failed_task_ids(found)))
    )
