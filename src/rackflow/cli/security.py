"""How the CLI reaches a secured server (`--tls-ca`, `--tls-cert`, `--tls-key`, `--token`), and
`rackflow auth hash-token`, which turns a token into the SHA-256 a server's tokens file stores.

The client certificate's variables are `RACKFLOW_CLIENT_TLS_CERT/KEY`, not `RACKFLOW_TLS_CERT/KEY`: those
configure `rackflow serve`'s own certificate, and a host may well run both.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from rackflow.cli.output import Session
from rackflow.client import RackflowClient
from rackflow.errors import RackflowError
from rackflow.security import channel_credentials, hash_token
from rackflow.validation import has_control_characters

F = TypeVar("F", bound=Callable[..., Any])


def _token(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """The token as given; a usage error for a control character (a newline a file's read left, say),
    which gRPC would refuse as "INTERNAL: Invalid metadata"."""
    if value is not None and has_control_characters(value):
        raise click.BadParameter("a bearer token has no control characters (a trailing newline?)")
    return value


_OPTIONS = (
    click.option(
        "--tls-ca",
        envvar="RACKFLOW_TLS_CA",
        default=None,
        metavar="FILE",
        help="Use TLS, trusting this PEM CA (env RACKFLOW_TLS_CA).",
    ),
    click.option(
        "--tls-cert",
        envvar="RACKFLOW_CLIENT_TLS_CERT",
        default=None,
        metavar="FILE",
        help="Present this client certificate (mutual TLS; env RACKFLOW_CLIENT_TLS_CERT).",
    ),
    click.option(
        "--tls-key",
        envvar="RACKFLOW_CLIENT_TLS_KEY",
        default=None,
        metavar="FILE",
        help="The PEM key of --tls-cert (env RACKFLOW_CLIENT_TLS_KEY).",
    ),
    click.option(
        "--token",
        envvar="RACKFLOW_TOKEN",
        default=None,
        metavar="TOKEN",
        callback=_token,
        help="Bearer token; prefer the env RACKFLOW_TOKEN, which `ps` does not show.",
    ),
)


def connection_options(command: F) -> F:
    """The four options above, for the root group."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def use_connection(
    session: Session, *, tls_ca: str | None, tls_cert: str | None, tls_key: str | None, token: str | None
) -> None:
    """Make the session's client use TLS and/or a token; the files are read when a command connects."""
    if not (tls_ca or tls_cert or tls_key or token):
        return

    def connect(server: str) -> RackflowClient:
        credentials = None
        if tls_ca or tls_cert or tls_key:
            try:
                credentials = channel_credentials(tls_ca, tls_cert, tls_key)
            except RackflowError as exc:
                raise click.UsageError(str(exc)) from None
        return RackflowClient(server, credentials=credentials, token=token)

    session.connect = connect


@click.group()
def auth() -> None:
    """Bearer tokens for `rackflow serve --auth-tokens`."""


@auth.command(name="hash-token")
def hash_token_command() -> None:
    """Read a token on stdin (or at a hidden prompt) and print its SHA-256 for the tokens file.

    \b
    Example:
      TOKEN=$(openssl rand -hex 32)
      printf %s "$TOKEN" | rackflow auth hash-token
    """
    token = click.prompt("Token", hide_input=True) if sys.stdin.isatty() else sys.stdin.read().strip()
    if not token:
        raise click.UsageError("no token given on stdin")
    click.echo(hash_token(token))
