"""An audit target given by name: the one rule both front ends ask (`rackflow.domain.audit.target_named`)."""

from __future__ import annotations

import pytest

from rackflow.domain.audit import NAMED_TARGETS, target_named
from rackflow.errors import InvalidArgument, NotFound
from rackflow.web import refs


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


def test_the_dashboard_looks_up_every_named_kind() -> None:
    assert list(refs.BY_KIND) == list(NAMED_TARGETS)
