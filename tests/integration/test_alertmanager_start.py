"""The Alertmanager the integration tests start gets going even when the port it was first given is taken
by then (another test's process took it), as happened in a suite run to a server given a free port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.e2e.cluster import free_port
from tests.integration import alertmanager as starter


def test_a_taken_port_is_left_for_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        offered = iter([taken_port])
        monkeypatch.setattr(starter, "free_port", lambda: next(offered, None) or free_port())
        with starter.running_alertmanager(tmp_path, starter.QUIET_CONFIG) as started:
            assert started.url != f"http://127.0.0.1:{taken_port}"
            assert started.active() == []
    # The first try met the taken port; the second serves.
    assert "address already in use" in (tmp_path / "alertmanager.log").read_text()
