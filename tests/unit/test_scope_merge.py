"""The seeds' filter merge table (AddTaskScheduleScope) row by row; UpdateTaskScheduleScope reconcile."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from rackflow.domain.inventory import (
    ComponentFilter,
    ComponentsFilter,
    ComponentType,
    RackSelection,
    TypesFilter,
)
from rackflow.domain.schedules import Scope
from rackflow.errors import FailedPrecondition
from rackflow.schedules.scope import merge, merge_filters, reconcile

RACK = uuid.uuid4()
C1, C2, C3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
COMPUTE = TypesFilter(frozenset({ComponentType.COMPUTE}))
NVSWITCH = TypesFilter(frozenset({ComponentType.NVSWITCH}))
COMPUTE_AND_NVSWITCH = TypesFilter(frozenset({ComponentType.COMPUTE, ComponentType.NVSWITCH}))
ONE_TWO = ComponentsFilter(frozenset({C1, C2}))
TWO_THREE = ComponentsFilter(frozenset({C2, C3}))


def scope(rack_id: uuid.UUID, value: ComponentFilter | None) -> Scope:
    return Scope(
        id=uuid.uuid4(),
        schedule_id=uuid.uuid4(),
        rack_id=rack_id,
        filter=value,
        last_task_id=None,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


# --- the merge table ----------------------------------------------------------------------------


@pytest.mark.parametrize("incoming", [None, COMPUTE, ONE_TWO], ids=["null", "types", "components"])
def test_existing_null_absorbs_anything(incoming: ComponentFilter | None) -> None:
    assert merge_filters(None, incoming, RACK) is None


@pytest.mark.parametrize("existing", [COMPUTE, ONE_TWO], ids=["types", "components"])
def test_incoming_null_widens_to_all_components(existing: ComponentFilter) -> None:
    assert merge_filters(existing, None, RACK) is None


def test_types_and_types_unite() -> None:
    assert merge_filters(COMPUTE, NVSWITCH, RACK) == COMPUTE_AND_NVSWITCH
    assert merge_filters(COMPUTE_AND_NVSWITCH, COMPUTE, RACK) == COMPUTE_AND_NVSWITCH


def test_components_and_components_unite() -> None:
    assert merge_filters(ONE_TWO, TWO_THREE, RACK) == ComponentsFilter(frozenset({C1, C2, C3}))


def test_types_then_components_is_an_error_naming_the_rack() -> None:
    with pytest.raises(FailedPrecondition, match=str(RACK)):
        merge_filters(COMPUTE, ONE_TWO, RACK)


def test_components_then_types_is_an_error_naming_the_rack() -> None:
    with pytest.raises(FailedPrecondition, match=str(RACK)):
        merge_filters(ONE_TWO, COMPUTE, RACK)


# --- merge over a whole scope -------------------------------------------------------------------


def test_new_rack_is_added_as_given_and_existing_racks_are_kept() -> None:
    other = uuid.uuid4()
    existing = [scope(RACK, COMPUTE)]
    changes = merge(existing, [RackSelection(other, ONE_TWO)])
    assert changes.to_add == (RackSelection(other, ONE_TWO),)
    assert changes.to_update == ()
    assert changes.to_remove == ()


def test_rack_in_scope_gets_the_merged_filter() -> None:
    existing = [scope(RACK, COMPUTE)]
    changes = merge(existing, [RackSelection(RACK, NVSWITCH)])
    assert changes.to_add == ()
    assert changes.to_update == ((existing[0], COMPUTE_AND_NVSWITCH),)


def test_merge_that_changes_nothing_writes_nothing() -> None:
    existing = [scope(RACK, None)]
    changes = merge(existing, [RackSelection(RACK, COMPUTE)])
    assert (changes.added, changes.updated, changes.removed) == (0, 0, 0)


def test_one_bad_rack_fails_the_whole_merge() -> None:
    good, bad = uuid.uuid4(), uuid.uuid4()
    existing = [scope(good, COMPUTE), scope(bad, ONE_TWO)]
    with pytest.raises(FailedPrecondition, match=str(bad)):
        merge(
            existing,
            [RackSelection(good, NVSWITCH), RackSelection(uuid.uuid4()), RackSelection(bad, COMPUTE)],
        )


def test_the_same_new_rack_twice_merges_into_one_entry() -> None:
    changes = merge([], [RackSelection(RACK, COMPUTE), RackSelection(RACK, NVSWITCH)])
    assert changes.to_add == (RackSelection(RACK, COMPUTE_AND_NVSWITCH),)


# --- reconcile ----------------------------------------------------------------------------------


def test_reconcile_adds_removes_and_replaces() -> None:
    kept, changed, dropped, new = uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    current = [scope(kept, COMPUTE), scope(changed, COMPUTE), scope(dropped, None)]
    changes = reconcile(
        current, [RackSelection(kept, COMPUTE), RackSelection(changed, ONE_TWO), RackSelection(new, None)]
    )
    assert changes.to_add == (RackSelection(new, None),)
    assert changes.to_update == ((current[1], ONE_TWO),)
    assert changes.to_remove == (current[2],)
    assert (changes.added, changes.removed, changes.updated) == (1, 1, 1)


def test_reconcile_replaces_rather_than_merges_a_different_kind() -> None:
    current = [scope(RACK, COMPUTE)]
    changes = reconcile(current, [RackSelection(RACK, ONE_TWO)])
    assert changes.to_update == ((current[0], ONE_TWO),)


def test_reconcile_to_the_same_scope_changes_nothing() -> None:
    current = [scope(RACK, COMPUTE)]
    changes = reconcile(current, [RackSelection(RACK, COMPUTE)])
    assert (changes.added, changes.removed, changes.updated) == (0, 0, 0)


def test_reconcile_to_nothing_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="delete the schedule instead"):
        reconcile([scope(RACK, None)], [])
