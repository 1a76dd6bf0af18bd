"""The fault proxy (tests/faults/tcp_proxy.py) passes PostgreSQL's protocol through, cuts every connection
and refuses new ones while dropping, and delays without breaking anything."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url

from tests.conftest import postgres_admin_url
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
