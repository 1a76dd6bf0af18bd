"""Run only by tests/tooling/test_xdist_groups.py (the name does not match `test_*.py`): a group of tests that
`--dist loadgroup` must run on one worker."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("sample")


@pytest.mark.parametrize("case", range(6))
def test_in_the_sample_group(case: int) -> None:
    assert case in range(6)
