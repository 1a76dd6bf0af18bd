"""Earlier releases of rackflow for the upgrade tests: this repository's own source as it was when the
schema's newest revision was an older one, extracted with `git archive` and run from the same virtualenv
with PYTHONPATH pointing at it (so the tests need no package index and no tags)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from rackflow.store.migrate import MIGRATIONS_DIR, head_revision, scripts

REPO = Path(__file__).resolve().parents[2]


def previous_revision() -> str:
    """The revision before head: the previous release's schema."""
    down = scripts().get_revision(head_revision()).down_revision
    assert isinstance(down, str)
    return down


def release_at(revision: str, into: Path) -> Path:
    """The `src` tree of the release whose head was `revision`: the commit before the one that added the
    next migration. Returns the `src` directory, for PYTHONPATH."""
    (following,) = (s for s in scripts().walk_revisions() if s.down_revision == revision)
    # Its path in the repository, wherever rackflow was imported from.
    newer = Path("src") / Path(following.path).relative_to(MIGRATIONS_DIR.parents[2])

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True).stdout

    added = (
        # --first-parent -m: a migration that came in by a merge is "added" by the merge commit on main,
        # whose first parent is then the release before it.
        git(
            "log",
            "-1",
            "--first-parent",
            "-m",
            "--diff-filter=A",
            "--format=%H",
            "--",
            str(newer),
        )
        .decode()
        .strip()
    )
    assert added, f"{newer} is not committed: commit it before running this test"
    archive = git("archive", "--format=tar", f"{added}^", "src")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"
