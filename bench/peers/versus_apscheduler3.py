"""versus_apscheduler3: rackflow's default drain against APScheduler 3's, alternating, in one run.

Both drain N one-shot jobs due at once on the same PostgreSQL server, each making one row: rackflow's
`bench/dispatch_drain.py` measurement at its defaults (`--dispatch-batch 10`, executor running), and
`apscheduler3_drain.py` (APScheduler 3, SQLAlchemyJobStore, its default 10 worker threads). The peer runs
in its own virtual environment, `bench/peers/.venv-apscheduler3`, made (from PyPI) on first use. Each
round runs both, one after the other, on fresh databases, and prints the ratio; the load average is
printed before and after every measurement, as the machine may be shared.

    python bench/peers/versus_apscheduler3.py --n 10000 --rounds 3
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for _common and dispatch_drain

from _common import code_line, machine_line, result
from dispatch_drain import measure_drain
from sqlalchemy.engine import make_url

from tests.e2e.cluster import fresh_postgres_database

HERE = Path(__file__).resolve().parent
PEER_VENV = HERE / ".venv-apscheduler3"
PEER_REQUIREMENTS = ["apscheduler>=3.11,<4", "sqlalchemy>=2", "psycopg[binary]>=3.1"]
DEFAULT_BATCH = 10
TARGET_RATIO = 4.0  # issue 29: at least four times the peer's drain, at defaults, in the same run


def peer_python() -> Path:
    """The peer venv's interpreter, creating the venv and installing APScheduler 3 the first time."""
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        venv.create(PEER_VENV, with_pip=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS], check=True)
    return python


def run_peer(python: Path, pg_admin: str, n: int) -> float:
    with fresh_postgres_database(pg_admin) as url:
        peer_url = make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
        out = subprocess.run(
            [str(python), str(HERE / "apscheduler3_drain.py"), "--url", peer_url, "--n", str(n)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    print(out.strip(), flush=True)
    match = re.search(r"jobs_per_s=([0-9.]+)", out)
    if match is None:
        raise RuntimeError(f"no figure in the peer's output:\n{out}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    python = peer_python()
    version = subprocess.run(
        [str(python), "-c", "import apscheduler; print(apscheduler.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(code_line())
    print(f"# versus_apscheduler3 n={args.n} rounds={args.rounds} apscheduler={version}", flush=True)
    ratios: list[float] = []
    for round_no in range(1, args.rounds + 1):
        print(machine_line(), flush=True)
        peer = run_peer(python, args.pg_admin, args.n)
        print(machine_line(), flush=True)
        drain = measure_drain("postgres", args.pg_admin, n=args.n, instances=1, batch=DEFAULT_BATCH)
        print(machine_line(), flush=True)
        ratios.append(drain.firings_per_s / peer)
        result(
            "versus_apscheduler3",
            round=round_no,
            n=args.n,
            rackflow_per_s=drain.firings_per_s,
            apscheduler3_per_s=peer,
            ratio=ratios[-1],
            server_cpu_us_per_firing=drain.server_cpu_us_per_firing,
            postgres_cpu_us_per_firing=drain.postgres_cpu_us_per_firing,
        )
    # Each side's rate moves with the machine from one round to the next, so one round proves little.
    result(
        "versus_apscheduler3_rounds",
        rounds=len(ratios),
        median_ratio=statistics.median(ratios),
        min_ratio=min(ratios),
        max_ratio=max(ratios),
        rounds_at_target=sum(ratio >= TARGET_RATIO for ratio in ratios),
    )


if __name__ == "__main__":
    main()
