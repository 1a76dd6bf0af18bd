"""Go duration parsing beyond the golden corpus: fraction arithmetic, overflow edges, byte-level units."""

from __future__ import annotations

import pytest

from rackflow.timespec import parse_go_duration

MAX_INT64 = 2**63 - 1


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1ns", 1),
        ("1us", 1_000),
        ("1µs", 1_000),  # U+00B5 micro sign
        ("1μs", 1_000),  # U+03BC Greek mu
        ("1ms", 1_000_000),
        ("1s", 1_000_000_000),
        ("1m", 60_000_000_000),
        ("1h", 3_600_000_000_000),
        ("-.5s", -500_000_000),
        ("+0", 0),
        ("0.5ms1ns", 500_001),
        ("1.000000001s", 1_000_000_001),
        ("0.333333333333333333333h", 1_200_000_000_000),  # float64 arithmetic, truncated like Go
        ("000000000000000000000000001s", 1_000_000_000),  # leading zeros are not an overflow
        ("9223372036854775807ns", MAX_INT64),
        ("-9223372036854775808ns", -(2**63)),
        ("2562047h47m16.854775807s", MAX_INT64),
        # Go adds the parts in a uint64 that wraps at exactly 2^64 and then passes its checks.
        ("9223372036854775808ns9223372036854775808ns", 0),
    ],
)
def test_valid(text: str, ns: int) -> None:
    assert parse_go_duration(text) == ns


@pytest.mark.parametrize(
    "text",
    [
        "",
        "+",
        "-",
        ".",
        ".s",
        "-.s",
        "1",
        "1.",
        "s",
        "1S",
        "1 s",
        "1s ",
        "1d",
        "1sec",
        "1e9ns",
        "1_0s",
        "１s",  # full-width digit
        "1\ud800s",  # lone surrogate: not UTF-8 at all
        "9223372036854775808ns",
        "2562047h47m16.854775808s",
        "-9223372036854775809ns",
        "1" * 5000 + "s",  # long enough to trip int()'s digit guard if it were used blindly
    ],
)
def test_invalid(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


def test_message_names_the_text_and_the_units() -> None:
    with pytest.raises(ValueError, match=r'invalid duration "1d": unknown unit "d" \(use one of ns, us'):
        parse_go_duration("1d")
