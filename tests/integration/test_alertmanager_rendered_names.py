"""A rack whose name holds `"`, `\\` or a regex metacharacter is asked about exactly, by a REAL Alertmanager
(Debian's `prometheus-alertmanager`): its matchers' filled-in values are escaped as Alertmanager parses
them (docs/CHECKS.md). Unescaped, `rack="{rack.name}"` for `r"1` was refused with 400 (a fail-open check
then let the rack through) and `rack=~"{rack.name}"` for `rack.1` matched the alerts of `rackX1` too.

Without the binary these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rackflow.checks.kinds import Answers, Asked, alertmanager
from rackflow.domain.checks import AlertmanagerSettings, Look, RackFacts
from tests.integration.alertmanager import QUIET_CONFIG, running_alertmanager

NAMES = ['r"1', "r\\1", 'r\\"1', "rack.1", "rack-(1)", "a|b", "x*"]
# What the names above must not match: what each would match read as a regex or unescaped.
OTHERS = ["r1", "rX1", "r\\\\1", "rackX1", "rack-1", "a", "b", "xxx", ""]
MATCHERS = ['rack="{rack.name}"', 'rack=~"{rack.name}"', "rack={rack.name}", 'rack=~"{rack.name}|none"']


def _look(url: str, matcher: str, name: str) -> Look:
    rack = RackFacts(uuid.uuid4(), name, "SN-1", uuid.uuid4(), "nvl-a")
    settings = AlertmanagerSettings(url, (matcher,), False)  # fail-open: a refused ask lets the rack through
    with ThreadPoolExecutor(1) as pool:
        return asyncio.run(alertmanager(settings, rack, Answers(Asked(pool))))


def test_each_rack_is_held_by_its_own_alert_only(tmp_path: Path) -> None:
    with running_alertmanager(tmp_path, QUIET_CONFIG) as am:
        for name in NAMES + OTHERS:
            if name:
                am.post({"alertname": "RackOverheat", "rack": name})
        assert len(am.active()) == len(NAMES) + len(OTHERS) - 1
        looks = {(m, name): _look(am.url, m, name) for m in MATCHERS for name in NAMES}
    wrong = {
        (matcher, name): look.reason
        for (matcher, name), look in looks.items()
        if look.passed or look.reason != f"alertmanager: alert RackOverheat{{rack={json.dumps(name)}}} firing"
    }
    assert not wrong, wrong
