"""`domain.audit.bounded_json`: a JSON document past its limit is cut to fit, whatever its shape (texts of
non-ASCII characters, which the API sends as escapes; objects of many keys; deep nesting; a list), stays
JSON of the same shape, and says it was cut and how big it was; one within its limit is left as it is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rackflow.domain.audit import TRUNCATED, bounded_json, json_bytes

LIMIT = 4096


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": "n" * 10_000}
    for level in range(depth):
        value = {f"level{level}": value, "items": list(range(50))}
    return value


@pytest.mark.parametrize(
    "document",
    [
        {"name": "é" * 100_000},  # 6 bytes a character as the API sends it
        {"labels": {f"key{i}": f"value{i}" for i in range(10_000)}},
        {"racks": [{"id": {"id": f"{i:036d}"}, "parts": [str(j) for j in range(100)]} for i in range(500)]},
        nested(60),
        {"k" * 50_000: 1},
    ],
    ids=["non-ascii", "many-keys", "nested-lists", "deep", "long-key"],
)
def test_a_document_past_its_limit_is_cut_to_it_and_marked(document: dict[str, Any]) -> None:
    cut = bounded_json(document, LIMIT)
    assert json_bytes(cut) <= LIMIT
    assert cut[TRUNCATED] == {"original_bytes": json_bytes(document), "limit_bytes": LIMIT}
    assert json.loads(json.dumps(cut)) == cut and len(cut) > 1  # kept something besides the mark


def test_a_list_is_marked_by_its_last_item_and_a_small_document_is_left_as_it_is() -> None:
    changes = [{"scope_entry": "removed", "rack_id": str(i)} for i in range(1_000)]
    cut = bounded_json(changes, LIMIT)
    assert json_bytes(cut) <= LIMIT and cut[0] == changes[0]
    assert cut[-1] == {TRUNCATED: {"original_bytes": json_bytes(changes), "limit_bytes": LIMIT}}
    small = {"name": "nightly", "racks": [1, 2, 3]}
    assert bounded_json(small, LIMIT) is small
