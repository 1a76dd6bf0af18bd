"""checks_alertmanager: one round of an Alertmanager pre-flight check over N held tasks, against a REAL
Alertmanager (Debian's `prometheus-alertmanager`) on a loopback port holding M firing alerts.

In process, with no database: the looks a checker's polls make for N held tasks (`--per-rack` tasks on
each of N / per-rack racks; a fleet-wide firmware upgrade has one or a few per rack) with the check of
docs/CHECKS.md (`rack="{rack.name}"`, `severity=~"critical|warning"`, fail closed), and with the rack's
matcher a regex (`rack=~"{rack.name}"`), which rackflow sends per rack. The checker takes at most
PREFLIGHT_BATCH rounds a poll and asks them all at once, in its thread pool of PREFLIGHT_CONCURRENCY; here
the polls follow one another without the poll interval between them, so the figure is the asking alone:
wall seconds for the N looks, the queries Alertmanager was sent (counted in the client, each GET asked
again counted too), the CPU seconds of this process and of Alertmanager, the GETs it refused (`refused`:
Alertmanager refuses GETs past its `--web.get-concurrency` with 503; rackflow asks at most
ALERTMANAGER_CONCURRENCY at once and asks a refused one again within the round, since `kinds.BUSY_RETRY`),
and the looks that got no answer (`unanswered`: a fail-closed check holds the task for that). Of the M
alerts (severity critical), one in four is on a rack of the N, the rest on other racks, so about M / 4
racks are held.

The looks go through `kinds.alertmanager` as the checker calls it; with a tree put first on PYTHONPATH
that predates `kinds.Answers` (one query per look), each look is asked on its own (the `# code` line names
the tree).

    python bench/checks_alertmanager.py --tasks 100 1000 10000 --alerts 1000 --per-rack 1 4
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import code_line, cpu_seconds, machine_line, result

from rackflow import config
from rackflow.checks import kinds
from rackflow.config import PREFLIGHT_BATCH, PREFLIGHT_CONCURRENCY
from rackflow.domain.checks import AlertmanagerSettings, Look, RackFacts
from tests.integration.alertmanager import QUIET_CONFIG, running_alertmanager

# The rack's matcher: docs/CHECKS.md's plain `=`, or the same as a regex (which rackflow sends per rack).
RACK_MATCHERS = {"plain": 'rack="{rack.name}"', "regex": 'rack=~"{rack.name}"'}
SEVERITY = 'severity=~"critical|warning"'
POST_CHUNK = 500


def post_alerts(url: str, count: int, racks: int) -> None:
    """`count` firing alerts: one in four on a rack of the `racks` asked about, the rest elsewhere."""
    alerts = [
        {
            "labels": {
                "alertname": "RackOverheat",
                "rack": f"rack-{i // 4:05d}" if i % 4 == 0 and i // 4 < racks else f"other-{i:05d}",
                "severity": "critical",
            }
        }
        for i in range(count)
    ]
    for start in range(0, count, POST_CHUNK):
        request = urllib.request.Request(
            f"{url}/api/v2/alerts",
            data=json.dumps(alerts[start : start + POST_CHUNK]).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200


def counting_urlopen() -> tuple[Callable[[], int], Callable[[], int]]:
    """Count every `urllib.request.urlopen` from here on (the looks' GETs): how many were sent so far, and
    how many of them Alertmanager refused with 503."""
    sent = [0, 0]
    lock = threading.Lock()
    real = urllib.request.urlopen

    def counted(*args: Any, **kwargs: Any) -> Any:
        with lock:
            sent[0] += 1
        try:
            return real(*args, **kwargs)
        except urllib.error.HTTPError as refused:
            if refused.code == 503:
                with lock:
                    sent[1] += 1
            raise

    urllib.request.urlopen = counted
    return (lambda: sent[0]), (lambda: sent[1])


async def one_round(settings: AlertmanagerSettings, racks: list[RackFacts], per_rack: int) -> list[Look]:
    """The looks of N = len(racks) × per_rack held tasks, a poll (PREFLIGHT_BATCH rounds, one `Answers`)
    after another, each poll's looks at once, as the checker asks them."""
    tasks = [(rack, uuid.uuid4()) for rack in racks for _ in range(per_rack)]
    looks: list[Look] = []
    with ThreadPoolExecutor(PREFLIGHT_CONCURRENCY) as pool:
        asked = kinds.Asked(pool)
        sharing = getattr(kinds, "Answers", None)  # None: a tree from before it (one query a look)
        for start in range(0, len(tasks), PREFLIGHT_BATCH):
            through = sharing(asked) if sharing is not None else None
            looks += await asyncio.gather(
                *(
                    kinds.alertmanager(settings, rack, through or asked, task_id=task_id)
                    for rack, task_id in tasks[start : start + PREFLIGHT_BATCH]
                )
            )
    return looks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--tasks", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--alerts", type=int, default=1_000, help="firing alerts in Alertmanager")
    parser.add_argument("--per-rack", type=int, nargs="+", default=[1, 4], help="held tasks per rack")
    parser.add_argument(
        "--get-concurrency",
        type=int,
        help="Alertmanager's --web.get-concurrency (default: its own, GOMAXPROCS but at least 8)",
    )
    parser.add_argument(
        "--rack-matcher", nargs="+", choices=sorted(RACK_MATCHERS), default=sorted(RACK_MATCHERS)
    )
    args = parser.parse_args()
    print(code_line())
    print(machine_line())
    print(
        f"# alerts={args.alerts} batch={PREFLIGHT_BATCH} concurrency={PREFLIGHT_CONCURRENCY} "
        f"alertmanager_concurrency={getattr(config, 'ALERTMANAGER_CONCURRENCY', None)} "
        f"get_concurrency={args.get_concurrency or 'default'} "
        f"matchers={SEVERITY} and one of {' '.join(RACK_MATCHERS.values())}"
    )
    flags = [f"--web.get-concurrency={args.get_concurrency}"] if args.get_concurrency else []
    sent, refused = counting_urlopen()
    with tempfile.TemporaryDirectory() as home, running_alertmanager(Path(home), QUIET_CONFIG, *flags) as am:
        post_alerts(am.url, args.alerts, max(args.tasks))
        for matcher, per_rack, n in itertools.product(args.rack_matcher, args.per_rack, args.tasks):
            settings = AlertmanagerSettings(am.url, (RACK_MATCHERS[matcher], SEVERITY), True)
            racks = [
                RackFacts(uuid.uuid4(), f"rack-{i:05d}", f"SN-{i}", None, "")
                for i in range(max(1, n // per_rack))
            ]
            before, refused_before = sent(), refused()
            own, theirs = time.process_time(), cpu_seconds(am.process.pid)
            started = time.perf_counter()
            looks = asyncio.run(one_round(settings, racks, per_rack))
            wall = time.perf_counter() - started
            result(
                "alertmanager_round",
                rack_matcher=matcher,
                tasks=len(looks),
                per_rack=per_rack,
                held=sum(not look.passed for look in looks),
                unanswered=sum("cannot ask" in look.reason for look in looks),
                queries=sent() - before,
                refused=refused() - refused_before,
                wall_s=wall,
                looks_per_s=len(looks) / wall,
                rackflow_cpu_s=time.process_time() - own,
                alertmanager_cpu_s=cpu_seconds(am.process.pid) - theirs,
            )


if __name__ == "__main__":
    main()
