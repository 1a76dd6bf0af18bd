"""The rule for inventory text: names, external ids and versions, as stored and as looked up.

Apart from the service so that target resolution, which the service imports, can apply it too: a name
that no rack can have is refused before any query (PostgreSQL cannot even compare text holding a NUL).
"""

from __future__ import annotations

import unicodedata

from rackflow.errors import InvalidArgument

MAX_TEXT_LENGTH = 255  # the width of every inventory text column

# Control characters break terminals and logs (and NUL breaks PostgreSQL); surrogates are not text.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cs"})


def check_text(value: str, field: str, *, required: bool = False, identifier: bool = False) -> str:
    """Validate a stored inventory string and return it unchanged.

    `identifier`: names and external ids must not begin or end with whitespace, since "r1" and "r1 "
    would look like one name to an operator but be two to the database.
    """
    if not value:
        if required:
            raise InvalidArgument(f"{field}: must not be empty")
        return value
    if len(value) > MAX_TEXT_LENGTH:
        raise InvalidArgument(f"{field}: at most {MAX_TEXT_LENGTH} characters, got {len(value)}")
    if any(unicodedata.category(ch) in _FORBIDDEN_CATEGORIES for ch in value):
        raise InvalidArgument(f"{field}: {value!r} contains control characters")
    if identifier and value != value.strip():
        raise InvalidArgument(f"{field}: {value!r} has leading or trailing whitespace")
    return value
