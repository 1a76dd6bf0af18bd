"""Go's `time.ParseDuration`, to the nanosecond.

Interval specs and `--dispatch-interval` are Go duration strings, and an operator moving a schedule from the
Go reference must get the same interval here. So this follows Go's algorithm step for step rather than a
regular expression: it works on UTF-8 bytes (Go strings are bytes, which is why `µs` and `μs` are two-byte
units and `１h` is rejected), keeps Go's overflow checks, and computes fractions with the same float64
arithmetic, so `1.0000000001h` rounds exactly as Go rounds it.
"""

from __future__ import annotations

import functools
import json
from datetime import timedelta
from typing import Final

_quote = functools.partial(json.dumps, ensure_ascii=False)

_UNITS: Final[dict[bytes, int]] = {
    b"ns": 1,
    b"us": 1_000,
    "µs".encode(): 1_000,  # U+00B5 MICRO SIGN
    "μs".encode(): 1_000,  # U+03BC GREEK SMALL LETTER MU
    b"ms": 1_000_000,
    b"s": 1_000_000_000,
    b"m": 60_000_000_000,
    b"h": 3_600_000_000_000,
}
_UNIT_LIST: Final = "ns, us, µs, ms, s, m, h"
_LIMIT: Final = 1 << 63  # Go accumulates the magnitude in a uint64 and allows up to 2^63 (for -2^63)
_UINT64: Final = (1 << 64) - 1
_DIGITS: Final = b"0123456789"


def parse_go_duration(text: str) -> int:
    """Parse a Go duration string (`"1h30m"`, `"-1.5s"`, `"0"`) into integer nanoseconds.

    Raises ValueError, with a message naming the text, for anything Go's `time.ParseDuration` rejects.
    A zero or negative result is a valid duration; callers that need a positive one check that themselves.
    """
    try:
        s = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: no Go string can hold them
        raise _invalid(text, "not valid UTF-8") from None
    neg = False
    if s[:1] in (b"-", b"+"):
        neg = s[:1] == b"-"
        s = s[1:]
    if s == b"0":
        return 0
    if not s:
        raise _invalid(text, "empty")
    total = 0
    while s:
        if s[0] != ord(".") and s[0] not in _DIGITS:
            raise _invalid(text, "expected a number")
        whole, s = _take_digits(s)
        value = _leading_int(whole)
        if value is None:
            raise _invalid(text, "out of range (about ±292 years)")
        frac, scale, has_frac = 0, 1.0, False
        if s[:1] == b".":
            frac_digits, s = _take_digits(s[1:])
            frac, scale = _leading_fraction(frac_digits)
            has_frac = bool(frac_digits)
        if not whole and not has_frac:
            raise _invalid(text, "a '.' needs digits")
        unit_text, s = _take_unit(s)
        if not unit_text:
            raise _invalid(text, f"missing unit (one of {_UNIT_LIST})")
        unit = _UNITS.get(unit_text)
        if unit is None:
            unit_name = _quote(unit_text.decode("utf-8", "replace"))
            raise _invalid(text, f"unknown unit {unit_name} (use one of {_UNIT_LIST})")
        if value > _LIMIT // unit:
            raise _invalid(text, "out of range (about ±292 years)")
        value *= unit
        if frac > 0:
            # Go: float64 keeps fractions of an hour nanosecond-accurate; truncation as uint64() does.
            value += int(float(frac) * (float(unit) / scale))
            if value > _LIMIT:
                raise _invalid(text, "out of range (about ±292 years)")
        # Go adds in uint64: the sum wraps only at exactly 2^64 (2^63 + 2^63), and then Go accepts it.
        total = (total + value) & _UINT64
        if total > _LIMIT:
            raise _invalid(text, "out of range (about ±292 years)")
    if neg:
        return -total
    if total > _LIMIT - 1:
        raise _invalid(text, "out of range (about ±292 years)")
    return total


def _invalid(text: str, reason: str) -> ValueError:
    return ValueError(f"invalid duration {_quote(text)}: {reason}")


def _take_digits(s: bytes) -> tuple[bytes, bytes]:
    i = 0
    while i < len(s) and s[i] in _DIGITS:
        i += 1
    return s[:i], s[i:]


def _leading_int(digits: bytes) -> int | None:
    """The digits' value, or None past 2^63 (Go's leadingInt overflow error)."""
    significant = digits.lstrip(b"0")
    if len(significant) > len(str(_LIMIT)):  # also keeps int() clear of its huge-string guard
        return None
    value = int(significant or b"0")
    return value if value <= _LIMIT else None


def _leading_fraction(digits: bytes) -> tuple[int, float]:
    """Go's leadingFraction: stop gaining precision (silently) once the numerator would pass 2^63."""
    value, scale = 0, 1.0
    for c in digits:
        if value > (_LIMIT - 1) // 10:
            break
        nxt = value * 10 + (c - ord("0"))
        if nxt > _LIMIT:
            break
        value, scale = nxt, scale * 10
    return value, scale


def _take_unit(s: bytes) -> tuple[bytes, bytes]:
    i = 0
    while i < len(s) and s[i] != ord(".") and s[i] not in _DIGITS:
        i += 1
    return s[:i], s[i:]


def format_go_duration(value: timedelta) -> str:
    """A positive duration in the fewest Go duration units that `parse_go_duration` reads back exactly:
    `15m`, `1h30m`, `1.5s`, `250ms` (whole microseconds, as `timedelta` holds them)."""
    micros = value // timedelta(microseconds=1)
    hours, rest = divmod(micros, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, fraction = divmod(rest, 1_000_000)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    if fraction and not (hours or minutes or seconds):
        parts.append(f"{fraction // 1000}ms" if fraction % 1000 == 0 else f"{fraction}us")
    elif seconds or fraction:
        parts.append(f"{seconds}.{fraction:06d}".rstrip("0").rstrip(".") + "s")
    return "".join(parts) or "0s"
