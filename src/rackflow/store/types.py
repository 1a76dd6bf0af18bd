"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, ColumnElement, DateTime, Dialect, FunctionElement
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.types import TypeDecorator, TypeEngine


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on every database.

    SQLite has no time zones and drops offsets, so values are stored there as naive UTC; PostgreSQL stores
    `timestamptz`. Naive datetimes are refused on the way in: a naive time is a bug, not a guess to make.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} cannot be stored; use an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def json_type() -> Any:
    """JSON on SQLite, JSONB on PostgreSQL."""
    return JSON().with_variant(JSONB(), "postgresql")


class UUIDArray(TypeDecorator[tuple[uuid.UUID, ...]]):
    """A JSON array of UUIDs' texts, read as a tuple of `uuid.UUID` on every database.

    A task names each component it acts on, 36 on a GB200 NVL72 rack, and making a `uuid.UUID` of each
    text in Python was two thirds of reading 1,000 such tasks (docs/PERFORMANCE.md, "The 1,000-row pages
    at 36 components"). So on PostgreSQL every SELECT and RETURNING of the column reads it as a `uuid[]`
    that the database makes, in the array's order (`column_expression`, `_UUIDsOf`), whose UUIDs psycopg
    makes in C (PostgreSQL spends 35-45 ms of its own CPU on it for 1,000 tasks of 36 ids, where Python
    saved 60-130 ms); SQLite's JSON texts are parsed here. Written as JSON: a list of the ids' texts.
    """

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return dialect.type_descriptor(JSONB() if dialect.name == "postgresql" else JSON())

    def column_expression(self, colexpr: ColumnElement[Any]) -> ColumnElement[Any]:
        return _UUIDsOf(colexpr, type_=self)

    def process_result_value(self, value: list[Any] | None, dialect: Dialect) -> tuple[uuid.UUID, ...] | None:
        if value is None:
            return None
        if dialect.name == "postgresql":
            return tuple(value)
        return tuple(uuid.UUID(i) for i in value)


class _UUIDsOf(FunctionElement[Any]):
    """A JSON array of UUIDs' texts as the database gives it back: `UUIDArray`'s read."""

    name = "uuids_of"
    inherit_cache = True

    def __init__(self, column: ColumnElement[Any], type_: UUIDArray) -> None:
        super().__init__(column)
        self.type = type_


@compiles(_UUIDsOf)
def _uuids_of_json(element: _UUIDsOf, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.clauses, **kw)


@compiles(_UUIDsOf, "postgresql")
def _uuids_of_postgresql(element: _UUIDsOf, compiler: SQLCompiler, **kw: Any) -> str:
    array = compiler.process(element.clauses, **kw)
    return (
        f"ARRAY(SELECT item.id::uuid FROM jsonb_array_elements_text({array})"
        " WITH ORDINALITY AS item(id, n) ORDER BY item.n)"
    )
