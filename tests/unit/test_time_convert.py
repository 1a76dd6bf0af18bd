"""Times and scope entries to messages, without a server or database: the in-place conversions the list
responses use give exactly what protobuf's own `Timestamp.FromDatetime` and a message built whole give."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import example, given
from hypothesis import strategies as st

from rackflow.api.convert import timestamp_from_micros_into, timestamp_into, timestamp_to
from rackflow.api.convert.schedules import scope_into, scopes_into
from rackflow.domain.inventory import ComponentFilter, ComponentsFilter, ComponentType, TypesFilter
from rackflow.domain.schedules import Scope
from rackflow.ids import EPOCH
from rackflow.store.schedules import micros_to
from rackflow.v1 import flow_pb2 as pb

_ZONES = st.sampled_from([UTC, timezone(timedelta(hours=-7, minutes=-30)), ZoneInfo("Europe/Berlin")])


@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=_ZONES),
)
@example(datetime(1995, 9, 24, 2, 30, tzinfo=ZoneInfo("Europe/Berlin")))  # the fold, first pass
@example(datetime(1995, 9, 24, 2, 30, fold=1, tzinfo=ZoneInfo("Europe/Berlin")))  # and second
@example(datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC))
def test_timestamp_into_matches_from_datetime(moment: datetime) -> None:
    """Before the epoch too, where the seconds are negative and the nanos still count forwards, and in a
    zone's DST fold."""
    expected = Timestamp()
    expected.FromDatetime(moment.astimezone(UTC))
    made = Timestamp()
    timestamp_into(made, moment)
    assert (made.seconds, made.nanos) == (expected.seconds, expected.nanos)
    assert timestamp_to(moment) == expected
    # In UTC: Python never calls an ambiguous local time (a DST fold) equal to a time of another zone.
    assert made.ToDatetime(tzinfo=UTC) == moment.astimezone(UTC)


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)))
@example(datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC))
@example(datetime(1970, 1, 1, tzinfo=UTC))
def test_timestamp_from_micros_into_matches_timestamp_into(moment: datetime) -> None:
    """A time read as microseconds since the epoch (`store.dialect.epoch_micros`) makes the message its
    `datetime` makes, before the epoch too."""
    expected, made = Timestamp(), Timestamp()
    timestamp_into(expected, moment)
    timestamp_from_micros_into(made, micros_to(moment - EPOCH))
    assert (made.seconds, made.nanos) == (expected.seconds, expected.nanos)


def test_timestamp_to_keeps_none() -> None:
    assert timestamp_to(None) is None


def _scope(filter: ComponentFilter | None = None, last_task_id: uuid.UUID | None = None) -> Scope:
    created = datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    return Scope(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), filter, last_task_id, created)


def test_scope_into_carries_every_field() -> None:
    task_id, component_id = uuid.uuid4(), uuid.uuid4()
    by_types = _scope(filter=TypesFilter(frozenset({ComponentType.CDU})), last_task_id=task_id)
    by_ids = _scope(filter=ComponentsFilter(frozenset({component_id})))
    for scope in (by_types, by_ids, _scope()):
        msg = scope_into(pb.TaskScheduleScope(), scope)
        assert (msg.id.id, msg.schedule_id.id, msg.rack_id.id) == tuple(
            str(value) for value in (scope.id, scope.schedule_id, scope.rack_id)
        )
        assert msg.HasField("last_task_id") == (scope.last_task_id is not None)
        assert msg.created_at.ToDatetime(tzinfo=UTC) == scope.created_at
    assert scope_into(pb.TaskScheduleScope(), by_types).last_task_id.id == str(task_id)
    assert list(scope_into(pb.TaskScheduleScope(), by_types).types.types) == [pb.COMPONENT_TYPE_CDU]
    assert [t.id.id for t in scope_into(pb.TaskScheduleScope(), by_ids).components.targets] == [
        str(component_id)
    ]


def test_scopes_into_appends_in_order() -> None:
    scopes = [_scope() for _ in range(3)]
    response = pb.ListTaskScheduleScopesResponse()
    response.scopes.add(rack_name="already there")
    scopes_into(response.scopes, scopes)
    assert [msg.id.id for msg in response.scopes] == ["", *(str(s.id) for s in scopes)]
