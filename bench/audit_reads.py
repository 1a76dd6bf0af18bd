"""audit_reads: what the audit trail's partitions cost its page (migration 0028).

EXPLAIN ANALYZE, in one warm session, of the statements the audit page sends (`store.audit.list_events`:
the first page newest first, unfiltered and by principal, and the capped count by principal) on
`--database`: the median planning and execution time of `--repeat` runs after two, and how many partitions
the trail has. Each line ends with the load average.

    python bench/audit_reads.py --database rackflow_scale
"""

from __future__ import annotations

import argparse
import os
import statistics

import psycopg
from sqlalchemy.engine import make_url

STATEMENTS = (
    "SELECT * FROM audit_events ORDER BY at DESC, id DESC LIMIT 50",
    "SELECT * FROM audit_events WHERE principal = 'user-7' ORDER BY at DESC, id DESC LIMIT 50",
    "SELECT count(*) FROM (SELECT 1 FROM audit_events WHERE principal = 'user-7' LIMIT 10001) found",
)


def main(url: str, repeat: int) -> None:
    with psycopg.connect(url) as conn:
        query = "SELECT count(*) FROM pg_class WHERE relispartition AND relkind = 'r'"
        partitions = conn.execute(query).fetchone()
        for statement in STATEMENTS:
            runs = []
            for _ in range(repeat + 2):
                row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement).fetchone()
                assert row is not None
                plan = row[0][0]
                runs.append((plan["Planning Time"], plan["Execution Time"]))
            warm = runs[2:]
            print(
                f"audit_reads partitions={partitions[0] if partitions else 0} "
                f"planning_ms={statistics.median(p for p, _ in warm):.2f} "
                f"execution_ms={statistics.median(e for _, e in warm):.2f} "
                f"loadavg={round(os.getloadavg()[0], 2)} statement={statement!r}",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", required=True)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    main(make_url(args.pg_admin).set(database=args.database).render_as_string(False), args.repeat)
