"""Domain errors. Every layer raises these; only `rackflow.api.errors` turns them into gRPC and HTTP status
codes.

Messages name the field and the bad value, because an operator reading them has nothing else to go on.
"""

from __future__ import annotations

import uuid
from datetime import datetime


class RackflowError(Exception):
    """Root of every error rackflow reports to a client."""


class InvalidArgument(RackflowError):
    """Malformed input: bad spec, timezone, name, filter, mask path, target or UUID."""


class NotFound(RackflowError):
    """An id (or name) that does not exist."""


class AlreadyExists(RackflowError):
    """A unique value that is taken: `field` is the request field that gave it, `value` the value, and
    `what` says what already has it ("a schedule named"), so every such message reads the same:
    `schedule.name: a schedule named 'nightly' already exists`; `holder`, when given, names the one that
    has it (`…/Systems/1' already exists: component 'node-0' (…) of rack 'rack-01'`)."""

    def __init__(self, field: str, value: object, what: str, holder: str = "") -> None:
        super().__init__(f"{field}: {what} {value!r} already exists" + (f": {holder}" if holder else ""))
        self.field = field
        self.value = value


class FailedPrecondition(RackflowError):
    """The request is well-formed but the current state forbids it."""


class SubmittedNothing(FailedPrecondition):
    """A manual trigger that fired (its run `run_id` recorded at `fired_at`) but submitted no task, every
    scope failed: the one refusal that answers a firing, so, as a trigger's success does, it names the run
    and says whether it is the answer of an earlier trigger with the same request id (`replayed`: this call
    fired nothing). A client that sent the trigger again after a lost answer tells its operator which of the
    two happened from these, not from the message (`rackflow.api.errors.trailing_metadata`)."""

    def __init__(self, message: str, run_id: uuid.UUID, fired_at: datetime, *, replayed: bool) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.fired_at = fired_at
        self.replayed = replayed


class Unavailable(RackflowError):
    """The database cannot be reached right now; the client may retry."""


class Unauthenticated(RackflowError):
    """Bearer tokens are required and the request carries none, or one that is not valid."""


class PermissionDenied(RackflowError):
    """The caller is known, but its role may not do this."""
