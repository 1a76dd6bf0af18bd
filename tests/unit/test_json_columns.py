"""The JSON columns of the set-based writes (`store.dialect.rows_values`) go as the text `json.dumps` writes,
from an encoder made once."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from rackflow.store.dialect import rows_values
from rackflow.store.tables import tasks

VALUES: list[Any] = [
    None,
    [],
    {},
    {"kind": "power_on", "forced": False, "target_version": "", "window_start": None},
    ["0190c9a2-0000-7000-8000-000000000001"],
    [{"scope_id": "s", "outcome": "failed", "error": 'a "quoted" \\ {brace}, émoji ✓\n\t\x00'}],
    {"submitted": [0, 1], "nested": {"deep": [[], {}, [1.5, -0.0, 1e100, 10**30]]}},
    {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "true": True},
    "a plain string ✓",
    12,
    0.1,
    [None, True, False],
]


def test_a_json_column_goes_as_the_text_json_dumps_writes() -> None:
    texts = rows_values(tasks, [{"parameters": value} for value in VALUES])["b_parameters"]
    assert texts == [json.dumps(value) for value in VALUES]


def test_a_value_json_cannot_write_is_refused_as_json_dumps_refuses_it() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        rows_values(tasks, [{"parameters": {"when": object()}}])
