"""free_space: which pages of the run table the free space map offers a new run, by how the rows got there.

A new run is inserted small ("running", no outcomes yet) into whichever page the free space map says has
room for it plus the 10 % that `fillfactor = 90` keeps (migration 0033); one that is offered an old page
reads it from the disk and logs it whole. `--layout` makes `--runs` runs of the migrated `task_schedule_run`
(PostgreSQL) one of three ways, then `VACUUM`s and prints, for each tenth of the table from its oldest
pages, how many pages would take a new run:

* `aged`: as rackflow writes them, in batches of `--batch`: each run inserted small, then rewritten with
  its outcome (the write-back), with a `VACUUM` every `--vacuum-every` runs standing in for autovacuum;
* `loaded90`: every run written at its final size at the table's fill factor (90), as `bench/scale_load.py`
  loaded the history until the fourteenth stop's loader change, or as a restore or a rewrite leaves it;
* `loaded100`: the same into full pages, then the fill factor set back to 90, as `bench/scale_load.py` now
  loads it (`pages_filled`).

The runs are partitioned by their slot (migration 0046): the runs written here, all of a past slot, go to
the DEFAULT partition, which the settings, the `VACUUM`s and the free space map read act on (the
partitioned table has no pages of its own); the figures are that partition's, which holds every run.

    python bench/free_space.py --layout aged --runs 200000
"""

from __future__ import annotations

import argparse

from _common import add_db_arguments, code_line, fresh_database, machine_line, slot_run_id, sync_engine
from sqlalchemy import Connection, text

# A run as its write-back leaves it: one scope's outcome, with its task (`outcomes_to_json`'s shape).
OUTCOMES = (
    "jsonb_build_array(jsonb_build_object('scope_id', gen_random_uuid()::text, 'rack_id', "
    "gen_random_uuid()::text, 'outcome', 'submitted', 'task_id', gen_random_uuid()::text, 'error', ''))"
)
COUNTS = """'{"submitted": {"with_task": 1}}'::jsonb"""
INSERT_RUNNING = (
    "INSERT INTO task_schedule_run (id, schedule_id, fired_at, scheduled_for, trigger, state, outcomes) "
    f"SELECT {slot_run_id('(now() - make_interval(secs => i))')}, gen_random_uuid(), now(),"
    " now() - make_interval(secs => i), 'dispatch', 'running', '[]'::jsonb"
    " FROM generate_series(:first, :last - 1) AS i"
)
WRITE_BACK = (
    f"UPDATE task_schedule_run SET state = 'completed', outcomes = {OUTCOMES}, outcome_counts = {COUNTS} "
    "WHERE state = 'running'"
)
INSERT_COMPLETED = INSERT_RUNNING.replace("'running', '[]'::jsonb", f"'completed', {OUTCOMES}")
PAGE = 8192
# The relation the runs written here are in: from migration 0046 on, `task_schedule_run` is partitioned
# (no storage, so no storage options or free space map) and a run of a past slot is in its DEFAULT
# partition; the table itself before.
HEAP = text(
    "SELECT coalesce((SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
    " WHERE i.inhparent = 'task_schedule_run'::regclass AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'),"
    " 'task_schedule_run')"
)
TUPLE_OVERHEAD = 28  # the tuple header (24) and its line pointer (4)


def write_runs(conn: Connection, heap: str, layout: str, runs: int, batch: int, vacuum_every: int) -> None:
    """Write the runs (through `task_schedule_run`, as rackflow does), setting and vacuuming `heap`, the
    relation they are in."""
    # The foreign key to the schedules is not checked: the runs name no schedule, as a restore's data does.
    conn.execute(text("SET session_replication_role = replica"))
    conn.execute(text(f"ALTER TABLE {heap} SET (autovacuum_enabled = false)"))
    if layout == "loaded100":
        conn.execute(text(f"ALTER TABLE {heap} SET (fillfactor = 100)"))
    for first in range(0, runs, batch):
        bounds = {"first": first, "last": min(runs, first + batch)}
        if layout == "aged":
            conn.execute(text(INSERT_RUNNING), bounds)
            conn.execute(text(WRITE_BACK))
            if bounds["last"] % vacuum_every == 0:
                conn.execute(text(f"VACUUM {heap}"))
        else:
            conn.execute(text(INSERT_COMPLETED), bounds)
    conn.execute(text(f"ALTER TABLE {heap} SET (fillfactor = 90)"))
    conn.execute(text(f"VACUUM {heap}"))
    # Every run in `heap`, or its free space map is not the table's.
    held = conn.execute(text("SELECT array_agg(DISTINCT tableoid::regclass::text) FROM task_schedule_run"))
    if held.scalar_one() != [heap]:
        raise RuntimeError(f"the runs are not all in {heap}")


def new_run_needs(conn: Connection) -> int:
    """Bytes a page must have free to be offered a new "running" run: the row, and the fill factor's 10 %."""
    conn.execute(text(INSERT_RUNNING), {"first": 0, "last": 1})
    size = conn.execute(text("SELECT pg_column_size(r.*) FROM task_schedule_run r WHERE state = 'running'"))
    conn.execute(text("DELETE FROM task_schedule_run WHERE state = 'running'"))
    return int(size.scalar_one()) + TUPLE_OVERHEAD + PAGE // 10


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser, kinds=("postgres",))
    parser.add_argument("--layout", choices=("aged", "loaded90", "loaded100"), default="aged")
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100, help="runs a firing batch inserts and writes back")
    parser.add_argument("--vacuum-every", type=int, default=20_000, help="aged: runs between vacuums")
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    with fresh_database("postgres", args.pg_admin) as workspace:
        engine = sync_engine(workspace.url).execution_options(isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_freespacemap"))
            heap = conn.execute(HEAP).scalar_one()
            write_runs(conn, heap, args.layout, args.runs, args.batch, args.vacuum_every)
            needs = new_run_needs(conn)
            tenths = conn.execute(
                text(
                    "SELECT width_bucket(blkno, 0, max(blkno) OVER () + 1, 10), avail "
                    "FROM pg_freespace(CAST(:heap AS regclass))"
                ),
                {"heap": heap},
            ).all()
        engine.dispose()
    print(f"# free_space relation={heap}")
    offered_total = sum(1 for _, avail in tenths if avail >= needs)
    print(
        f"free_space layout={args.layout} runs={args.runs} pages={len(tenths)} needs_bytes={needs} "
        f"offered={offered_total} offered_pct={100 * offered_total / len(tenths):.1f}"
    )
    for tenth in range(1, 11):
        pages = [avail for bucket, avail in tenths if bucket == tenth]
        offered = sum(1 for avail in pages if avail >= needs)
        print(
            f"free_space_tenth layout={args.layout} tenth={tenth} pages={len(pages)} offered={offered} "
            f"avg_free={sum(pages) // max(1, len(pages))}"
        )


if __name__ == "__main__":
    main()
