"""Summarise a py-spy raw profile (`--profile x.raw`): where the sampled time went, by function.

Prints the share of samples each function was running itself (self) and was anywhere on the stack
(inclusive), with frames of the interpreter, click and asyncio's outer loop left out of the inclusive
list. `--match rackflow/` keeps only frames whose file contains the text.

    python bench/profile_summary.py /tmp/drain.raw --top 25 --match rackflow/
"""

from __future__ import annotations

import argparse
import re
import signal
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"(?P<function>.*) \((?P<file>.*?)(?::\d+)?\)$")
_WRAPPERS = ("<frozen runpy>", "click/", "asyncio/runners.py", "rackflow/__main__.py", "rackflow/cli/")


def frame_name(frame: str) -> str:
    """`fire (/…/site-packages/rackflow/schedules/firing.py:120)` -> `fire (rackflow/schedules/firing.py)`."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match["file"]
    for marker in ("site-packages/", "/src/"):
        path = path.rsplit(marker, 1)[-1]
    return f"{match['function']} ({path})"


def summarise(lines: list[str]) -> tuple[int, Counter[str], Counter[str]]:
    total = 0
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [frame_name(f) for f in stack.split(";")]
        own[frames[-1]] += samples
        for name in set(frames):
            anywhere[name] += samples
    return total, own, anywhere


def main() -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--match", default="", help="only frames whose file contains this text")
    args = parser.parse_args()
    total, own, anywhere = summarise(args.profile.read_text().splitlines())
    print(f"{total} samples")
    for title, counter in (("self", own), ("inclusive", anywhere)):
        print(f"--- {title}")
        shown = [
            (name, n)
            for name, n in counter.most_common()
            if args.match in name and not any(w in name for w in _WRAPPERS)
        ]
        for name, samples in shown[: args.top]:
            print(f"{100 * samples / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
