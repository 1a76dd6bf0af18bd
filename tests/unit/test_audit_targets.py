"""An audit target given by name: the one table of look-ups (`rackflow.domain.audit.target_lookups`) and
the one rule (`target_named`) both front ends ask."""

from __future__ import annotations

import pytest

from rackflow.domain.audit import NAMED_TARGETS, target_lookups, target_named
from rackflow.errors import InvalidArgument, NotFound


def test_a_name_one_kind_has_is_its_id() -> None:
    assert target_named("target", "nightly", {"schedule": "s-1"}) == "s-1"


def test_a_name_several_kinds_use_is_refused_with_their_ids() -> None:
    with pytest.raises(InvalidArgument) as refused:
        target_named("target", "db-01", {"rack": "r-1", "schedule": "s-1", "window": "w-1"})
    assert str(refused.value) == (
        "target: 'db-01' names a rack, a schedule and a maintenance window; give the id "
        "(rack r-1, schedule s-1, window w-1)"
    )


def test_a_name_nothing_has_is_not_found() -> None:
    with pytest.raises(NotFound, match=r"target: no rack, schedule, .* or channel is named 'gone'"):
        target_named("target", "gone", {})


class _Asked:
    """Look-ups that answer which of them was asked (`rackflow.domain.audit.TargetLookups`)."""

    def resolve_rack_id(self, name: str) -> str:
        return f"rack {name}"

    def resolve_schedule_id(self, name: str) -> str:
        return f"schedule {name}"

    def resolve_window_id(self, name: str) -> str:
        return f"window {name}"

    def resolve_domain_id(self, name: str) -> str:
        return f"domain {name}"

    def resolve_budget_id(self, name: str) -> str:
        return f"budget {name}"

    def resolve_check_id(self, name: str) -> str:
        return f"check {name}"

    def resolve_channel_id(self, name: str) -> str:
        return f"channel {name}"


def test_the_table_looks_up_every_named_kind_by_its_own_look_up() -> None:
    """The CLI and the dashboard both look a target up through this table: each kind the rule names,
    in its order, and each by the look-up of that kind."""
    table = target_lookups(_Asked())
    assert list(table) == list(NAMED_TARGETS)
    assert {kind: look_up("x") for kind, look_up in table.items()} == {kind: f"{kind} x" for kind in table}
