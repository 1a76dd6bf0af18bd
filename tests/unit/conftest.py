"""tests/unit holds pure tests only: no database, no server, no other process. A test that needs one
belongs in tests/store, tests/api, tests/integration or tests/e2e; this hook refuses it here."""

from __future__ import annotations

import pytest

IMPURE_FIXTURES = frozenset(
    {"db", "db_url", "empty_db_url", "postgres_url", "pg_db", "served_db_url", "stub", "services"}
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = IMPURE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if used and "tests/unit/" in item.nodeid.replace("\\", "/"):
            raise pytest.UsageError(
                f"{item.nodeid} uses {', '.join(sorted(used))}: move it out of tests/unit (pure tests only)"
            )
