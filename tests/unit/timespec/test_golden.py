"""Every line of the golden files is one test: Go's own answers, and the DST rule's.

The files are part of the repository (`tests/data/golden`, see its README), so a clone anywhere runs them.
A missing file fails the suite rather than skipping it: without them nothing here proves rackflow agrees
with Go.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rackflow.timespec import (
    InvalidSpec,
    ScheduleSpec,
    SpecType,
    parse_go_duration,
    parse_rfc3339,
    parse_spec,
    resolve_zone,
    rfc3339_utc,
)

TESTDATA = Path(__file__).resolve().parents[2] / "data" / "golden"
FILES = ("go-time-corpus.jsonl", "dst-cases.jsonl")
VALID_SPEC = {SpecType.INTERVAL: "1h", SpecType.CRON: "0 * * * *", SpecType.ONE_TIME: "2026-06-01T04:00:00Z"}


def _cases() -> Iterator[Any]:
    for name in FILES:
        stem = name.removesuffix(".jsonl")
        path = TESTDATA / name
        if not path.is_file():
            yield pytest.param(None, str(path), id=f"{stem}:missing")
            continue
        for number, line in enumerate(path.read_text("utf-8").splitlines(), start=1):
            if line.strip():
                yield pytest.param(json.loads(line), str(path), id=f"{stem}:{number}")


@pytest.mark.parametrize(("case", "source"), list(_cases()))
def test_golden(case: dict[str, Any] | None, source: str) -> None:
    if case is None:
        pytest.fail(f"golden file missing: {source} (it belongs in the repository)")
    check = {"cron": _check_cron, "duration": _check_duration, "rfc3339": _check_rfc3339, "tz": _check_tz}
    check[case["kind"]](case, case["expect"])


def test_every_golden_file_is_present_and_full() -> None:
    for name in FILES:
        assert (TESTDATA / name).is_file(), f"missing {TESTDATA / name}"
        assert len((TESTDATA / name).read_text("utf-8").splitlines()) > 100


def _check_cron(case: dict[str, Any], expect: dict[str, Any]) -> None:
    spec = ScheduleSpec(SpecType.CRON, case["spec"], case["tz"])
    if not expect["ok"]:
        with pytest.raises(InvalidSpec) as caught:
            parse_spec(spec)
        assert caught.value.field == ("spec.spec" if _zone_ok(case["tz"]) else "spec.timezone")
        return
    times = parse_spec(spec).preview(parse_rfc3339(case["from"]), case["n"])
    assert [t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in times] == expect["next"]
    assert all(t.tzinfo is UTC for t in times)


def _check_duration(case: dict[str, Any], expect: dict[str, Any]) -> None:
    spec = ScheduleSpec(SpecType.INTERVAL, case["s"])
    if not expect["ok"]:
        with pytest.raises(ValueError):
            parse_go_duration(case["s"])
        with pytest.raises(InvalidSpec):
            parse_spec(spec)
        return
    assert parse_go_duration(case["s"]) == expect["ns"]
    if expect["ns"] > 0:
        parse_spec(spec)
    else:
        with pytest.raises(InvalidSpec, match="greater than zero"):
            parse_spec(spec)


def _check_rfc3339(case: dict[str, Any], expect: dict[str, Any]) -> None:
    spec = ScheduleSpec(SpecType.ONE_TIME, case["s"])
    if not expect["ok"]:
        with pytest.raises(ValueError):
            parse_rfc3339(case["s"])
        with pytest.raises(InvalidSpec):
            parse_spec(spec)
        return
    assert rfc3339_utc(case["s"]) == expect["utc"]
    at = _stored_instant(expect["utc"])
    assert parse_rfc3339(case["s"]) == at
    assert parse_spec(spec).preview(datetime(2000, 1, 1, tzinfo=UTC), 1) == [at]


def _check_tz(case: dict[str, Any], expect: dict[str, Any]) -> None:
    assert _zone_ok(case["s"]) == expect["ok"]
    for kind, text in VALID_SPEC.items():  # the zone is validated for every spec type
        spec = ScheduleSpec(kind, text, case["s"])
        if expect["ok"]:
            parse_spec(spec)
        else:
            with pytest.raises(InvalidSpec) as caught:
                parse_spec(spec)
            assert caught.value.field == "spec.timezone"


def _zone_ok(name: str) -> bool:
    try:
        resolve_zone(name)
    except ValueError:
        return False
    return True


def _stored_instant(utc: str) -> datetime:
    """What parse_rfc3339 must store for a golden UTC answer: rounded up to the microsecond, clamped."""
    year = int(utc[: utc.index("-", 1)])
    if year < 1:
        return datetime.min.replace(tzinfo=UTC)
    whole, _, fraction = utc.removesuffix("Z").partition(".")
    base = datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)
    nanos = int(fraction.ljust(9, "0")) if fraction else 0
    return base + timedelta(microseconds=-(-nanos // 1000))
