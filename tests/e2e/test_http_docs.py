"""docs/HTTP.md's curl examples, run against a real `rackflow serve --http-listen` set up as the doc says.

Each `$ curl …` line of a `console` block is run in order; its answer must be JSON, and every field and
value the doc shows (`"name": "nightly-reset"`, any quoted string without "…") must be in it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import ServerProcess, run_cli, start_server
from tests.e2e.fleet import wait_until

pytestmark = pytest.mark.slow

DOC = Path(__file__).parents[2] / "docs" / "HTTP.md"
DOC_BASE = "http://127.0.0.1:8080"
_PAIR = re.compile(r'"(\w+)": ("(?:[^"\\]|\\.)*"|-?\d+|true|false|null)')
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def examples() -> list[tuple[str, str]]:
    """(command, documented answer) of every `$ ` line in the doc's console blocks, in order."""
    found = []
    for block in re.findall(r"```console\n(.*?)```", DOC.read_text(), re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("$ "):
                answer = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("$ ") else ""
                found.append((line[2:], answer))
    return found


def leaves(value: Any) -> Iterator[tuple[str | None, Any]]:
    """(key, value) of every scalar in a JSON document (key None in lists), and every key as a string."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield None, key
            if isinstance(item, dict | list):
                yield from leaves(item)
            else:
                yield key, item
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item) if isinstance(item, dict | list) else iter([(None, item)])


def cli(server: ServerProcess, *args: str) -> str:
    result = run_cli(server.address, *args)
    result.check_returncode()
    return result.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("http-docs")
    url = f"sqlite:///{directory}/rackflow.db"
    started = start_server(url, directory, args=["--migrate", "--http-listen", "127.0.0.1:0"], name="docs")
    fleet = Path(__file__).parents[2] / "examples" / "fleet.yaml"
    cli(started, "inventory", "import", str(fleet))
    cli(started, "schedule", "create", "nightly-reset", "--cron", "0 2 * * *", "--tz", "Europe/Berlin",
        "--op", "power-reset", "--rack", "rack-01", "--rack", "rack-02")  # fmt: skip
    cli(started, "schedule", "trigger", "nightly-reset")
    wait_until(
        lambda: (
            "COMPLETED"
            in cli(started, "task", "list", "--schedule", "nightly-reset", "--status", "completed")
            and "PENDING" not in cli(started, "task", "list", "--active")
        ),
        timeout=60,
        what="the triggered tasks to complete",
    )
    cli(started, "window", "create", "sat-night", "--allow", "--cron", "0 22 * * 6", "--duration", "6h",
        "--tz", "Europe/Berlin", "--rack", "rack-01")  # fmt: skip
    yield started
    started.stop()


def test_the_documented_requests_answer_what_the_doc_shows(server: ServerProcess) -> None:
    assert shutil.which("curl"), "curl is needed to run the documented examples"
    tasks = json.loads(cli(server, "task", "list", "--schedule", "nightly-reset", "-o", "json"))["tasks"]
    env = {**os.environ, "TASK": tasks[0]["id"]["id"]}
    ran = 0
    for command, documented in examples():
        assert command.startswith("curl "), command
        result = subprocess.run(
            ["bash", "-c", command.replace(DOC_BASE, server.http_url)],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert result.returncode == 0, f"{command}: {result.stderr}"
        answer = json.loads(result.stdout)
        found = list(leaves(answer))
        strings = {str(v) for _, v in found}
        for key, literal in _PAIR.findall(documented):
            if "…" not in literal:
                assert (key, json.loads(literal)) in found, (
                    f"{command}: no {key}={literal} in {result.stdout}"
                )
        for literal in _STRING.findall(documented):
            if "…" not in literal:
                assert json.loads(f'"{literal}"') in strings, f"{command}: no {literal!r} in {result.stdout}"
        ran += 1
    assert ran >= 15
