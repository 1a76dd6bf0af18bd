"""`rackflow serve` settings: one frozen value, validated once, from flags or `RACKFLOW_<NAME>` variables."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import timedelta

from rackflow.errors import InvalidArgument
from rackflow.security import ServerTls, TokenTable, check_exposure
from rackflow.timespec import parse_go_duration

DEFAULT_DB = "sqlite:///rackflow.db"
DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_DISPATCH_INTERVAL = "10s"
DEFAULT_DISPATCH_BATCH = 10
DEFAULT_DB_POOL_SIZE = 10
# A floor against unit slips (`720m` for `720h`) that would empty a security record within the hour.
MIN_AUDIT_RETENTION = timedelta(hours=1)


class BackendName(enum.StrEnum):
    SIMULATOR = "simulator"
    REDFISH = "redfish"


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


def parse_host_port(value: str, flag: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`); port 0 asks the OS for a free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"{flag}: expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def parse_interval(value: str, flag: str) -> timedelta:
    try:
        ns = parse_go_duration(value)
    except ValueError as exc:
        raise InvalidArgument(f"{flag}: {exc}") from None
    if ns <= 0:
        raise InvalidArgument(f"{flag}: must be positive, got {value!r}")
    return timedelta(microseconds=max(1, ns // 1000))


def parse_audit_retention(value: str) -> timedelta | None:
    """`--audit-retention`: a Go duration of at least MIN_AUDIT_RETENTION, or None (keep every event) for
    an empty value or a zero (`0`, `0s`, `0h`)."""
    flag = "--audit-retention"
    try:
        ns = parse_go_duration(value) if value else 0
    except ValueError as exc:
        raise InvalidArgument(f"{flag}: {exc}") from None
    if ns == 0:
        return None
    retention = timedelta(microseconds=ns // 1000)
    if retention < MIN_AUDIT_RETENTION:
        raise InvalidArgument(f"{flag}: must be at least 1h, or 0 to keep every event, got {value!r}")
    return retention


@dataclass(frozen=True)
class ServeConfig:
    db: str = DEFAULT_DB
    listen: str = DEFAULT_LISTEN
    dispatch_interval: timedelta = timedelta(seconds=10)
    dispatch_batch: int = DEFAULT_DISPATCH_BATCH
    dispatcher: bool = True
    backend: BackendName = BackendName.SIMULATOR
    metrics_listen: str | None = None
    migrate: bool = False
    log_format: LogFormat = LogFormat.TEXT
    clock_offset: timedelta = field(default=timedelta(0))
    # How long an instance's heartbeat may be silent before others take its tasks and runs over.
    lease_ttl: timedelta = timedelta(seconds=15)
    # Connections kept open to PostgreSQL (a few more are opened for bursts). Size it so that
    # instances × (pool + burst) stays under the server's max_connections.
    db_pool_size: int = DEFAULT_DB_POOL_SIZE
    tls: ServerTls | None = None
    tokens: TokenTable | None = field(default=None, repr=False)
    insecure: bool = False
    # Audit events older than this are deleted; None keeps them forever (an operator's explicit choice).
    audit_retention: timedelta | None = None
    # The dashboard and JSON API (rackflow.web) on HOST:PORT; None serves no HTTP at all.
    http_listen: str | None = None

    def __post_init__(self) -> None:
        mutual_tls = self.tls is not None and self.tls.client_ca is not None
        for flag, listen in (("--listen", self.listen), ("--http-listen", self.http_listen)):
            if listen is not None:
                host, _ = parse_host_port(listen, flag)
                check_exposure(
                    host,
                    tls=self.tls is not None,
                    auth=self.tokens is not None or mutual_tls,
                    insecure=self.insecure,
                    flag=flag,
                )
        if self.metrics_listen:
            parse_host_port(self.metrics_listen, "--metrics-listen")
        if not 2 <= self.db_pool_size <= 500:
            raise InvalidArgument(f"--db-pool-size: must be 2..500, got {self.db_pool_size}")
        if not 1 <= self.dispatch_batch <= 10_000:
            raise InvalidArgument(f"--dispatch-batch: must be 1..10000, got {self.dispatch_batch}")
