"""Calling a BMC off the event loop, with one retry policy for every call.

Transient failures (the connection refused, reset or timed out; an HTTP 5xx) are retried with doubling
delays: BMCs reboot, and are slow to answer while busy. Refused credentials (401/403) fail at once, since
repeating them only locks the account. Anything else (404, a missing action, an unsupported value) fails
at once too, with the BMC's own words, and so does an answer that is not a Redfish document (an HTML page
from a proxy, cut-off JSON, a document of the wrong shape), which sushy fails to read with whatever Python
error its parsing hit: named as what it is, not as a bug of rackflow. Every failure becomes a `StepFailed`
whose text ends up in the task's message, so it says which BMC, what was being done, and why, and is
classed for a task's retry policy (docs/SAFETY.md, "Retries"): a transient failure that outlived these
retries is retryable (a later attempt, after a back-off of minutes, may find the BMC back); a refusal (any
4xx) or an unreadable answer is not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from typing import TypeVar

from sushy import exceptions as sushy_errors  # type: ignore[import-untyped]

from rackflow.retry import Retry, Sleep, retrying
from rackflow.tasks.backends.base import StepFailed
from rackflow.tasks.backends.redfish.config import RedfishConfig
from rackflow.tasks.backends.redfish.endpoint import CredentialsUnavailable
from rackflow.tasks.backends.redfish.rules import Unsupported

log = logging.getLogger(__name__)

T = TypeVar("T")

# The words of a connection failure worth keeping from a requests/urllib3 error's long text.
_CONNECTION_REASONS = (
    ("Connection refused", "connection refused"),
    ("timed out", "timed out"),
    ("Name or service not known", "host name not found"),
    ("Temporary failure in name resolution", "host name not found"),
    ("No route to host", "no route to host"),
    ("Connection reset", "connection reset"),
    ("RemoteDisconnected", "connection closed by the BMC"),
)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, sushy_errors.ConnectionError | sushy_errors.ServerSideError)


def reason(exc: BaseException) -> str:
    """A one-line account of a BMC error, without the noise (and without credentials: none are in it)."""
    if isinstance(exc, sushy_errors.AccessError):
        return f"the BMC refused the credentials (HTTP {exc.status_code}{_detail(exc)})"
    if isinstance(exc, sushy_errors.HTTPError):
        return f"HTTP {exc.status_code}{_detail(exc)}"
    if isinstance(exc, sushy_errors.ConnectionError):
        text = str(exc)
        for needle, said in _CONNECTION_REASONS:
            if needle in text:
                return said
        if "SSL" in text or "certificate" in text:
            return "TLS failure (RACKFLOW_REDFISH_VERIFY_TLS sets the CA bundle)"
        return "cannot connect"
    if isinstance(exc, sushy_errors.SushyError):
        return re.sub(r"\s+", " ", str(exc)).strip()
    return str(exc)


# What sushy (or requests, under it) raises reading a document that is not what Redfish says: JSONDecodeError
# (a ValueError) for a body that is not JSON, TypeError/AttributeError/KeyError for JSON of another shape.
_MALFORMED = (ValueError, TypeError, AttributeError, LookupError)


def malformed_answer(exc: BaseException) -> str | None:
    """Why the BMC's answer could not be read, when `exc` is sushy failing to read one (raised within
    sushy's code, so a bug of rackflow's own is never taken for the BMC's); None otherwise."""
    if not isinstance(exc, _MALFORMED) or isinstance(exc, sushy_errors.SushyError):
        return None
    frame = exc.__traceback__
    while frame is not None and frame.tb_frame.f_globals.get("__name__", "").split(".")[0] != "sushy":
        frame = frame.tb_next
    if frame is None:
        return None
    if isinstance(exc, json.JSONDecodeError):
        return f"the BMC's answer is not JSON ({exc})"
    return f"the BMC's answer is not a Redfish document rackflow can read ({type(exc).__name__}: {exc})"


def _detail(exc: sushy_errors.HTTPError) -> str:
    return f": {exc.detail}" if exc.detail else ""


async def call(
    fn: Callable[[], T],
    *,
    what: str,
    config: RedfishConfig,
    sleep: Sleep = asyncio.sleep,
    once: bool = False,
) -> T:
    """`fn()` in a worker thread, retried on transient errors; a `StepFailed` saying `what` failed and why.
    `once`: an action (a Reset, a SimpleUpdate) is sent once: after a timeout, a 5xx or an answer it cannot
    read the BMC may have carried it out, and a second one would restart the machine again or flash it
    mid-update. Such a failure is raised retryable, which is how the caller knows to read what happened
    instead (and never to send it again)."""
    attempts = 1 if once else config.retries + 1
    policy = Retry(config.retry_delay, config.max_retry_delay, attempts=attempts)
    try:
        return await retrying(
            lambda: asyncio.to_thread(fn),
            policy,
            what=what,
            retry_if=is_transient,
            explain=reason,
            sleep=sleep,
            logger=log,
        )
    except (CredentialsUnavailable, Unsupported) as exc:
        raise StepFailed(f"{what}: {exc}") from None
    except sushy_errors.AccessError as exc:
        raise StepFailed(f"{what}: {reason(exc)}; not retried") from None
    except Exception as exc:
        if is_transient(exc):
            tries = f"{attempts} attempt{'' if attempts == 1 else 's'}"
            raise StepFailed(f"{what}: {reason(exc)} (gave up after {tries})", retryable=True) from None
        if isinstance(exc, sushy_errors.SushyError):
            raise StepFailed(f"{what}: {reason(exc)}") from None
        if (malformed := malformed_answer(exc)) is not None:
            log.warning("%s: %s", what, malformed, exc_info=True)  # where sushy choked, for a bug report
            if once:  # the action may have been carried out: its caller treats it as an answer lost
                raise StepFailed(f"{what}: {malformed}", retryable=True) from None
            raise StepFailed(f"{what}: {malformed}; not retried") from None
        raise
