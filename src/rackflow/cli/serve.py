"""`rackflow serve`, `rackflow db migrate` and `rackflow db backup`: the server-side commands."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import click

from rackflow import logs
from rackflow.config import (
    DB_POOL_OVERFLOW,
    DEFAULT_AUDIT_SPOOL,
    DEFAULT_AUDIT_SPOOL_MAX_BYTES,
    DEFAULT_DB,
    DEFAULT_DB_POOL_SIZE,
    DEFAULT_DISPATCH_BATCH,
    DEFAULT_DISPATCH_INTERVAL,
    DEFAULT_HTTP_MAX_BODY_BYTES,
    DEFAULT_LEASE_TTL,
    DEFAULT_LISTEN,
    DEFAULT_NOTIFICATION_HOLD_THRESHOLD,
    DEFAULT_NOTIFICATION_RETENTION,
    DEFAULT_NOTIFY_SEND_LEASE,
    DEFAULT_PROGRESS_INTERVAL,
    MAX_PROGRESS_INTERVAL,
    MIN_DISPATCH_INTERVAL,
    MIN_LEASE_TTL,
    MIN_NOTIFICATION_HOLD_THRESHOLD,
    MIN_PROGRESS_INTERVAL,
    BackendName,
    LogFormat,
    ServeConfig,
    duration_text,
    parse_interval,
    parse_list,
    parse_retention,
)
from rackflow.errors import RackflowError
from rackflow.security import ServerTls, load_tokens
from rackflow.timespec.duration import format_go_duration
from rackflow.validation import start_deadline


def _checked_db_url(_ctx: click.Context, _param: click.Parameter, url: str) -> str:
    """Refuse a URL no driver takes, or a SQLite file in a directory that does not exist, as bad usage (exit
    2, naming --db) before anything connects, as every other bad value is: `serve` and `db migrate` used to
    try it and exit 1 with `error: db: …`."""
    from sqlalchemy.engine import make_url

    from rackflow.store.db import normalise_url

    try:
        parsed = make_url(normalise_url(url))
    except RackflowError as exc:
        raise click.UsageError(str(exc)) from None
    # A SQLite file in a directory that is not there: SQLite said only `unable to open database file`.
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        directory = Path(parsed.database).parent
        if not directory.is_dir():
            raise click.UsageError(f"--db: the SQLite file's directory {directory} does not exist")
    return url


_db_option = click.option(
    "--db",
    envvar="RACKFLOW_DB",
    default=DEFAULT_DB,
    show_default=True,
    callback=_checked_db_url,
    help="Database URL: sqlite:///path.db or postgresql://user@host:port/db.",
)


@click.command(
    epilog="Example:\n\n  rackflow serve --db postgresql://postgres@127.0.0.1:5432/rackflow --migrate"
)
@_db_option
@click.option(
    "--listen", envvar="RACKFLOW_LISTEN", default=DEFAULT_LISTEN, show_default=True, help="gRPC HOST:PORT."
)
@click.option(
    "--dispatch-interval",
    envvar="RACKFLOW_DISPATCH_INTERVAL",
    default=duration_text(DEFAULT_DISPATCH_INTERVAL),
    show_default=True,
    help="How often the dispatcher polls for due schedules (Go duration).",
)
@click.option(
    "--dispatch-batch",
    envvar="RACKFLOW_DISPATCH_BATCH",
    default=DEFAULT_DISPATCH_BATCH,
    type=int,
    show_default=True,
    help="Due schedules claimed per poll; a full batch polls again at once.",
)
@click.option(
    "--no-dispatcher",
    envvar="RACKFLOW_NO_DISPATCHER",
    is_flag=True,
    help="Serve the API and run tasks, but fire no schedules.",
)
@click.option(
    "--backend",
    envvar="RACKFLOW_BACKEND",
    type=click.Choice([b.value for b in BackendName]),
    default=BackendName.SIMULATOR.value,
    show_default=True,
    help="How tasks reach the racks.",
)
@click.option(
    "--metrics-listen",
    envvar="RACKFLOW_METRICS_LISTEN",
    default=None,
    help="Serve Prometheus /metrics on HOST:PORT (off by default).",
)
@click.option(
    "--http-listen",
    envvar="RACKFLOW_HTTP_LISTEN",
    default=None,
    help="Serve the web dashboard and the JSON API on HOST:PORT (off by default; docs/HTTP.md).",
)
@click.option(
    "--http-allowed-hosts",
    envvar="RACKFLOW_HTTP_ALLOWED_HOSTS",
    default="",
    help="Comma-separated names the HTTP listener answers to besides its address and localhost ('*': any).",
)
@click.option(
    "--http-allowed-origins",
    envvar="RACKFLOW_HTTP_ALLOWED_ORIGINS",
    default="",
    help="Comma-separated origins (scheme://host[:port]) whose pages may send state-changing requests.",
)
@click.option(
    "--http-max-body-bytes",
    envvar="RACKFLOW_HTTP_MAX_BODY_BYTES",
    default=DEFAULT_HTTP_MAX_BODY_BYTES,
    type=int,
    show_default=True,
    help="Refuse an HTTP request body larger than this (413).",
)
@click.option(
    "--migrate",
    "run_migrations",
    envvar="RACKFLOW_MIGRATE",
    is_flag=True,
    help="Migrate the database to the newest schema before serving.",
)
@click.option(
    "--log-format",
    envvar="RACKFLOW_LOG_FORMAT",
    type=click.Choice([f.value for f in LogFormat]),
    default=LogFormat.TEXT.value,
    show_default=True,
)
@click.option(
    "--clock-offset",
    envvar="RACKFLOW_CLOCK_OFFSET",
    default="0s",
    hidden=True,
    help="Shift this process's clock (Go duration); for clock-jump drills only.",
)
@click.option(
    "--db-pool-size",
    envvar="RACKFLOW_DB_POOL_SIZE",
    default=DEFAULT_DB_POOL_SIZE,
    type=int,
    show_default=True,
    help=f"PostgreSQL connections kept per process ({DB_POOL_OVERFLOW} more open for bursts).",
)
@click.option(
    "--lease-ttl",
    envvar="RACKFLOW_LEASE_TTL",
    default=duration_text(DEFAULT_LEASE_TTL),
    show_default=True,
    help="How long a silent instance keeps its tasks and runs before others take them over.",
)
@click.option(
    "--progress-interval",
    envvar="RACKFLOW_PROGRESS_INTERVAL",
    default=duration_text(DEFAULT_PROGRESS_INTERVAL),
    show_default=True,
    help="How often a running task's progress message is written: how far at most it lags the step under "
    f"way (Go duration, {format_go_duration(MIN_PROGRESS_INTERVAL)} to "
    f"{format_go_duration(MAX_PROGRESS_INTERVAL)}).",
)
@click.option(
    "--default-start-deadline",
    envvar="RACKFLOW_DEFAULT_START_DEADLINE",
    default="",
    help="A schedule without its own start deadline records a firing found later than its slot plus this "
    "as missed (Go duration, at least 1s); unset: it fires however late.",
)
@click.option(
    "--audit-retention",
    envvar="RACKFLOW_AUDIT_RETENTION",
    default="0",
    show_default=True,
    help="Delete audit events older than this (Go duration, at least 1h); 0 keeps every event.",
)
@click.option(
    "--run-retention",
    envvar="RACKFLOW_RUN_RETENTION",
    default="0",
    show_default=True,
    help="Delete schedule runs fired longer ago than this (Go duration, at least 1h); 0 keeps them.",
)
@click.option(
    "--task-retention",
    envvar="RACKFLOW_TASK_RETENTION",
    default="0",
    show_default=True,
    help="Delete tasks that ended longer ago than this (Go duration, at least 1h); 0 keeps them.",
)
@click.option(
    "--notification-retention",
    envvar="RACKFLOW_NOTIFICATION_RETENTION",
    default=f"{int(DEFAULT_NOTIFICATION_RETENTION.total_seconds()) // 3600}h",
    show_default=True,
    help="Delete delivered notification events older than this (Go duration, at least 1h), but an open "
    "condition's raise (a halted rollout's) until it clears; 0 keeps them.",
)
@click.option(
    "--notification-hold-threshold",
    envvar="RACKFLOW_NOTIFICATION_HOLD_THRESHOLD",
    default=duration_text(DEFAULT_NOTIFICATION_HOLD_THRESHOLD),
    show_default=True,
    help="Report a task a freeze, budget or pre-flight check has held longer than this (task.held_too_long;"
    " at least 10s).",
)
@click.option(
    "--notification-send-lease",
    envvar="RACKFLOW_NOTIFICATION_SEND_LEASE",
    default=duration_text(DEFAULT_NOTIFY_SEND_LEASE),
    show_default=True,
    help="How long a claimed notification send is left to its instance before another sends it again.",
)
@click.option(
    "--external-url",
    envvar="RACKFLOW_EXTERNAL_URL",
    default="",
    help="The dashboard's address as operators reach it; notifications link to run pages under it.",
)
@click.option(
    "--audit-spool",
    envvar="RACKFLOW_AUDIT_SPOOL",
    default=DEFAULT_AUDIT_SPOOL,
    show_default=True,
    help="File where audit events wait while the database is unavailable (replayed when it is back).",
)
@click.option(
    "--audit-spool-max-bytes",
    envvar="RACKFLOW_AUDIT_SPOOL_MAX_BYTES",
    default=DEFAULT_AUDIT_SPOOL_MAX_BYTES,
    type=int,
    show_default=True,
    help="Bound of --audit-spool; an event that would not fit is lost (logged, counted).",
)
@click.option(
    "--tls-cert",
    envvar="RACKFLOW_TLS_CERT",
    default=None,
    help="Serve TLS with this PEM certificate (chain).",
)
@click.option("--tls-key", envvar="RACKFLOW_TLS_KEY", default=None, help="The PEM private key of --tls-cert.")
@click.option(
    "--tls-client-ca",
    envvar="RACKFLOW_TLS_CLIENT_CA",
    default=None,
    help="Require client certificates signed by this PEM CA (mutual TLS).",
)
@click.option(
    "--auth-tokens",
    envvar="RACKFLOW_AUTH_TOKENS",
    default=None,
    help="YAML/JSON list of {name, role, sha256} bearer tokens; see docs/SECURITY.md.",
)
@click.option(
    "--insecure",
    envvar="RACKFLOW_INSECURE",
    is_flag=True,
    help="Allow a non-loopback --listen without TLS and authentication.",
)
def serve(
    db: str,
    listen: str,
    dispatch_interval: str,
    dispatch_batch: int,
    no_dispatcher: bool,
    backend: str,
    metrics_listen: str | None,
    http_listen: str | None,
    http_allowed_hosts: str,
    http_allowed_origins: str,
    http_max_body_bytes: int,
    run_migrations: bool,
    log_format: str,
    clock_offset: str,
    db_pool_size: int,
    lease_ttl: str,
    progress_interval: str,
    default_start_deadline: str,
    audit_retention: str,
    run_retention: str,
    task_retention: str,
    notification_retention: str,
    notification_hold_threshold: str,
    notification_send_lease: str,
    external_url: str,
    audit_spool: str,
    audit_spool_max_bytes: int,
    tls_cert: str | None,
    tls_key: str | None,
    tls_client_ca: str | None,
    auth_tokens: str | None,
    insecure: bool,
) -> None:
    """Serve the rackflow API, run tasks and fire due schedules."""
    from rackflow.audit.spool import check_spool_path
    from rackflow.server import RackflowServer, tune_gc

    try:
        offset = (
            timedelta(0) if clock_offset in ("0", "0s") else parse_interval(clock_offset, "--clock-offset")
        )
        tls = ServerTls.from_flags(tls_cert, tls_key, tls_client_ca)
        if tls is not None:
            tls.check_files()
        check_spool_path(Path(audit_spool))
        config = ServeConfig(
            db=db,
            listen=listen,
            dispatch_interval=parse_interval(
                dispatch_interval, "--dispatch-interval", minimum=MIN_DISPATCH_INTERVAL
            ),
            dispatch_batch=dispatch_batch,
            dispatcher=not no_dispatcher,
            backend=BackendName(backend),
            metrics_listen=metrics_listen,
            http_listen=http_listen or None,
            http_allowed_hosts=parse_list(http_allowed_hosts),
            http_allowed_origins=parse_list(http_allowed_origins),
            http_max_body_bytes=http_max_body_bytes,
            migrate=run_migrations,
            log_format=LogFormat(log_format),
            clock_offset=offset,
            db_pool_size=db_pool_size,
            lease_ttl=parse_interval(lease_ttl, "--lease-ttl", minimum=MIN_LEASE_TTL),
            progress_interval=parse_interval(
                progress_interval,
                "--progress-interval",
                minimum=MIN_PROGRESS_INTERVAL,
                maximum=MAX_PROGRESS_INTERVAL,
            ),
            tls=tls,
            tokens=load_tokens(auth_tokens, os.environ),
            insecure=insecure,
            default_start_deadline=start_deadline(default_start_deadline, "--default-start-deadline") or None,
            audit_retention=parse_retention(audit_retention, "--audit-retention"),
            run_retention=parse_retention(run_retention, "--run-retention"),
            task_retention=parse_retention(task_retention, "--task-retention"),
            notification_retention=parse_retention(notification_retention, "--notification-retention"),
            notification_hold_threshold=parse_interval(
                notification_hold_threshold,
                "--notification-hold-threshold",
                minimum=MIN_NOTIFICATION_HOLD_THRESHOLD,
            ),
            notification_send_lease=parse_interval(notification_send_lease, "--notification-send-lease"),
            external_url=external_url,
            audit_spool=audit_spool,
            audit_spool_max_bytes=audit_spool_max_bytes,
        )
    except RackflowError as exc:
        raise click.UsageError(str(exc)) from None
    logs.configure(config.log_format)

    async def main() -> None:
        server = RackflowServer(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.stop)
        await server.start()
        tune_gc()
        await server.wait()

    try:
        asyncio.run(main())
    except (RackflowError, OSError) as exc:  # OSError: a listener that cannot bind its address
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@click.group()
def db() -> None:
    """Database administration."""


@db.command(epilog="Example:\n\n  rackflow db migrate --db postgresql://postgres@127.0.0.1:5432/rackflow")
@_db_option
def migrate(db: str) -> None:
    """Create or upgrade the schema (safe to run again, and from several hosts at once)."""
    from rackflow.store.db import Database
    from rackflow.store.migrate import migrate as run_migrate

    async def main() -> str:
        database = Database(db)
        try:
            return await run_migrate(database)
        finally:
            await database.dispose()

    try:
        revision = asyncio.run(main())
    except RackflowError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"database at revision {revision}")


@db.command(
    epilog="Example:\n\n  rackflow db backup --db sqlite:///rackflow.db rackflow-backup.db\n\n"
    "  rackflow db backup --db postgresql://rackflow@db.internal/rackflow rackflow.dump"
)
@_db_option
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def backup(db: str, path: Path) -> None:
    """Copy the database to PATH while rackflow serves (SQLite: online backup; PostgreSQL: pg_dump).

    Restoring, and what happens to work in flight at backup time: docs/OPERATIONS.md, "Backups".
    """
    from rackflow.store.backup import backup as run_backup

    try:
        click.echo(run_backup(db, path))
    except RackflowError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
