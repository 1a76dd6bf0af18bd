"""The chaos soak's short variant (bench/soak.py; the 10-minute runs are in docs/RELIABILITY.md): three
real instances on PostgreSQL through the fault proxy, 60 schedules (a tenth of them rollouts), a minute
of seeded faults (no PostgreSQL restart: the server is shared with other test sessions), with pre-flight
checks in the mix (a flapping drain hook, a restarted Alertmanager) and approvals, retries and start
deadlines (bench/soak_safety.py). It exits non-zero when the checker finds a broken promise, and prints its
table either way."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import postgres_admin_url

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def test_a_minute_of_faults_breaks_no_promise(postgres_url: str) -> None:
    args = ["--minutes", "1", "--schedules", "60", "--racks", "30", "--pg-restarts", "0", "--seed", "7"]
    done = subprocess.run(
        [sys.executable, str(SOAK), *args, "--pg-admin", postgres_admin_url()],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "soak: every promise held" in done.stdout
    assert "| kill |" in done.stdout or "| stop |" in done.stdout or "| drop |" in done.stdout
    rollouts = re.search(r"^\| rollout runs by state \| (\{.*\}) \|", done.stdout, re.MULTILINE)
    assert rollouts is not None and rollouts.group(1) != "{}", "no rollout fired in the soak"
    # bench/soak_notify.py: a receiver that fails and delays got every notification event, none lost.
    assert "| notification events that never reached the receiver (lost) | 0 | ok" in done.stdout
    assert "| checked racks' tasks started on a round that did not pass before them | 0 | ok |" in done.stdout
    # bench/soak_safety.py: approvals, retries and start deadlines were in the mix, not only checked.
    exercised = re.search(
        r"^\| safe operations exercised: ([^|]*) \| ([^|]*) \| ok", done.stdout, re.MULTILINE
    )
    assert exercised is not None, "no safe-operations row"
    counts = dict(zip(exercised.group(1).split(", "), map(int, exercised.group(2).split(", ")), strict=True))
    assert counts["approved runs"] and counts["missed runs"] and counts["retried tasks"], counts
