"""The docs match the code: docs/API.md is what scripts/gen_api_docs.py makes from the proto today,
docs/CONFIGURATION.md lists every option and variable the code reads, and the docs' links resolve."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import click
import pytest

from rackflow.cli.main import main as cli
from rackflow.cli.serve import migrate, serve
from rackflow.security import TOKEN_ENV_PREFIX
from rackflow.tasks.backends.redfish.config import RedfishConfig
from rackflow.tasks.backends.simulator import SimulatorConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CHECKED_DOCS = tuple(sorted(path.name for path in DOCS.glob("*.md")))


def test_api_reference_is_current(tmp_path: Path) -> None:
    fresh = tmp_path / "API.md"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_api_docs.py"), str(fresh)],
        check=True,
        capture_output=True,
    )
    assert fresh.read_text() == (DOCS / "API.md").read_text(), (
        "docs/API.md is stale: run `make docs` and commit the result"
    )


def test_api_reference_covers_every_rpc_and_type() -> None:
    from rackflow.v1 import flow_pb2

    api = (DOCS / "API.md").read_text()
    headings = set(re.findall(r"^#### (\S+)$", api, re.MULTILINE))
    assert headings == set(flow_pb2.DESCRIPTOR.message_types_by_name) | set(
        flow_pb2.DESCRIPTOR.enum_types_by_name
    )
    for rpc in flow_pb2.DESCRIPTOR.services_by_name["Flow"].methods_by_name:
        assert f"| `{rpc}` |" in api


def test_the_http_doc_lists_every_json_endpoint_with_its_rpc() -> None:
    """docs/HTTP.md's table of the JSON API names each endpoint (method, path, RPC) the server serves: it
    left out approving and rejecting a run, which a script found only in the code."""
    from rackflow.web.api import JsonApi

    rows = {
        (method, re.sub(r"\{[^}]+\}", "{}", path), rpc)
        for method, path, rpc in re.findall(
            r"^\| `(GET|POST|PATCH|PUT|DELETE) /api/v1(\S*)` \| `(\w+)`",
            (DOCS / "HTTP.md").read_text(),
            re.MULTILINE,
        )
    }
    missing = [
        f"{e.method} /api/v1{e.path} ({e.rpc})"
        for e in JsonApi.endpoints()
        if (e.method, re.sub(r"\{[^}]+\}", "{}", e.path), e.rpc) not in rows
    ]
    assert missing == []


def _anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9_ -]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("name", CHECKED_DOCS)
def test_links_resolve(name: str) -> None:
    text = (DOCS / name).read_text()
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, fragment = target.partition("#")
        if path:
            assert (DOCS / path).exists(), f"{name}: broken link {target}"
            if fragment:
                linked = (DOCS / path).read_text()
                assert fragment in {_anchor(h) for h in re.findall(r"^#+ (.*)$", linked, re.MULTILINE)}
        else:
            assert fragment in anchors, f"{name}: no heading for #{fragment}"


def _options(command: click.Command) -> Iterator[click.Option]:
    for param in command.params:
        if isinstance(param, click.Option) and "--help" not in param.opts:
            yield param


def _configuration(section: str | None = None) -> str:
    """docs/CONFIGURATION.md, or its `## <section>` part."""
    text = (DOCS / "CONFIGURATION.md").read_text()
    if section is None:
        return text
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    matching = [part for part in parts if part.startswith(section)]
    assert matching, f"docs/CONFIGURATION.md has no section '## {section}'"
    return matching[0]


def _row(text: str, flag: str) -> str:
    """The table row that documents `flag` (its first cell names it: `--db URL`, `--migrate`)."""
    rows = [line for line in text.splitlines() if re.match(rf"\| [^|]*`{re.escape(flag)}[ `]", line)]
    assert rows, f"docs/CONFIGURATION.md has no row for {flag}"
    return rows[0]


@pytest.mark.parametrize(
    ("command", "section"),
    [(serve, "`rackflow serve`"), (migrate, "`rackflow db migrate`"), (cli, "Client options")],
    ids=["serve", "db migrate", "client"],
)
def test_configuration_lists_every_option(command: click.Command, section: str) -> None:
    text = _configuration(section)
    for option in _options(command):
        flag = max(option.opts, key=len)
        row = _row(text, flag)
        if isinstance(option.envvar, str):
            assert f"`{option.envvar}`" in row, f"{flag}: the row does not name {option.envvar}"
        if option.show_default and option.default not in (None, False):
            assert f"`{option.default}`" in row, f"{flag}: the row lacks the default {option.default!r}"


class _Recording(dict[str, str]):
    """An empty environment that remembers which variables were looked up."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: set[str] = set()

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        self.asked.add(key)
        return super().get(key, default)


@pytest.mark.parametrize("read", [SimulatorConfig.from_env, RedfishConfig.from_env], ids=["sim", "redfish"])
def test_configuration_lists_every_backend_variable(read: Callable[[Mapping[str, str]], object]) -> None:
    env = _Recording()
    read(env)
    assert env.asked
    text = _configuration()
    for name in sorted(env.asked):
        assert f"`{name}`" in text, f"docs/CONFIGURATION.md does not mention {name}"


def test_configuration_mentions_token_variables() -> None:
    assert f"`{TOKEN_ENV_PREFIX}<NAME>=<role>:<sha256>`" in _configuration()


def _update_services() -> list[tuple[str, tuple[str, ...]]]:
    from rackflow.budgets import service as budgets
    from rackflow.checks import service as checks
    from rackflow.notify import service as notify
    from rackflow.schedules import service as schedules
    from rackflow.windows import service as windows

    return [
        ("UpdateTaskScheduleRequest", schedules.UPDATE_PATHS),
        ("UpdateMaintenanceWindowRequest", windows.UPDATE_PATHS),
        ("UpdateOperationBudgetRequest", budgets.UPDATE_PATHS),
        ("UpdatePreflightCheckRequest", checks.UPDATE_PATHS),
        ("UpdateNotificationChannelRequest", notify.UPDATE_PATHS),
    ]


@pytest.mark.parametrize(("message", "allowed"), _update_services(), ids=[m for m, _ in _update_services()])
def test_an_update_masks_documented_paths_are_those_it_takes(message: str, allowed: tuple[str, ...]) -> None:
    """The proto comment (and so docs/API.md) above `update_mask` names every path the service takes: a
    client reading the reference could not find schedule.retry, which UpdateTaskSchedule takes."""
    proto = (ROOT / "proto" / "rackflow" / "v1" / "flow.proto").read_text()
    body = proto[proto.index(f"message {message} {{") :]
    comment = body[: body.index("google.protobuf.FieldMask update_mask")]
    comment = " ".join(line.strip().removeprefix("//") for line in comment.splitlines()[1:] if "//" in line)
    documented = re.findall(r"\b(?:schedule|window|budget|check|channel)(?:\.[a-z_]+)+", comment)
    assert documented == list(allowed)
