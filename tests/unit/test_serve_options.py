"""`rackflow serve` retentions, HTTP listener and audit spool: what an operator types, what the server is
given, what is refused."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rackflow import logs, server
from rackflow.cli.serve import serve
from rackflow.config import ServeConfig, parse_retention
from rackflow.errors import InvalidArgument
from rackflow.server import build_backend
from rackflow.tasks.executor import Executor
from tests.certs import Pki, make_pki


@pytest.mark.parametrize(
    ("text", "retention"),
    [
        ("", None),
        ("0", None),
        ("0s", None),
        ("0h", None),
        ("1h", timedelta(hours=1)),
        ("2160h", timedelta(days=90)),
        ("90m30s", timedelta(minutes=90, seconds=30)),
    ],
)
def test_parse_retention(text: str, retention: timedelta | None) -> None:
    assert parse_retention(text, "--audit-retention") == retention


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("59m59s", r"--audit-retention: must be at least 1h, or 0 to keep everything, got '59m59s'"),
        ("1s", "must be at least 1h"),
        ("-24h", "must be at least 1h"),
        ("30d", r"--audit-retention: .*30d"),
        ("24", r"--audit-retention: .*24"),
    ],
)
def test_parse_retention_refuses_short_negative_and_malformed_values(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_retention(text, "--audit-retention")


class _Started(Exception):
    """Raised by the stand-in server, so `serve` ends right after it built the config."""


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[ServeConfig]:
    """The configs `rackflow serve` started a server with; nothing listens and logging is left alone."""
    configs: list[ServeConfig] = []

    def record(config: ServeConfig) -> Any:
        configs.append(config)
        raise _Started

    monkeypatch.setattr(server, "RackflowServer", record)
    monkeypatch.setattr(logs, "configure", lambda _fmt: None)
    return configs


@pytest.mark.parametrize(
    ("args", "env", "retention"),
    [
        ([], {}, None),
        (["--audit-retention", "720h"], {}, timedelta(days=30)),
        ([], {"RACKFLOW_AUDIT_RETENTION": "48h"}, timedelta(hours=48)),
        (["--audit-retention", "0"], {"RACKFLOW_AUDIT_RETENTION": "48h"}, None),  # the flag wins
    ],
)
def test_serve_passes_the_retention_to_the_server(
    started: list[ServeConfig], args: list[str], env: dict[str, str], retention: timedelta | None
) -> None:
    result = CliRunner().invoke(serve, args, env={"RACKFLOW_AUDIT_RETENTION": None, **env})
    assert isinstance(result.exception, _Started), result.output
    assert [config.audit_retention for config in started] == [retention]


@pytest.mark.parametrize("flag", ["--audit-retention", "--run-retention", "--task-retention"])
@pytest.mark.parametrize("by", ["flag", "variable"])
def test_serve_refuses_a_short_retention_before_starting(
    started: list[ServeConfig], flag: str, by: str
) -> None:
    variable = "RACKFLOW_" + flag.removeprefix("--").replace("-", "_").upper()
    args, env = ([flag, "30m"], {}) if by == "flag" else ([], {variable: "30m"})
    result = CliRunner().invoke(serve, args, env=env)
    assert result.exit_code == 2
    assert f"{flag}: must be at least 1h, or 0 to keep everything, got '30m'" in result.output
    assert started == []


def test_serve_passes_the_run_and_task_retentions_to_the_server(started: list[ServeConfig]) -> None:
    env = {"RACKFLOW_RUN_RETENTION": None, "RACKFLOW_TASK_RETENTION": "48h"}
    result = CliRunner().invoke(serve, ["--run-retention", "720h"], env=env)
    assert isinstance(result.exception, _Started), result.output
    assert [(c.run_retention, c.task_retention) for c in started] == [
        (timedelta(days=30), timedelta(hours=48))
    ]
    started.clear()
    CliRunner().invoke(serve, [], env={"RACKFLOW_RUN_RETENTION": None, "RACKFLOW_TASK_RETENTION": None})
    assert [(c.run_retention, c.task_retention) for c in started] == [(None, None)]  # keep everything


@pytest.mark.parametrize(
    ("args", "env", "http_listen"),
    [
        ([], {}, None),
        (["--http-listen", "127.0.0.1:8080"], {}, "127.0.0.1:8080"),
        ([], {"RACKFLOW_HTTP_LISTEN": "[::1]:0"}, "[::1]:0"),
        ([], {"RACKFLOW_HTTP_LISTEN": ""}, None),
    ],
)
def test_serve_passes_the_http_listener_to_the_server(
    started: list[ServeConfig], args: list[str], env: dict[str, str], http_listen: str | None
) -> None:
    result = CliRunner().invoke(serve, args, env={"RACKFLOW_HTTP_LISTEN": None, **env})
    assert isinstance(result.exception, _Started), result.output
    assert [config.http_listen for config in started] == [http_listen]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("8080", "--http-listen: expected HOST:PORT, got '8080'"),
        ("0.0.0.0:8080", "--http-listen: '0.0.0.0' is reachable beyond this machine"),
    ],
)
def test_serve_refuses_a_bad_or_exposed_http_listener(
    started: list[ServeConfig], value: str, message: str
) -> None:
    result = CliRunner().invoke(serve, ["--http-listen", value])
    assert result.exit_code == 2
    assert message in result.output
    assert started == []


def test_the_audit_spool_needs_a_file_and_a_bound_of_at_least_64_kib() -> None:
    with pytest.raises(InvalidArgument, match="--audit-spool: must name a file"):
        ServeConfig(audit_spool="")
    with pytest.raises(InvalidArgument, match="--audit-spool-max-bytes: must be at least 65536, got 65535"):
        ServeConfig(audit_spool_max_bytes=65535)
    assert ServeConfig(audit_spool_max_bytes=65536).audit_spool_max_bytes == 65536


def test_serve_passes_the_http_guard_options_to_the_server(started: list[ServeConfig]) -> None:
    unset = {
        "RACKFLOW_HTTP_ALLOWED_HOSTS": None,
        "RACKFLOW_HTTP_ALLOWED_ORIGINS": None,
        "RACKFLOW_HTTP_MAX_BODY_BYTES": None,
    }
    CliRunner().invoke(serve, [], env=unset)
    args = ["--http-allowed-hosts", "rackflow.lab, 10.0.0.5,", "--http-max-body-bytes", "4096"]
    env = {**unset, "RACKFLOW_HTTP_ALLOWED_ORIGINS": "https://portal.lab:8443"}
    result = CliRunner().invoke(serve, args, env=env)
    assert isinstance(result.exception, _Started), result.output
    assert [(c.http_allowed_hosts, c.http_allowed_origins, c.http_max_body_bytes) for c in started] == [
        ((), (), 1024 * 1024),
        (("rackflow.lab", "10.0.0.5"), ("https://portal.lab:8443",), 4096),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--http-max-body-bytes", "1023"], "--http-max-body-bytes: must be at least 1024, got 1023"),
        (["--http-allowed-origins", "portal.lab"], "expected scheme://host[:port], got 'portal.lab'"),
        (
            ["--http-allowed-origins", "https://a.lab/x"],
            "expected scheme://host[:port], got 'https://a.lab/x'",
        ),
        # An origin given for a host name was taken, and matched no Host header ever: 403 for every request.
        (
            ["--http-allowed-hosts", "rackflow.lab,https://portal.lab"],
            "--http-allowed-hosts: expected a host name (rackflow.lab), an address or *, got 'https://portal.lab'",
        ),
        (
            ["--http-allowed-hosts", "portal.lab/console"],
            "an address or *, got 'portal.lab/console'",
        ),
    ],
)
def test_serve_refuses_a_bad_http_guard_option(
    started: list[ServeConfig], args: list[str], message: str
) -> None:
    result = CliRunner().invoke(serve, args)
    assert result.exit_code == 2
    assert message in result.output
    assert started == []


@pytest.mark.parametrize("value", ["1ms", "250us", "9s"])
def test_serve_refuses_a_hold_threshold_under_its_minimum(started: list[ServeConfig], value: str) -> None:
    """A threshold of 1ms was taken, and the hold watcher (which looks every quarter of the threshold, at
    most every 15 s) polled the database about every 250 µs on every instance."""
    result = CliRunner().invoke(serve, ["--notification-hold-threshold", value])
    assert result.exit_code == 2
    assert f"--notification-hold-threshold: must be at least 10s, got {value!r}" in result.output
    assert started == []


@pytest.mark.parametrize(
    ("value", "threshold"), [("10s", timedelta(seconds=10)), ("30s", timedelta(seconds=30))]
)
def test_serve_passes_a_hold_threshold_from_its_minimum_on(
    started: list[ServeConfig], value: str, threshold: timedelta
) -> None:
    result = CliRunner().invoke(serve, ["--notification-hold-threshold", value])
    assert isinstance(result.exception, _Started), result.output
    assert [config.notification_hold_threshold for config in started] == [threshold]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://rackflow@db.internal/rackflow", "--db: unsupported database 'mysql' (use sqlite:///"),
        ("postgresql+asyncpg://rackflow@db/rackflow", "--db: unsupported PostgreSQL driver 'asyncpg'"),
        ("db.internal/rackflow", "--db: cannot parse the database URL"),
        (
            "sqlite:////nonexistent/rackflow/rackflow.db",
            "--db: the SQLite file's directory /nonexistent/rackflow does not exist",
        ),
    ],
)
@pytest.mark.parametrize("command", [["serve"], ["db", "migrate"], ["db", "backup", "copy.db"]])
@pytest.mark.parametrize("by", ["flag", "variable"])
def test_a_bad_database_url_is_a_usage_error_naming_db(
    started: list[ServeConfig], tmp_path: Any, command: list[str], url: str, message: str, by: str
) -> None:
    """A URL no driver takes was exit 1, `error: db: …`, from `serve` and `db migrate` once they tried to
    connect, and a SQLite file in a missing directory `error: database unavailable: unable to open database
    file`: docs/CONFIGURATION.md promises a bad value is a usage error (exit 2) naming the flag."""
    from rackflow.cli.main import main

    args, env = (["--db", url], {}) if by == "flag" else ([], {"RACKFLOW_DB": url})
    result = CliRunner().invoke(main, [*command, *args], env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert started == []


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_case(pki: Pki, tmp_path: Path, case: str) -> tuple[list[str], str]:
    """The TLS flags of one misconfiguration, and the start of what `serve` must say of it."""
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    cert, key, ca = str(pki.server.cert), str(pki.server.key), str(pki.ca.cert)
    return {
        "another's key": (
            ["--tls-cert", cert, "--tls-key", str(pki.client.key)],
            f"--tls-key: {pki.client.key} is not the private key of the certificate in {cert}",
        ),
        "no certificate": (
            ["--tls-cert", str(not_pem), "--tls-key", key],
            f"--tls-cert: {not_pem} holds no PEM certificate",
        ),
        "no key": (
            ["--tls-cert", cert, "--tls-key", str(not_pem)],
            f"--tls-key: {not_pem} is not a PEM private key (unencrypted) of the certificate in {cert}",
        ),
        "no client CA": (
            ["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", str(not_pem)],
            f"--tls-client-ca: {not_pem} holds no PEM certificate",
        ),
        "a missing file": (
            ["--tls-cert", cert, "--tls-key", str(tmp_path / "gone.key")],
            f"--tls-key: cannot read '{tmp_path / 'gone.key'}': No such file or directory",
        ),
        "the right pair": (["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca], ""),
    }[case]


@pytest.mark.parametrize(
    "case", ["another's key", "no certificate", "no key", "no client CA", "a missing file", "the right pair"]
)
def test_serve_refuses_tls_files_that_are_not_a_certificate_and_its_key(
    started: list[ServeConfig], pki: Pki, tmp_path: Path, case: str
) -> None:
    """A key of another certificate (or a file that is no PEM) was found only when gRPC bound the port, and
    reported as `--listen: cannot listen on 127.0.0.1:50051: the address is in use (another rackflow
    serve?)`, after lines of gRPC's own (`Invalid private key.`); a file that could not be read, with exit
    code 1. Each is now bad usage naming the flag and the file, before anything starts."""
    args, message = _tls_case(pki, tmp_path, case)
    result = CliRunner().invoke(serve, args)
    if not message:
        assert isinstance(result.exception, _Started), result.output
        return
    assert result.exit_code == 2, result.output
    assert f"Error: {message}" in result.output
    assert started == []


@pytest.mark.parametrize("case", ["missing directory", "a directory", "a file in place of its directory"])
def test_serve_refuses_an_audit_spool_it_could_not_write(
    started: list[ServeConfig], tmp_path: Path, case: str
) -> None:
    """A spool in a directory that does not exist was accepted; the first database outage then lost every
    event it should have kept (`AUDIT WRITE FAILED … cannot be written`), the one thing the spool is for."""
    (tmp_path / "a-file").write_text("")
    spool = {
        "missing directory": tmp_path / "no-such-dir" / "audit.spool",
        "a directory": tmp_path,
        "a file in place of its directory": tmp_path / "a-file" / "audit.spool",
    }[case]
    result = CliRunner().invoke(serve, ["--audit-spool", str(spool)])
    assert result.exit_code == 2, result.output
    assert f"Error: --audit-spool: cannot keep audit events in {spool}: " in result.output
    assert started == []


def test_serve_takes_an_audit_spool_in_a_directory_it_may_write(
    started: list[ServeConfig], tmp_path: Path
) -> None:
    result = CliRunner().invoke(serve, ["--audit-spool", str(tmp_path / "audit.spool")])
    assert isinstance(result.exception, _Started), result.output
    assert not (tmp_path / "audit.spool").exists()  # looked at, not made


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--dispatch-interval", "1ms", "--dispatch-interval: must be at least 100ms, got '1ms'"),
        ("--dispatch-interval", "99ms", "--dispatch-interval: must be at least 100ms, got '99ms'"),
        ("--lease-ttl", "3ms", "--lease-ttl: must be at least 1s, got '3ms'"),
        ("--lease-ttl", "999ms", "--lease-ttl: must be at least 1s, got '999ms'"),
    ],
)
def test_serve_refuses_a_dispatch_interval_or_lease_that_would_poll_the_database_without_pause(
    started: list[ServeConfig], flag: str, value: str, message: str
) -> None:
    """`--dispatch-interval 1ms` was taken (only `> 0` was asked): an idle instance polled for due
    schedules 100 times a second and held a core at 87 %; `--lease-ttl 3ms` heartbeated every millisecond
    and let any other instance take its tasks over at the first pause of a few milliseconds."""
    result = CliRunner().invoke(serve, [flag, value])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert started == []


@pytest.mark.parametrize(("flag", "value"), [("--dispatch-interval", "100ms"), ("--lease-ttl", "1s")])
def test_serve_takes_a_dispatch_interval_or_lease_from_its_minimum_on(
    started: list[ServeConfig], flag: str, value: str
) -> None:
    result = CliRunner().invoke(serve, [flag, value])
    assert isinstance(result.exception, _Started), result.output


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "--progress-interval: must be positive, got '0'"),
        ("-5s", "--progress-interval: must be positive, got '-5s'"),
        ("5", '--progress-interval: invalid duration "5": missing unit'),
        # A unit slipped (`5ms` for `5s`): every quick batch's message written as it starts, a row version a
        # step, and the tick waking the event loop hundreds of times a second.
        ("5ms", "--progress-interval: must be at least 1s, got '5ms'"),
        ("999ms", "--progress-interval: must be at least 1s, got '999ms'"),
        # The other slip (`5h` for `5s`): a running rack's message hours behind the batch under way.
        ("5h", "--progress-interval: must be at most 5m, got '5h'"),
        ("5m1s", "--progress-interval: must be at most 5m, got '5m1s'"),
    ],
)
@pytest.mark.parametrize("by", ["flag", "variable"])
def test_serve_refuses_a_progress_interval_that_is_not_a_duration_from_1s_to_5m(
    started: list[ServeConfig], value: str, message: str, by: str
) -> None:
    variable = {"RACKFLOW_PROGRESS_INTERVAL": value}
    args, env = (["--progress-interval", value], {}) if by == "flag" else ([], variable)
    result = CliRunner().invoke(serve, args, env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert started == []


@pytest.fixture
def executors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Executor]:
    """The executors `rackflow serve` built, as its server builds it (nothing starts: the stand-in ends
    `serve` once the real server made its executor)."""
    built: list[Executor] = []
    real = server.RackflowServer

    def record(config: ServeConfig) -> Any:
        made = real(config)
        built.append(made.executor(build_backend(config, made.clock)))
        raise _Started

    monkeypatch.setattr(server, "RackflowServer", record)
    monkeypatch.setattr(logs, "configure", lambda _fmt: None)
    return built


@pytest.mark.parametrize(
    ("args", "env", "interval"),
    [
        ([], {}, timedelta(seconds=5)),
        (["--progress-interval", "1s"], {}, timedelta(seconds=1)),
        ([], {"RACKFLOW_PROGRESS_INTERVAL": "1m30s"}, timedelta(seconds=90)),
        (["--progress-interval", "5m"], {}, timedelta(minutes=5)),
        (["--progress-interval", "2s"], {"RACKFLOW_PROGRESS_INTERVAL": "1m30s"}, timedelta(seconds=2)),
    ],
)
def test_serve_gives_the_executor_its_progress_interval(
    executors: list[Executor], tmp_path: Path, args: list[str], env: dict[str, str], interval: timedelta
) -> None:
    """`progress_interval` was the executor's constructor argument only: every server wrote its tasks'
    progress every 5 s, whatever an operator needed."""
    db = ["--db", f"sqlite:///{tmp_path / 'rackflow.db'}"]
    result = CliRunner().invoke(serve, [*db, *args], env={"RACKFLOW_PROGRESS_INTERVAL": None, **env})
    assert isinstance(result.exception, _Started), result.output
    assert [executor.progress_interval for executor in executors] == [interval]
