"""What a PostgreSQL database read, wrote and waited on while a block ran (`bench/scale.py --io`).

`io_watch(url, label)` snapshots the statistics views before and after the block and samples
`pg_stat_activity` meanwhile, then prints:

* the relations (heap or index) by blocks read from outside `shared_buffers` (`pg_statio_user_tables`,
  `pg_statio_user_indexes`: a read is a miss of PostgreSQL's cache, served by the page cache or the disk),
  and per table the scans, rows written and dead rows (`pg_stat_user_tables`);
* the cluster's checkpoints, backend writes, WAL records, full-page images and bytes (`pg_stat_bgwriter`,
  `pg_stat_wal`: other databases' work meanwhile counts too), the database's block reads and their time
  (`pg_stat_database`; the time only where `track_io_timing` is on, which `track_io_timing(url)` sets on
  one database), the kernel's stall figures (`/proc/pressure`) and the pages it read from the disk
  (`/proc/vmstat` `pgpgin`);
* from the samples (every `SAMPLE_SECONDS`), the share of the block's time each wait event and each
  statement was seen active in a backend of the database, and whether the checkpointer was
  checkpointing;
* where the server preloads `pg_stat_statements` (`shared_preload_libraries`; the extension is created in
  the database if missing), each statement's calls, time, buffers hit and read, and WAL per firing, the
  most buffers first: which statement makes the heap and index hits the relations show;
* where the server has `pg_walinspect` (PostgreSQL 15's contrib; created in the database if missing), the
  block's WAL by relation of this database: records, bytes and full-page images (`WAL_BY_RELATION`), the
  most bytes first: which heap or index a firing's WAL, and its full-page images after a checkpoint, go to.

Backends report their counters when a transaction ends or they exit, so take the after-snapshot once the
measured server has stopped (`drain` in `bench/scale.py` does).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from _common import result, sync_engine
from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

SAMPLE_SECONDS = 0.05
TOP = 12
RELATIONS = text(
    "SELECT s.relname, s.heap_blks_read, s.heap_blks_hit, coalesce(s.toast_blks_read, 0) AS toast_read, "
    "t.seq_scan, coalesce(t.idx_scan, 0) AS idx_scan, t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, "
    "t.n_tup_del, t.n_dead_tup FROM pg_statio_user_tables s JOIN pg_stat_user_tables t USING (relid)"
)
INDEXES = text("SELECT indexrelname, idx_blks_read, idx_blks_hit FROM pg_statio_user_indexes")
CLUSTER = text(
    "SELECT b.checkpoints_timed, b.checkpoints_req, b.buffers_checkpoint, b.buffers_clean, "
    "b.buffers_backend, b.buffers_backend_fsync, w.wal_records, w.wal_fpi, w.wal_bytes::bigint AS wal_bytes, "
    "w.wal_buffers_full, d.blks_read, d.blks_hit, d.blk_read_time::bigint AS blk_read_ms, d.xact_commit "
    "FROM pg_stat_bgwriter b, pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()"
)
# The database's active backends, and the checkpointer (its wait event is CheckpointerMain when idle,
# CheckpointWriteDelay while a spread checkpoint writes, other I/O events while it syncs).
ACTIVE = text(
    "SELECT CASE WHEN backend_type = 'checkpointer' THEN 'checkpointer ' || wait_event "
    "ELSE coalesce(wait_event_type || ':' || wait_event, 'CPU') END AS wait, "
    "CASE WHEN backend_type = 'checkpointer' THEN NULL ELSE query END AS query FROM pg_stat_activity "
    "WHERE (datname = current_database() AND pid <> pg_backend_pid() AND state = 'active') "
    "OR (backend_type = 'checkpointer' AND wait_event <> 'CheckpointerMain')"
)
# Each statement's counters in this database (pg_stat_statements, PostgreSQL 15's columns).
STATEMENTS = text(
    "SELECT queryid, query, calls, total_exec_time, shared_blks_hit, shared_blks_read, wal_bytes::bigint "
    "AS wal_bytes FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid "
    "WHERE d.datname = current_database()"
)
# The WAL written between two positions, by relation of this database and kind of record: a record counts
# for the relation of its first block, and so do all its full-page images ("FPW" blocks, counted). A
# relation is found by its file node (`pg_filenode_relation`), so one dropped or rewritten since is shown
# by number. Records of no relation (commits) are not in it.
WAL_BY_RELATION = text(
    "WITH records AS (SELECT resource_manager || ':' || record_type AS kind, record_length, fpi_length, "
    "(SELECT count(*) FROM regexp_matches(block_ref, 'FPW', 'g')) AS images, "
    "regexp_match(block_ref, 'rel \\d+/(\\d+)/(\\d+)') AS rel "
    "FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn))) "
    "SELECT coalesce(pg_filenode_relation(0, rel[2]::oid)::regclass::text, rel[2]) AS relation, kind, "
    "count(*) AS records, sum(record_length)::bigint AS bytes, sum(images)::bigint AS images, "
    "sum(fpi_length)::bigint AS image_bytes FROM records "
    "WHERE rel[1]::oid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "GROUP BY 1, 2"
)
# A statement's text without its parameters' count: `IN ($1, $2, …)` and VALUES lists vary with a batch.
PARAMETERS = re.compile(r"\$\d+(\s*(,|\)\s*,\s*\()\s*\$\d+)*")


@dataclass
class Snapshot:
    """Every counter at one moment: per relation (a table's heap, or an index), per table, the cluster."""

    reads: dict[str, tuple[int, int]]  # relation -> (blocks read, blocks hit)
    tables: dict[str, dict[str, int]]
    cluster: dict[str, int]
    kernel: dict[str, int]
    statements: dict[int, tuple[str, tuple[float, ...]]] | None  # queryid -> (text, counters), if preloaded
    wal_position: str | None  # pg_current_wal_flush_lsn(), where pg_walinspect is available
    at: float = field(default_factory=time.monotonic)


def kernel_counters() -> dict[str, int]:
    """Microseconds some or all tasks stalled on I/O or waited for a CPU, and KiB read from and written to
    block devices, since boot; and the KiB of the page cache waiting to be written now."""
    counters: dict[str, int] = {}
    for resource in ("io", "cpu"):
        for line in Path(f"/proc/pressure/{resource}").read_text().splitlines():
            kind, *fields = line.split()
            counters[f"{resource}_{kind}_us"] = int(fields[-1].removeprefix("total="))
    vmstat = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    counters["pgpgin_kib"] = int(vmstat["pgpgin"])
    counters["pgpgout_kib"] = int(vmstat["pgpgout"])
    meminfo = {line.split(":")[0]: line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()}
    counters["dirty_kib"] = int(meminfo["Dirty"]) + int(meminfo["Writeback"])
    return counters


def snapshot(conn: Connection) -> Snapshot:
    conn.commit()  # the statistics views are read once a transaction: start a new one
    reads: dict[str, tuple[int, int]] = {}
    tables: dict[str, dict[str, int]] = {}
    for row in conn.execute(RELATIONS).mappings():
        name = row["relname"]
        reads[f"{name} (heap)"] = (row["heap_blks_read"] + row["toast_read"], row["heap_blks_hit"])
        tables[name] = {key: int(value) for key, value in row.items() if key not in ("relname",)}
    for index in conn.execute(INDEXES):
        reads[index.indexrelname] = (index.idx_blks_read, index.idx_blks_hit)
    cluster = {key: int(value or 0) for key, value in conn.execute(CLUSTER).mappings().one().items()}
    return Snapshot(reads, tables, cluster, kernel_counters(), statement_counters(conn), wal_position(conn))


def wal_position(conn: Connection) -> str | None:
    """The cluster's WAL flushed so far, or None where the server has no pg_walinspect to read the WAL with
    (it reads only flushed WAL: the position of the WAL inserted is refused as "future")."""
    available = "SELECT 1 FROM pg_available_extensions WHERE name = 'pg_walinspect'"
    if conn.execute(text(available)).first() is None:
        return None
    conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
    position = str(conn.execute(text("SELECT pg_current_wal_flush_lsn()")).scalar_one())
    conn.commit()
    return position


def statement_counters(conn: Connection) -> dict[int, tuple[str, tuple[float, ...]]] | None:
    """Every statement's counters in this database, or None where the server does not preload
    pg_stat_statements."""
    preloaded = conn.execute(text("SELECT current_setting('shared_preload_libraries')")).scalar_one()
    if "pg_stat_statements" not in preloaded:
        return None
    conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
    conn.commit()
    return {
        row.queryid: (row.query, tuple(float(value) for value in row[2:])) for row in conn.execute(STATEMENTS)
    }


class ActivitySampler(threading.Thread):
    """Counts, every SAMPLE_SECONDS, the wait event (or CPU) and the statement of each active backend of
    the database, and the checkpointer's wait while it checkpoints."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self._engine = sync_engine(url)
        self._stop_event = threading.Event()
        self.samples = 0
        self.started = time.monotonic()
        self.stopped = self.started
        self.waits: Counter[str] = Counter()
        self.statements: Counter[str] = Counter()

    def run(self) -> None:
        with self._engine.connect() as conn:
            while not self._stop_event.wait(SAMPLE_SECONDS):
                rows = conn.execute(ACTIVE).all()
                conn.commit()
                self.samples += 1
                for wait, query in rows:
                    self.waits[wait] += 1
                    if query is not None:
                        self.statements[PARAMETERS.sub("$n", " ".join(query.split()))[:110]] += 1

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.stopped = time.monotonic()
        self._engine.dispose()

    def seconds(self, count: int) -> float:
        """The time `count` samples stand for: a backend seen in them was active that long."""
        return count * (self.stopped - self.started) / max(self.samples, 1)


def track_io_timing(url: str) -> None:
    """Time every block read of the database's new sessions (`blk_read_time`; a clock read per block)."""
    engine = sync_engine(url)
    name = make_url(url).database
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" SET track_io_timing = on'))
    engine.dispose()


@contextmanager
def io_watch(url: str, label: str, firings: int) -> Iterator[None]:
    """Print what the database `url` read, wrote and waited on while the block ran (module docstring);
    `firings`: what the block did, for the per-firing figures."""
    engine = sync_engine(url)
    with engine.connect() as conn:
        before = snapshot(conn)
        sampler = ActivitySampler(url)
        sampler.start()
        try:
            yield
        finally:
            sampler.stop()
            time.sleep(1.0)  # the stopped server's backends report their counters as they exit
            after = snapshot(conn)
        if before.wal_position is not None and after.wal_position is not None:
            report_wal(conn, label, firings, before.wal_position, after.wal_position)
    engine.dispose()
    report(label, firings, before, after, sampler)


def report(label: str, firings: int, before: Snapshot, after: Snapshot, sampler: ActivitySampler) -> None:
    seconds = after.at - before.at
    delta = {
        name: (read - before.reads.get(name, (0, 0))[0], hit - before.reads.get(name, (0, 0))[1])
        for name, (read, hit) in after.reads.items()
    }
    read_total = sum(read for read, _ in delta.values())
    hit_total = sum(hit for _, hit in delta.values())
    print(f"# io {label}: {seconds:.1f} s; blocks read from outside shared_buffers, by relation:", flush=True)
    for name, (read, hit) in sorted(delta.items(), key=lambda item: -item[1][0])[:TOP]:
        print(f"#   {name:<48} read={read:>8} hit={hit:>9} read/firing={read / firings:.2f}")
    print(f"#   {'all relations':<48} read={read_total:>8} hit={hit_total:>9}")
    print(f"# io {label}: per table: scans seq/idx, rows inserted/updated (HOT)/deleted, dead rows after")
    for name, counts in sorted(after.tables.items()):
        was = before.tables.get(name, dict.fromkeys(counts, 0))
        moved = {key: counts[key] - was[key] for key in counts}
        if any(moved[key] for key in ("seq_scan", "idx_scan", "n_tup_ins", "n_tup_upd", "n_tup_del")):
            print(
                f"#   {name:<32} seq={moved['seq_scan']} idx={moved['idx_scan']} ins={moved['n_tup_ins']} "
                f"upd={moved['n_tup_upd']} ({moved['n_tup_hot_upd']}) del={moved['n_tup_del']} "
                f"dead={counts['n_dead_tup']}"
            )
    if before.statements is not None and after.statements is not None:
        report_statements(label, firings, before.statements, after.statements)
    cluster = {key: after.cluster[key] - before.cluster[key] for key in after.cluster}
    kernel = {key: after.kernel[key] - before.kernel[key] for key in after.kernel}
    print(f"# io {label}: {sampler.samples} samples of pg_stat_activity; seconds active, by wait:")
    for wait, count in sampler.waits.most_common(TOP):
        print(f"#   {wait:<40} {sampler.seconds(count):7.2f} s")
    print(f"# io {label}: seconds active, by statement:")
    for statement, count in sampler.statements.most_common(TOP):
        print(f"#   {sampler.seconds(count):7.2f} s {statement}")
    result(
        "scale_drain_io",
        db=label,
        seconds=seconds,
        blks_read=read_total,
        blks_read_per_firing=read_total / firings,
        blks_hit_per_firing=hit_total / firings,
        blk_read_ms=cluster["blk_read_ms"],
        disk_read_mib=kernel["pgpgin_kib"] / 1024,
        disk_written_mib=kernel["pgpgout_kib"] / 1024,
        dirty_mib_before=before.kernel["dirty_kib"] / 1024,
        checkpoints=f"{cluster['checkpoints_timed']}+{cluster['checkpoints_req']}req",
        buffers_checkpoint=cluster["buffers_checkpoint"],
        buffers_backend=cluster["buffers_backend"],
        wal_mib=cluster["wal_bytes"] / 2**20,
        wal_fpi=cluster["wal_fpi"],
        wal_kib_per_firing=cluster["wal_bytes"] / 1024 / firings,
        io_some_pct=kernel["io_some_us"] / seconds / 1e4,
        io_full_pct=kernel["io_full_us"] / seconds / 1e4,
        cpu_some_pct=kernel["cpu_some_us"] / seconds / 1e4,
        commits=cluster["xact_commit"],
    )


def report_statements(
    label: str,
    firings: int,
    before: dict[int, tuple[str, tuple[float, ...]]],
    after: dict[int, tuple[str, tuple[float, ...]]],
) -> None:
    """The statements of the block by buffers (hit + read), with their calls, and time, hits, reads and WAL
    per firing (pg_stat_statements; statements that differ only in their parameters' count are one here)."""
    moved: dict[str, list[float]] = {}
    for queryid, (query, counters) in after.items():
        was = before.get(queryid, (query, (0.0,) * len(counters)))[1]
        delta = [now - then for now, then in zip(counters, was, strict=True)]
        if delta[0] > 0:
            key = PARAMETERS.sub("$n", " ".join(query.split()))[:110]
            total = moved.setdefault(key, [0.0] * len(delta))
            for i, value in enumerate(delta):
                total[i] += value
    print(
        f"# io {label}: statements by buffers (pg_stat_statements); calls; per firing: ms, hit, read, WAL B"
    )
    for query, (calls, ms, hit, read, wal) in sorted(
        moved.items(), key=lambda item: -(item[1][2] + item[1][3])
    )[:TOP]:
        print(
            f"#   {calls:6.0f} {ms / firings:7.3f} {hit / firings:7.1f} {read / firings:6.2f} "
            f"{wal / firings:8.0f}  {query}"
        )


def report_wal(conn: Connection, label: str, firings: int, start: str, end: str) -> None:
    """The WAL between `start` and `end` by relation of this database (`WAL_BY_RELATION`), per firing, the
    most bytes first, each with its kinds of record and how many of each a firing wrote."""
    rows = conn.execute(WAL_BY_RELATION, {"start": start, "end": end}).all()
    conn.commit()
    relations: dict[str, list[float]] = {}
    kinds: dict[str, Counter[str]] = {}
    for row in rows:
        total = relations.setdefault(row.relation, [0.0, 0.0, 0.0, 0.0])
        for i, value in enumerate((row.records, row.bytes, row.images, row.image_bytes)):
            total[i] += value / firings
        kinds.setdefault(row.relation, Counter())[row.kind] += row.records
    print(
        f"# io {label}: WAL by relation (pg_walinspect); per firing: records, bytes, full-page images, "
        "their bytes; records by kind"
    )
    for relation, (records, size, images, image_bytes) in sorted(relations.items(), key=lambda r: -r[1][1])[
        :TOP
    ]:
        by_kind = " ".join(f"{kind}={count / firings:.2f}" for kind, count in kinds[relation].most_common(4))
        print(f"#   {relation:<44} {records:6.2f} {size:7.0f} {images:5.2f} {image_bytes:7.0f}  {by_kind}")
    totals = [sum(values[i] for values in relations.values()) for i in range(4)]
    print(f"#   {'all relations':<44} {totals[0]:6.2f} {totals[1]:7.0f} {totals[2]:5.2f} {totals[3]:7.0f}")
