"""What rackflow accepts as an alertmanager check's matcher, a REAL Alertmanager (Debian's
`prometheus-alertmanager`) accepts as a `filter` of `GET /api/v2/alerts`, and what rackflow refuses for its
syntax Alertmanager refuses too (400): a stored matcher Alertmanager refuses made every ask fail.

Without the binary these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from rackflow.checks.kinds import render
from rackflow.checks.service import SAMPLE_RACK
from rackflow.domain.checks import ANY_ALERT
from rackflow.errors import InvalidArgument
from rackflow.validation import alertmanager_matcher
from tests.integration.alertmanager import QUIET_CONFIG, running_alertmanager
from tests.unit.test_alertmanager_matchers import ACCEPTED, REFUSED

TEMPLATED = [
    'rack="{rack.name}"',
    'rack=~"{rack.name}|{rack.domain}"',
    "sn={rack.external_id}",
    '{rack.name}="x"',
]


def _alertmanager_takes(url: str, matcher: str) -> bool:
    query = urllib.parse.urlencode({"active": "true", "filter": matcher})
    try:
        with urllib.request.urlopen(f"{url}/api/v2/alerts?{query}", timeout=10) as answer:
            return bool(answer.status == 200)
    except urllib.error.HTTPError as error:
        assert error.code == 400, (matcher, error.code, error.read())
        return False


def _rackflow_takes(matcher: str) -> bool:
    try:
        alertmanager_matcher(matcher, "m", rendered=render(matcher, SAMPLE_RACK))
    except InvalidArgument:
        return False
    return True


def test_rackflow_and_alertmanager_agree_on_each_matcher(tmp_path: Path) -> None:
    matchers = (
        ACCEPTED + [m for m, _ in REFUSED] + TEMPLATED + [ANY_ALERT]
    )  # what a check of no matcher is told
    with running_alertmanager(tmp_path, QUIET_CONFIG) as alertmanager:
        answers = {
            m: (_rackflow_takes(m), _alertmanager_takes(alertmanager.url, render(m, SAMPLE_RACK)))
            for m in matchers
        }
    disagreements = {m: taken for m, taken in answers.items() if taken[0] != taken[1]}
    assert not disagreements, f"(rackflow, alertmanager) differ: {disagreements}"
    assert all(answers[m] == (True, True) for m in [*ACCEPTED, ANY_ALERT])
    assert all(answers[m] == (False, False) for m, _ in REFUSED)
