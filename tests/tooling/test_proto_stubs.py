"""The committed gRPC stubs are exactly what scripts/gen_proto.sh makes from proto/ today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("flow_pb2.py", "flow_pb2.pyi", "flow_pb2_grpc.py", "flow_pb2_grpc.pyi")


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"},
        capture_output=True,
    )
    for name in GENERATED:
        fresh = (tmp_path / "rackflow" / "v1" / name).read_text()
        committed = (ROOT / "src" / "rackflow" / "v1" / name).read_text()
        assert fresh == committed, f"src/rackflow/v1/{name} is stale: run `make proto` and commit the result"
