"""Reading a BMC's credentials at use.

The database holds only a reference to the credentials (`env:NAME` or `file:/path`, checked by
`rackflow.inventory.bmc` as it enters the inventory); the secret itself is read when a step needs it, so
rotating a password needs no inventory change, and neither the database nor a log line ever holds it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


class CredentialsUnavailable(Exception):
    """The reference points nowhere usable (unset variable, unreadable file, no `user:password`)."""


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)


def read_credentials(ref: str, env: Mapping[str, str] | None = None) -> Credentials:
    """Resolve a reference to `user:password` now; the error says where it looked, never what it found."""
    value = read_reference(ref, "credentials", env)
    username, sep, password = value.rstrip("\r\n").partition(":")
    if not sep or not username:
        raise CredentialsUnavailable(f"credentials {ref}: expected the form user:password")
    return Credentials(username, password)


def read_reference(ref: str, what: str, env: Mapping[str, str] | None = None) -> str:
    """The secret `ref` (`env:NAME` or `file:/path`) names, read now (a rotated secret is used at once); the
    error names `what` and where it looked, never what it found."""
    env = os.environ if env is None else env
    scheme, _, rest = ref.partition(":")
    if scheme == "env":
        if rest not in env:
            raise CredentialsUnavailable(f"{what} {ref}: environment variable {rest} is not set")
        return env[rest]
    if scheme == "file":
        try:
            return Path(rest).read_text()
        except OSError as exc:
            problem = exc.strerror or type(exc).__name__
            raise CredentialsUnavailable(f"{what} {ref}: cannot read the file ({problem})") from None
    raise CredentialsUnavailable(f"{what}: expected env:NAME or file:/path")
