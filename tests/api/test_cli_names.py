"""The CLI against an in-process server over the `db` fixture, with names that would not show as themselves:
`rackflow inventory import` reports a rack refused for its name as it reports any refusal part-way, and a
table shows a name stored before the rule escaped, so that it neither prints as the rack it looks like nor
turns its line around."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from rackflow import validation
from rackflow.cli.main import main
from rackflow.services import Services

pytestmark = pytest.mark.asyncio


async def rackflow(address: str, *args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, main, ["--server", address, *args])


async def test_an_import_stops_at_a_rack_whose_name_does_not_show_as_itself_and_says_so(
    grpc_server: str, services: Services, tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.yaml"
    racks = [{"name": name, "domain": "nvl-a"} for name in ("rack-01", "rack-02\u200b", "rack-03")]
    fleet.write_text(yaml.safe_dump({"domains": [{"name": "nvl-a"}], "racks": racks}))

    result = await rackflow(grpc_server, "inventory", "import", str(fleet))

    assert result.exit_code == 1, result.output
    assert result.stdout == "created rack rack-01 (0 components)\n"
    assert result.stderr == (
        "error: rack rack-02\\u200b refused: INVALID_ARGUMENT: name: 'rack-02\\u200b': U+200B ZERO WIDTH "
        f"SPACE at position 8 is not allowed; {validation.NAME_RULE}\n"
        "created before it: 1 rack (rack rack-01); "
        "not attempted: 1 rack, 1 domain (rack rack-03, domain nvl-a)\n"
        "fix the file or the inventory and run the same import again: what exists by name is skipped\n"
    )
    racks_now, _ = await services.inventory.list_racks()
    assert [r.name for r in racks_now] == ["rack-01"]

    fleet.write_text(fleet.read_text().replace("\\u200B", ""))  # fixed, run again: it resumes
    result = await rackflow(grpc_server, "inventory", "import", str(fleet))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:3] == [
        "created rack rack-02 (0 components)",
        "created rack rack-03 (0 components)",
        "created domain nvl-a (3 racks)",
    ]


async def test_a_table_shows_a_name_stored_before_the_rule_escaped(
    grpc_server: str, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as before_the_rule:
        before_the_rule.setattr(validation, "check_identifier", lambda value, _field: value)
        await services.inventory.create_rack("r12\u200b")
        await services.inventory.create_rack("r\u202e21")
    await services.inventory.create_rack("r12")

    listed = await rackflow(grpc_server, "rack", "list")
    assert listed.exit_code == 0, listed.output
    names = [line.split()[0] for line in listed.stdout.splitlines()[2:]]
    assert names == ["r12\\u200b", "r\\u202e21", "r12"]
    assert "\u200b" not in listed.stdout and "\u202e" not in listed.stdout

    shown = await rackflow(grpc_server, "rack", "show", "r12\u200b")  # found by its name as stored
    assert shown.exit_code == 0, shown.output
    assert "r12\\u200b" in shown.stdout and "\u200b" not in shown.stdout
