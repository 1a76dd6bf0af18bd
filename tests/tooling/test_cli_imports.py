"""The CLI is a gRPC client: a command imports neither the server's services nor the database layer, which
took a second of every command's start (docs/PERFORMANCE.md, "The CLI's start")."""

from __future__ import annotations

import subprocess
import sys

SERVER_ONLY = ("sqlalchemy", "psycopg", "aiosqlite", "starlette", "rackflow.store", "rackflow.server")


def test_the_cli_imports_nothing_of_the_server() -> None:
    probe = "import sys, rackflow.cli.main; print('\\n'.join(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    server = [m for m in loaded.split() if any(m == p or m.startswith(p + ".") for p in SERVER_ONLY)]
    assert server == [], f"the CLI imports server modules: {server}"
