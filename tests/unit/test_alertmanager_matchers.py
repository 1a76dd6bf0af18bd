"""The matchers an alertmanager check stores: what Alertmanager's API v2 `filter` parses, refused at
create and update with the field and the value named (tests/integration/test_alertmanager_matchers.py asks a
real Alertmanager the same)."""

from __future__ import annotations

import pytest

from rackflow.checks.service import check_settings
from rackflow.domain.checks import AlertmanagerSettings
from rackflow.errors import InvalidArgument
from rackflow.validation import alertmanager_matcher

ACCEPTED = [
    'rack="rack-01"',
    'rack!="rack-01"',
    'severity=~"critical|warning"',
    'alertname!~"Rackflow.*"',
    'rack=""',
    "rack=rack-01",  # unquoted, as Alertmanager also takes it
    '  rack = "rack-01"  ',
    'summary="a \\"quoted\\" word"',
    'rack=~"r{2}"',  # a regex's own braces
    'job:instance="x"',
    # Regexes RE2 and Python both take, some with what looks like Python's own constructs.
    'severity=~"(?i)critical"',
    'rack=~"r.*?1"',
    'rack=~"[\\]+(?=]+"',
    'rack=~"x}+"',
    'rack=~"(?P<n>r)\\\\d+"',  # a matcher's \\\\ is the regex's \\
]
REFUSED = [
    ("bad", "not an Alertmanager matcher"),
    ("severity", "not an Alertmanager matcher"),
    ('"rack"="r1"', "not an Alertmanager matcher"),
    ('rack-name="r1"', "not an Alertmanager matcher"),
    ('1rack="r1"', "not an Alertmanager matcher"),
    ('rack=="r1"', "quote"),
    ('rack="r1', "closing quote"),
    ('rack="r"1"', "quote"),
    ('rack=r"1', "quote"),
    ('{rack="r1"}', "not an Alertmanager matcher"),
    ('rack=~"(r1"', "regex does not compile"),
    ('rack!~"*"', "regex does not compile"),
    ('alertname=~"(?!Rackflow).*"', "a lookahead, which Alertmanager's regexes (Go RE2) do not have"),
    ('rack=~"(?<=r)1"', "a lookbehind"),
    ('rack=~"(r)\\\\1"', "a backreference"),
    ('rack=~"(?P<n>r)(?P=n)"', "a backreference"),
    ('rack=~"(?>r)"', "an atomic group"),
    ('rack=~"r++"', "a possessive quantifier"),
    ('rack=~"r{2}+1"', "a possessive quantifier"),
    ('rack=~"r{2}+"', "a possessive quantifier"),
]


@pytest.mark.parametrize("matcher", ACCEPTED)
def test_matchers_alertmanager_parses_are_accepted(matcher: str) -> None:
    assert alertmanager_matcher(matcher, "m") == matcher


@pytest.mark.parametrize(("matcher", "why"), REFUSED)
def test_other_matchers_are_refused_naming_the_field_and_the_value(matcher: str, why: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        alertmanager_matcher(matcher, "check.alertmanager.matchers[0]")
    assert str(info.value).startswith(f"check.alertmanager.matchers[0]: {matcher!r}"), info.value
    assert why in str(info.value)


def test_placeholders_are_filled_in_before_the_matcher_is_parsed() -> None:
    """`{rack.name}` stands for a value: fine in a value, a regex; not where a label name goes."""
    good = (
        'rack="{rack.name}"',
        'rack=~"{rack.name}|{rack.domain}"',
        'id="{rack.id}"',
        "sn={rack.external_id}",
    )
    assert check_settings(AlertmanagerSettings("http://am:9093", good, True)) is not None
    with pytest.raises(InvalidArgument) as info:
        check_settings(AlertmanagerSettings("http://am:9093", ('rack="r1"', '{rack.name}="x"'), True))
    assert str(info.value).startswith("check.alertmanager.matchers[1]: '{rack.name}=\"x\"'"), info.value
