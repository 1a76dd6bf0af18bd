"""Debian's Prometheus tools for the notification and alert-rule tests (`make tools` installs them):
missing, a test skips locally and FAILS under CI=true, as the browser and PostgreSQL tests do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROMTOOL = Path(os.environ.get("RACKFLOW_TEST_PROMTOOL", "/usr/bin/promtool"))
ALERTMANAGER = Path(os.environ.get("RACKFLOW_TEST_ALERTMANAGER", "/usr/bin/prometheus-alertmanager"))
AMTOOL = Path(os.environ.get("RACKFLOW_TEST_AMTOOL", "/usr/bin/amtool"))


def require(tool: Path, package: str) -> Path:
    """`tool`, or skip (fail under CI) saying which Debian package and make target provide it."""
    if tool.is_file() and os.access(tool, os.X_OK):
        return tool
    reason = f"{tool} is missing: `make tools` installs Debian's {package}"
    if os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
