"""`rackflow`: the operator's command line — `serve`, `db migrate`, and a client command for every RPC.

Exit codes: 0 success, 1 the server refused or failed (`error: <CODE>: <message>` on stderr),
2 bad usage (click's own convention, also used for input the client rejects before sending).
"""

from __future__ import annotations

from typing import Any

import click

from rackflow.cli.audit import audit
from rackflow.cli.budgets import budget
from rackflow.cli.checks import check
from rackflow.cli.notify import notify
from rackflow.cli.output import OUTPUT_FORMATS, Group, Session
from rackflow.cli.racks import domain, inventory, rack
from rackflow.cli.rollouts import run
from rackflow.cli.schedules import schedule
from rackflow.cli.security import auth, connection_options, use_connection
from rackflow.cli.serve import db, serve
from rackflow.cli.tasks import task
from rackflow.cli.windows import window
from rackflow.client import DEFAULT_TARGET, RackflowClientError
from rackflow.config import parse_host_port
from rackflow.errors import InvalidArgument


def _server(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """HOST:PORT as `rackflow serve --listen` reads it, the port 1-65535: gRPC would take a port past
    65535 modulo 65536 (99999: 34463) and reach another server, or fail with a resolver's message."""
    try:
        _host, port = parse_host_port(value, "--server")
    except InvalidArgument:
        port = 0
    if port == 0:
        raise click.BadParameter(f"expected HOST:PORT, got {value!r} (e.g. 127.0.0.1:50051, [::1]:50051)")
    return value


class RootGroup(Group):
    """Turns client errors into one line on stderr and an exit code, wherever they are raised."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RackflowClientError as exc:
            click.echo(f"error: {exc.code.name}: {exc.message}", err=True)
            ctx.exit(1)
        except ValueError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(2)


@click.group(
    cls=RootGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
    epilog="""\b
Example:
  rackflow inventory import examples/fleet.yaml
  rackflow schedule create nightly-reset --cron "0 2 * * *" --tz America/Los_Angeles \\
      --op power-reset --rack rack-01
  rackflow schedule list""",
)
@click.option(
    "--server",
    envvar="RACKFLOW_SERVER",
    default=DEFAULT_TARGET,
    show_default=True,
    metavar="HOST:PORT",
    callback=_server,
    help="The rackflow server to talk to (env RACKFLOW_SERVER).",
)
@click.option(
    "-o", "--output", type=click.Choice(OUTPUT_FORMATS), default=None, help="table (default), json or yaml."
)
@connection_options
@click.version_option(package_name="rackflow")
@click.pass_context
def main(
    ctx: click.Context,
    server: str,
    output: str | None,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    token: str | None,
) -> None:
    """Automate operations on GPU racks: inventory, tasks and task schedules."""
    session = ctx.ensure_object(Session)
    session.server = server
    use_connection(session, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, token=token)
    if output is not None:
        session.output = output
    ctx.call_on_close(session.close)


for command in (
    rack,
    domain,
    inventory,
    task,
    schedule,
    run,
    window,
    budget,
    check,
    notify,
    audit,
    auth,
    serve,
    db,
):
    main.add_command(command)


if __name__ == "__main__":
    main()
