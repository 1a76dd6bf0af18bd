"""`Operation.summary`: the one line the API (`TaskSchedule.summary`) and the CLI show for an operation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from rackflow.domain.tasks import Operation, OperationKind

WINDOW_START = datetime(2026, 6, 1, 4, 0, tzinfo=timezone(timedelta(hours=2)))


@pytest.mark.parametrize(
    ("operation", "summary"),
    [
        (Operation(OperationKind.POWER_ON), "Power On"),
        (Operation(OperationKind.POWER_OFF), "Power Off"),
        (Operation(OperationKind.POWER_OFF, forced=True), "Power Off (forced)"),
        (Operation(OperationKind.POWER_RESET), "Power Reset"),
        (Operation(OperationKind.POWER_RESET, forced=True), "Power Reset (forced)"),
        (Operation(OperationKind.BRING_UP), "Bring Up"),
        (Operation(OperationKind.INGEST), "Ingest"),
        (Operation(OperationKind.UPGRADE_FIRMWARE, target_version="v2.1.0"), "Upgrade Firmware to v2.1.0"),
        (
            Operation(
                OperationKind.UPGRADE_FIRMWARE,
                target_version="v2.1.0",
                window_start=WINDOW_START,
                window_end=datetime(2026, 6, 1, 6, 30, tzinfo=UTC),
            ),
            "Upgrade Firmware to v2.1.0 from 2026-06-01T02:00:00Z until 2026-06-01T06:30:00Z",
        ),
    ],
)
def test_summary(operation: Operation, summary: str) -> None:
    assert operation.summary == summary


def test_every_kind_has_a_summary_of_its_own() -> None:
    summaries = {Operation(kind).summary for kind in OperationKind}
    assert len(summaries) == len(OperationKind)
