"""A call that is safe to send again: the CLI's manual trigger and run retry carry a request id, one per
invocation (`--request-id`, else a new UUID), so the server answers a call again with the same id as it
answered the first, without firing a second run (docs/SCHEDULES.md, "A trigger whose COMMIT goes unanswered").
The answer lost on the way back (UNAVAILABLE, DEADLINE_EXCEEDED) is then no reason to give up: the call is
sent again with the same id, up to ATTEMPTS times, each try said on stderr so the operator sees why it
took longer."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TypeVar

import click
import grpc

from rackflow.client import RackflowClientError

T = TypeVar("T")
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
            "as long as the server keeps that run."
        ),
    )
    return option


def send_again(call: Callable[[str], T], request_id: str | None, sleep: Callable[[float], None]) -> T:
    """`call(request_id)` (a new UUID when None), sent again with the same id while its answer was lost,
    `sleep`ing between tries (the session's)."""
    chosen = request_id or str(uuid.uuid4())
    delay = DELAY_SECONDS
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call(chosen)
        except RackflowClientError as exc:
            if exc.code not in RETRIED or attempt == ATTEMPTS:
                raise
            click.echo(
                f"warning: {exc.code.name}: {exc.message}; sending it again with the same request id "
                f"{chosen} in {delay:g}s (try {attempt + 1} of {ATTEMPTS})",
                err=True,
            )
            sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")  # the last try returns or raises
