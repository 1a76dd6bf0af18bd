"""The firing a refusal answers, carried in its trailing metadata (`rackflow.api.errors`): written for a
trigger that submitted no task alone, and read back as written; what is missing, malformed or binary reads
as no firing at all, as from a server too old to send it, so a client then says nothing of a run."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from rackflow.api.errors import (
    FIRED_AT_KEY,
    REPLAYED_KEY,
    RUN_ID_KEY,
    AnsweredFiring,
    answered_firing,
    trailing_metadata,
)
from rackflow.errors import FailedPrecondition, SubmittedNothing, Unavailable

RUN_ID = uuid.UUID("6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f")
FIRED_AT = datetime(2026, 12, 5, 20, 31, 7, 120000, tzinfo=UTC)


@pytest.mark.parametrize("replayed", [False, True])
def test_a_refusal_that_submitted_nothing_names_its_run_and_reads_back(replayed: bool) -> None:
    error = SubmittedNothing("id: … submitted no task", RUN_ID, FIRED_AT, replayed=replayed)
    metadata = trailing_metadata(error)
    assert dict(metadata) == {
        RUN_ID_KEY: str(RUN_ID),
        FIRED_AT_KEY: "2026-12-05T20:31:07.120000Z",
        REPLAYED_KEY: "true" if replayed else "false",
    }
    assert answered_firing(metadata) == AnsweredFiring(RUN_ID, FIRED_AT, replayed)
    # Among the other entries a status carries, in any order.
    assert answered_firing([("x-other", "1"), *reversed(metadata)]) == AnsweredFiring(
        RUN_ID, FIRED_AT, replayed
    )


def test_no_other_error_names_a_run() -> None:
    for error in (FailedPrecondition("id: consumed"), Unavailable("request_id: still being fired")):
        assert trailing_metadata(error) == ()


GOOD = {RUN_ID_KEY: str(RUN_ID), FIRED_AT_KEY: "2026-12-05T20:31:07Z", REPLAYED_KEY: "true"}


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        [],
        [(k, v) for k, v in GOOD.items() if k != REPLAYED_KEY],
        [(k, v) for k, v in GOOD.items() if k != RUN_ID_KEY],
        [(k, "not-a-uuid" if k == RUN_ID_KEY else v) for k, v in GOOD.items()],
        [(k, "2026-12-05 20:31" if k == FIRED_AT_KEY else v) for k, v in GOOD.items()],
        [(k, v.encode() if k == RUN_ID_KEY else v) for k, v in GOOD.items()],
        *([(k, odd if k == REPLAYED_KEY else v) for k, v in GOOD.items()] for odd in ("TRUE", "1", "")),
    ],
    ids=["none", "empty", "no-replayed", "no-run", "bad-run", "bad-time", "binary", "TRUE", "1", "blank"],
)
def test_what_is_missing_or_malformed_is_no_firing(metadata: list[tuple[str, str | bytes]] | None) -> None:
    assert answered_firing(metadata) is None
