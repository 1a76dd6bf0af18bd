"""drain_scaling: is the default drain as fast with a large backlog as with a small one?

Runs `dispatch_drain`'s measurement at default settings (`--dispatch-batch 10`, executor running) for a
small and a large N, alternating, on fresh databases, and prints the large N's rate over the small N's for
each round (target: >= 0.8 at 50,000 against 1,000). The load average is printed around every drain.

    python bench/drain_scaling.py --small 1000 --large 50000 --rounds 2
"""

from __future__ import annotations

import argparse

from _common import add_db_arguments, code_line, machine_line, result
from dispatch_drain import SIM_STEP_SECONDS, measure_drain

DEFAULT_BATCH = 10
TARGET_RATIO = 0.8


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--sim-step",
        type=float,
        default=SIM_STEP_SECONDS,
        help="simulator step seconds; 3600 keeps the executor idle, which measures the dispatcher alone",
    )
    args = parser.parse_args()
    print(code_line())
    print(
        f"# drain_scaling db={args.db} small={args.small} large={args.large} batch={DEFAULT_BATCH}",
        flush=True,
    )
    for round_no in range(1, args.rounds + 1):
        rates = {}
        for n in (args.small, args.large):
            print(machine_line(), flush=True)
            drain = measure_drain(
                args.db, args.pg_admin, n=n, instances=1, batch=DEFAULT_BATCH, sim_step=args.sim_step
            )
            rates[n] = drain.firings_per_s
            result(
                "dispatch_drain", db=args.db, n=n, firings_per_s=drain.firings_per_s, drain_s=drain.drain_s
            )
        ratio = rates[args.large] / rates[args.small]
        result(
            "drain_scaling",
            round=round_no,
            db=args.db,
            small_per_s=rates[args.small],
            large_per_s=rates[args.large],
            ratio=ratio,
            target=TARGET_RATIO,
            met="yes" if ratio >= TARGET_RATIO else "no",
        )
    print(machine_line(), flush=True)


if __name__ == "__main__":
    main()
