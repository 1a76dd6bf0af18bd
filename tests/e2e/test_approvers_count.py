"""An approval policy that asks for more approvers than the server's tokens let approve, on a real
`rackflow serve` with a tokens file: refused at create and update, by the CLI's words; and a schedule a
token file's change left unapprovable is named at start-up. Runs on SQLite and on PostgreSQL (the start-up
look is a query of its own)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rackflow.security import hash_token
from tests.e2e.cluster import ServerProcess, run_cli, start_server

pytestmark = [pytest.mark.slow]

ONCALL, LEAD, SECOND = "oncall-secret-1a", "lead-secret-2b", "second-secret-3c"


def tokens_file(path: Path, *approvers: tuple[str, str]) -> Path:
    """oncall (operator) and the approvers given as (name, token)."""
    entries = [("oncall", "operator", ONCALL), *((name, "approver", token) for name, token in approvers)]
    path.write_text(
        "".join(
            f"- {{name: {name}, role: {role}, sha256: {hash_token(token)}}}\n"
            for name, role, token in entries
        )
    )
    return path


def rackflow(
    server: ServerProcess, token: str, *args: str, expect: int = 0
) -> subprocess.CompletedProcess[str]:
    result = run_cli(server.address, "--token", token, *args)
    assert result.returncode == expect, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def create(server: ServerProcess, token: str, name: str, approvers: int, expect: int = 0) -> str:
    return rackflow(
        server, token, "schedule", "create", name, "--interval", "24h", "--op", "power-on", "--rack", "ap-a",
        "--approval-timeout", "4h", "--min-approvers", str(approvers), expect=expect,
    ).stderr  # fmt: skip


def test_more_approvers_than_the_tokens_allow_is_refused_and_named_at_start_up(
    served_db_url: str, tmp_path: Path
) -> None:
    both = tokens_file(tmp_path / "both.yaml", ("lead", LEAD), ("second", SECOND))
    server = start_server(served_db_url, tmp_path, args=["--auth-tokens", str(both)])
    try:
        rackflow(server, ONCALL, "rack", "create", "ap-a", "--component", "COMPUTE:ap-a-c0")
        refused = create(server, ONCALL, "fw-three", 3, expect=1)
        assert "FAILED_PRECONDITION" in refused and "schedule.approval.min_approvers: 3" in refused
        assert "only 2 principals may approve" in refused and "lead, second" in refused
        # lead would be its last editor, whom the two-person rule keeps from approving: second alone is left.
        refused = create(server, LEAD, "fw-by-lead", 2, expect=1)
        assert "only 1 principal may approve" in refused and "'lead' last edited it" in refused
        create(server, ONCALL, "fw-two", 2)
        refused = rackflow(
            server, LEAD, "schedule", "update", "fw-two", "--overlap", "queue", expect=1
        ).stderr
        assert "FAILED_PRECONDITION" in refused and "schedule.approval.min_approvers: 2" in refused
        rackflow(server, ONCALL, "schedule", "update", "fw-two", "--overlap", "queue")
    finally:
        assert server.stop() == 0, server.output

    lead_only = tokens_file(tmp_path / "lead.yaml", ("lead", LEAD))
    restarted = start_server(served_db_url, tmp_path, args=["--auth-tokens", str(lead_only)])
    try:
        warnings = [line for line in restarted.output.splitlines() if "fw-two" in line]
        assert len(warnings) == 1 and "WARNING" in warnings[0], restarted.output
        assert "needs 2 approvers" in warnings[0] and "only 1 principal may approve" in warnings[0]
    finally:
        assert restarted.stop() == 0, restarted.output
