"""The fault proxy (tests/faults/tcp_proxy.py) passes PostgreSQL's protocol through, cuts every connection
and refuses new ones while dropping, cuts the one connection that sends a given message, and delays without
breaking anything."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.conftest import postgres_admin_url
from tests.e2e.fleet import wait_until
from tests.faults.tcp_proxy import TcpProxy

pytestmark = pytest.mark.postgres


@pytest.fixture
def proxied(postgres_url: str) -> Iterator[tuple[TcpProxy, str]]:
    admin = make_url(postgres_admin_url()).set(drivername="postgresql")
    proxy = TcpProxy(admin.port or 5432)
    port = proxy.start()
    try:
        yield proxy, admin.set(port=port).render_as_string(False)
    finally:
        proxy.stop()


def test_drop_cuts_connections_and_refuses_new_ones_for_a_while(proxied: tuple[TcpProxy, str]) -> None:
    proxy, url = proxied
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert proxy.drop(1.0) == 1
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=5)
    time.sleep(1.1)
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_delay_holds_each_round_trip(proxied: tuple[TcpProxy, str]) -> None:
    proxy, url = proxied
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        proxy.delay(0.2)
        started = time.monotonic()
        assert conn.execute("SELECT 3").fetchone() == (3,)
        held = time.monotonic() - started
        proxy.delay(0)
    assert held >= 0.4  # one chunk each way, each held 0.2 s


@pytest.mark.parametrize("delivered", [True, False], ids=["answer-lost", "commit-lost"])
def test_cut_at_cuts_the_connection_that_sends_the_message_losing_its_answer_or_itself(
    proxied: tuple[TcpProxy, str], delivered: bool
) -> None:
    proxy, url = proxied
    table = f"cut_at_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f"CREATE TABLE {table} (n int)")
        try:
            with psycopg.connect(url, connect_timeout=5) as conn:
                backend = conn.info.backend_pid
                conn.execute(f"INSERT INTO {table} VALUES (1)")
                proxy.cut_at(b"COMMIT", delivered=delivered)
                with pytest.raises(psycopg.OperationalError):
                    conn.commit()
            wait_until(  # the server ends the cut connection's transaction, if it has not yet
                lambda: (
                    admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,)).fetchone()
                    is None
                ),
                timeout=15,
                what="the cut connection's backend to exit",
            )
            rows = admin.execute(f"SELECT count(*) FROM {table}").fetchone()
        finally:
            admin.execute(f"DROP TABLE {table}")
    assert rows == ((1,) if delivered else (0,))
