"""`make test` runs the suite with `--dist loadgroup`: the tests of one `xdist_group` (a module's servers and
Chromium, the heavy PostgreSQL modules) run on one worker. Under pytest 9.2 pytest-xdist's grouping was
silently lost and every group split over the workers; tests/conftest.py keeps it (docs/PERFORMANCE.md, "The
suite's time")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = Path(__file__).with_name("xdist_group_sample.py")


def test_a_groups_tests_run_on_one_worker_under_loadgroup() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this run's worker
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"]
    done = subprocess.run(
        [*command, "-v", str(SAMPLE.relative_to(ROOT))], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"^\[(gw\d+)\] .*PASSED (\S+)", done.stdout, re.MULTILINE)
    assert len(ran) == 6, done.stdout
    assert {worker for worker, _ in ran} == {ran[0][0]}, f"the group split over the workers:\n{done.stdout}"
    assert all(test.endswith("@sample") for _, test in ran), done.stdout
