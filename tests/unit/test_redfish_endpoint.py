"""BMC endpoints: what the inventory accepts, how a target is split for sushy, and credentials read at use."""

from __future__ import annotations

from pathlib import Path

import pytest

from rackflow.domain.bmc import Target, target_of
from rackflow.domain.inventory import Bmc
from rackflow.errors import InvalidArgument
from rackflow.inventory.bmc import check_bmc
from rackflow.tasks.backends.redfish.endpoint import CredentialsUnavailable, read_credentials


def bmc(url: str = "https://10.0.0.5", resource: str = "Systems/1", credentials: str = "env:BMC_1") -> Bmc:
    return Bmc(url, resource, credentials)


ROOT = "/redfish/v1/"


@pytest.mark.parametrize(
    ("url", "resource", "expected"),
    [
        ("https://10.0.0.5", "Systems/1", Target("https://10.0.0.5", ROOT, "Systems", "1")),
        ("http://bmc:8000/redfish/v1", "node-0", Target("http://bmc:8000", ROOT, "Systems", "node-0")),
        ("https://[fd00::5]/redfish/v1/", "/Chassis/P0/", Target("https://[fd00::5]", ROOT, "Chassis", "P0")),
        ("https://bmc/custom/root", "Managers/M", Target("https://bmc", "/custom/root/", "Managers", "M")),
    ],
)
def test_target_splits_service_root_and_resource(url: str, resource: str, expected: Target) -> None:
    assert target_of(bmc(url, resource)) == expected


def test_target_path_and_description() -> None:
    target = target_of(bmc("http://127.0.0.1:8000", "Systems/abc"))
    assert target.path == "/redfish/v1/Systems/abc"
    assert target.describe() == "http://127.0.0.1:8000/redfish/v1/Systems/abc"


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("https://bmc-7.lab", "Systems/1"), ("https://BMC-7.LAB.:443/redfish/v1/", "/Systems/1/")),
        (("https://bmc-7.lab", "node-0"), ("http://bmc-7.lab:443/redfish/v1", "Systems/node-0")),
        (("https://[FD00:0::5]", "Chassis/P0"), ("https://[fd00::5]:443", "Chassis/P0")),
        (("https://bmc/custom/root", "1"), ("https://bmc/custom/root/", "Systems/1")),
    ],
)
def test_spellings_of_one_resource_have_one_key(one: tuple[str, str], other: tuple[str, str]) -> None:
    assert target_of(bmc(*one)).resource_key == target_of(bmc(*other)).resource_key


@pytest.mark.parametrize(
    "other",
    [
        ("https://bmc-7.lab", "Systems/2"),  # another system of the same BMC
        ("https://bmc-7.lab", "Chassis/1"),
        ("https://bmc-8.lab", "Systems/1"),
        ("https://bmc-7.lab:8443", "Systems/1"),  # another port: another service
        ("http://bmc-7.lab", "Systems/1"),  # port 80
        ("https://bmc-7.lab/other/root", "Systems/1"),
    ],
)
def test_other_resources_have_other_keys(other: tuple[str, str]) -> None:
    assert (
        target_of(bmc("https://bmc-7.lab", "Systems/1")).resource_key != target_of(bmc(*other)).resource_key
    )


@pytest.mark.parametrize(
    ("url", "resource", "field", "words"),
    [
        ("10.0.0.5", "Systems/1", "components[0].bmc.url", "expected http(s)://HOST"),
        ("ftp://10.0.0.5", "Systems/1", "components[0].bmc.url", "expected http(s)://HOST"),
        ("https://", "Systems/1", "components[0].bmc.url", "expected http(s)://HOST"),
        ("https://admin:pw@10.0.0.5", "Systems/1", "components[0].bmc.url", "must not carry credentials"),
        ("https://10.0.0.5/?x=1", "Systems/1", "components[0].bmc.url", "query"),
        ("https://10.0.0.5:99999", "Systems/1", "components[0].bmc.url", "Port out of range"),
        ("https://10.0.0.5", "", "components[0].bmc.resource", "expected Systems/<id>"),
        ("https://10.0.0.5", "Storage/1", "components[0].bmc.resource", "expected Systems/<id>"),
        ("https://10.0.0.5", "Systems/1/Bios", "components[0].bmc.resource", "expected Systems/<id>"),
        ("https://10.0.0.5", "Systems/a b", "components[0].bmc.resource", "expected Systems/<id>"),
        # The id forgotten: these were taken for the bare ids "Chassis" and "Systems", i.e. Systems/Chassis.
        ("https://10.0.0.5", "Chassis/", "components[0].bmc.resource", "names a collection, not a resource"),
        ("https://10.0.0.5", "Systems/", "components[0].bmc.resource", "names a collection, not a resource"),
        ("https://10.0.0.5", "Managers", "components[0].bmc.resource", "names a collection, not a resource"),
    ],
)
def test_bad_endpoints_are_refused_naming_the_field(url: str, resource: str, field: str, words: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_bmc(bmc(url, resource), "components[0].bmc")
    assert str(caught.value).startswith(f"{field}: ")
    assert words in str(caught.value)


@pytest.mark.parametrize("ref", ["env:BMC_RACK1", "env:_x9", "file:/etc/rackflow/bmc/rack1"])
def test_credential_references_are_accepted(ref: str) -> None:
    assert check_bmc(bmc(credentials=ref), "bmc").credentials == ref


@pytest.mark.parametrize(
    "ref", ["", "admin:hunter2", "env:", "env:1BAD", "env:A-B", "file:relative/path", "vault:secret/bmc"]
)
def test_anything_but_a_reference_is_refused_without_echoing_it(ref: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_bmc(bmc(credentials=ref), "bmc")
    assert str(caught.value).startswith("bmc.credentials: expected env:NAME or file:/absolute/path")
    assert "hunter2" not in str(caught.value)  # it may be a password typed in the wrong place


def test_env_credentials_are_read_at_use() -> None:
    creds = read_credentials("env:BMC_RACK1", {"BMC_RACK1": "admin:pa:ss word"})
    assert (creds.username, creds.password) == ("admin", "pa:ss word")
    assert "pa:ss" not in repr(creds)


def test_file_credentials_are_read_at_use_and_lose_only_the_line_end(tmp_path: Path) -> None:
    secret = tmp_path / "rack1"
    secret.write_text("root: spaced \n")
    creds = read_credentials(f"file:{secret}", {})
    assert (creds.username, creds.password) == ("root", " spaced ")
    secret.write_text("root:rotated\n")
    assert read_credentials(f"file:{secret}", {}).password == "rotated"


@pytest.mark.parametrize(
    ("ref", "env", "message"),
    [
        ("env:BMC_X", {}, "credentials env:BMC_X: environment variable BMC_X is not set"),
        ("env:BMC_X", {"BMC_X": "no-colon"}, "credentials env:BMC_X: expected the form user:password"),
        ("env:BMC_X", {"BMC_X": ":pw"}, "credentials env:BMC_X: expected the form user:password"),
        ("file:/nonexistent/rf", {}, "credentials file:/nonexistent/rf: cannot read the file (No such file"),
    ],
)
def test_unusable_credentials_say_where_they_looked_never_what_they_found(
    ref: str, env: dict[str, str], message: str
) -> None:
    with pytest.raises(CredentialsUnavailable) as caught:
        read_credentials(ref, env)
    assert str(caught.value).startswith(message)
    assert "no-colon" not in str(caught.value)


@pytest.mark.parametrize("name", ["url", "resource", "credentials"])
def test_control_characters_are_refused_before_they_reach_the_database(name: str) -> None:
    fields = {"url": "https://10.0.0.5", "resource": "Systems/1", "credentials": "file:/etc/bmc"}
    fields[name] += "\x00"
    with pytest.raises(InvalidArgument, match=rf"^bmc\.{name}: must not contain control characters$"):
        check_bmc(Bmc(**fields), "bmc")


def test_values_wider_than_their_columns_are_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"^bmc\.resource: at most 255 characters, got 264$"):
        check_bmc(bmc(resource="Systems/" + "x" * 256), "bmc")
