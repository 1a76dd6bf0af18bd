"""A call that is safe to send again: the CLI's manual trigger and run retry carry a request id, one per
invocation (`--request-id`, else a new UUID), so the server answers a call again with the same id as it
answered the first, without firing a second run (docs/SCHEDULES.md, "A trigger whose COMMIT goes unanswered").
The answer lost on the way back (UNAVAILABLE, DEADLINE_EXCEEDED) is then no reason to give up: the call is
sent again with the same id, up to ATTEMPTS times, each try said on stderr so the operator sees why it
took longer. The answer says whether it is an earlier request's (`replayed`), and the command tells the
operator which happened: that request had already fired the run, and nothing new fired; or, after a try
sent again, that this try fired it now (the earlier one never reached the server). So does a trigger's
refusal that answers a firing (every scope failed: it fired, submitted no task), from its trailing
metadata (`RackflowClientError.firing`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Protocol, TypeVar

import click
import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.cli.output import utc_text, when
from rackflow.client import RackflowClientError


class Answer(Protocol):
    """A trigger's (SubmitTaskResponse) or a retry's (TaskScheduleRun) answer: when its run fired, and
    whether an earlier call with the same request id fired it."""

    @property
    def replayed(self) -> bool: ...

    @property
    def fired_at(self) -> Timestamp: ...


T = TypeVar("T", bound=Answer)
F = TypeVar("F", bound=Callable[..., object])

ATTEMPTS = 4
DELAY_SECONDS = 1.0  # doubled at each try: 1, 2, 4 s
RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def request_id_option(what: str) -> Callable[[F], F]:
    """`--request-id` for a command whose call carries one (`what` it makes safe to run again)."""
    option: Callable[[F], F] = click.option(
        "--request-id",
        default=None,
        metavar="ID",
        help=(
            f"The request id of this {what} (up to 64 of A-Z a-z 0-9 . _ : -); default: a new UUID. "
            f"Running the command again with the same id does not {what} again but shows the first answer, "
            "as long as the server keeps that run; an id the schedule's other calls used (a trigger's, "
            "another run's retry) is refused."
        ),
    )
    return option


def send_again(
    call: Callable[[str], T],
    request_id: str | None,
    sleep: Callable[[float], None],
    run_id: Callable[[T], str],
) -> T:
    """`call(request_id)` (a new UUID when None), sent again with the same id while its answer was lost,
    `sleep`ing between tries (the session's); what the answer, or a refusal that answers a firing, says of
    its run (`run_id` of an answer) told on stderr (`tell`)."""
    chosen = request_id or str(uuid.uuid4())
    delay = DELAY_SECONDS
    for attempt in range(1, ATTEMPTS + 1):
        try:
            answer = call(chosen)
        except RackflowClientError as exc:
            if exc.code not in RETRIED or attempt == ATTEMPTS:
                if (firing := exc.firing) is not None:
                    tell(
                        chosen,
                        str(firing.run_id),
                        firing.fired_at,
                        firing.replayed,
                        resent=attempt > 1,
                        outcome="it submitted no task",
                    )
                raise
            click.echo(
                f"warning: {exc.code.name}: {exc.message}; sending it again with the same request id "
                f"{chosen} in {delay:g}s (try {attempt + 1} of {ATTEMPTS})",
                err=True,
            )
            sleep(delay)
            delay *= 2
            continue
        if (fired := when(answer.fired_at)) is not None:  # None: a server too old to say
            tell(chosen, run_id(answer), fired, answer.replayed, resent=attempt > 1)
        return answer
    raise AssertionError("unreachable")  # the last try returns or raises


def tell(
    request_id: str, run_id: str, fired: datetime, replayed: bool, *, resent: bool, outcome: str = ""
) -> None:
    """On stderr (so that -o json stays the answer alone, which says `replayed` too): an answer that is an
    earlier request's fired nothing new, whatever the answer looks like; one that is not, heard after a
    try sent again, fired now. Nothing when the first try was heard and fired. `outcome`: what the run
    did, when the answer is a refusal that does not say it of itself ("it submitted no task")."""
    did = f"{outcome}; " if outcome else ""
    if replayed:
        click.echo(
            f"request {request_id} had already fired run {run_id} at {utc_text(fired)}: "
            f"{did}nothing new fired",
            err=True,
        )
    elif resent:
        click.echo(
            f"request {request_id} fired run {run_id} at {utc_text(fired)} now: {did}its earlier try had "
            "not reached the server, so this is its one firing",
            err=True,
        )
