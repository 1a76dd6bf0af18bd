"""Real `rackflow serve` processes for end-to-end tests: start, wait until listening, kill, stop."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import grpc
import psycopg
from click.testing import CliRunner
from sqlalchemy.engine import make_url

from rackflow.cli.main import main as cli_main
from rackflow.v1 import flow_pb2_grpc

STARTUP_TIMEOUT_S = 30.0
_LISTENING = re.compile(r"listening on (\S+)")
_DASHBOARD = re.compile(r"dashboard and JSON API on (\S+)/")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """One `rackflow serve` child; its output is kept for assertions and for failure messages."""

    proc: subprocess.Popen[str]
    address: str
    log_path: Path
    _reader: threading.Thread | None = field(default=None, repr=False)

    @property
    def output(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    @property
    def http_url(self) -> str:
        """`http://HOST:PORT` of the dashboard and JSON API (the server must run with --http-listen)."""
        match = _DASHBOARD.search(self.output)
        if match is None:
            raise AssertionError(f"this server serves no HTTP (no --http-listen?):\n{self.output}")
        return match.group(1)

    def stub(self) -> flow_pb2_grpc.FlowStub:
        return flow_pb2_grpc.FlowStub(grpc.insecure_channel(self.address))

    def kill(self) -> None:
        """SIGKILL: no clean-up, as a crash would leave things."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def start_server(
    db_url: str,
    log_dir: Path,
    *,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    name: str = "server",
) -> ServerProcess:
    """Start `rackflow serve` on a loopback port it picks itself (`:0`) and wait for its "listening on" line,
    which names the port bound. A port found free here and passed in could be taken by another test's
    process before the server binds it (a suite run failed so: "Address already in use")."""
    log_path = log_dir / f"{name}-{uuid.uuid4().hex[:8]}.log"
    cmd = [
        sys.executable,
        "-m",
        "rackflow",
        "serve",
        "--db",
        db_url,
        "--listen",
        "127.0.0.1:0",
        *args,
    ]
    child_env = {
        **os.environ,
        "RACKFLOW_SIM_STEP_SECONDS": "0.01",
        # Each server spools audit events beside its log, not in the working directory.
        "RACKFLOW_AUDIT_SPOOL": str(log_path.with_suffix(".spool")),
        **(env or {}),
    }
    log_file = log_path.open("w")
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, text=True, env=child_env)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        match = _LISTENING.search(log_path.read_text())
        if match:
            return ServerProcess(proc, match.group(1), log_path)
        if proc.poll() is not None:
            raise RuntimeError(f"rackflow serve exited with {proc.returncode}:\n{log_path.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"rackflow serve did not start in {STARTUP_TIMEOUT_S}s:\n{log_path.read_text()}")


def run_cli(
    address: str, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`rackflow --server ADDRESS ARGS…` run in this process by click's test runner: the same commands,
    options, output and exit statuses as the `rackflow` process, without a process start each (about half a
    second of CPU for the imports: tests/e2e/test_cli.py took 60 s of CPU with a process per command, 9 s
    in process). `env` is set in os.environ for the call. The process itself is what the tests that run
    `rackflow db migrate` and `rackflow serve` start, and tests/tooling/test_cli_imports.py keeps its
    imports light. An exception the command did not turn into an exit status is raised here, where the
    process would print its traceback and exit 1."""
    result = CliRunner().invoke(cli_main, ["--server", address, *args], env=env, prog_name="rackflow")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["rackflow", *args], result.exit_code, result.stdout, result.stderr)


@contextmanager
def servers(db_url: str, log_dir: Path, count: int, **kwargs: object) -> Iterator[list[ServerProcess]]:
    """`count` servers on one database, all stopped (or killed) at the end."""
    started: list[ServerProcess] = []
    try:
        for i in range(count):
            started.append(start_server(db_url, log_dir, name=f"server{i}", **kwargs))  # type: ignore[arg-type]
        yield started
    finally:
        for server in started:
            server.stop()


@contextmanager
def fresh_postgres_database(admin_url: str, template: str | None = None) -> Iterator[str]:
    """A new PostgreSQL database for one multi-process test (dropped afterwards): empty, or a copy of the
    database named `template` (which nothing may be connected to)."""
    import uuid

    admin = make_url(admin_url).set(drivername="postgresql")
    name = f"rackflow_e2e_{uuid.uuid4().hex[:10]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(admin.render_as_string(False), autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{copy}')
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        forget_connections(admin.set(database=name).render_as_string(hide_password=False))
        with psycopg.connect(admin.render_as_string(False), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# The connections `sql` keeps: one per database in each thread.
_kept = threading.local()


def kept_connection(db_url: str) -> psycopg.Connection[tuple[object, ...]]:
    """This thread's open autocommit connection to `db_url`, made on first use. A new connection costs
    PostgreSQL about 10 ms of CPU (a backend forked, its catalog caches filled), and the tests ask the
    database many times a second while they wait (`wait_until` every 0.2 s, a `Sampler` every 20 ms), so a
    connection each time was a large share of the suite's PostgreSQL time (docs/PERFORMANCE.md, "The
    suite's time"). Statements are never prepared on it: a migration under test may change a table that a
    prepared `SELECT *` read, which PostgreSQL then refuses to run ("cached plan must not change result
    type")."""
    url = make_url(db_url).set(drivername="postgresql").render_as_string(False)
    kept: dict[str, psycopg.Connection[tuple[object, ...]]] = _kept.__dict__.setdefault("by_url", {})
    conn = kept.get(url)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(url, autocommit=True, prepare_threshold=None)
        kept[url] = conn
    return conn


def forget_connections(db_url: str | None = None) -> None:
    """Close this thread's kept connections (to `db_url` only, when given): before its database is dropped,
    and when a thread that used them ends."""
    kept: dict[str, psycopg.Connection[tuple[object, ...]]] = _kept.__dict__.get("by_url", {})
    url = make_url(db_url).set(drivername="postgresql").render_as_string(False) if db_url else None
    for key in [k for k in kept if url is None or k == url]:
        kept.pop(key).close()


def sql(db_url: str, query: str, *params: object) -> list[tuple[object, ...]]:
    """Run one query with psycopg and return all rows (assertions read the database directly), on this
    thread's kept connection; once more on a new one when the server had closed it (a fault test's outage,
    a restart), never when the statement itself failed."""
    conn = kept_connection(db_url)
    try:
        cur = conn.execute(query, params)
    except psycopg.OperationalError:
        if not (conn.closed or conn.broken):
            raise
        cur = kept_connection(db_url).execute(query, params)
    return cur.fetchall() if cur.description else []


class Sampler:
    """Runs `query` against the database every 20 ms in a thread, from entering the `with` to leaving it,
    and hands each result to `observe` (a subclass keeps what it needs); `samples` counts the results."""

    query = ""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def observe(self, rows: list[tuple[object, ...]]) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.observe(sql(self.db_url, self.query))
                self.samples += 1
                self._stop.wait(0.02)
        finally:
            forget_connections()
