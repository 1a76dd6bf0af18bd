"""Option parsing and the client's value types: what reaches the wire for what an operator types."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rackflow.cli.racks import parse_fleet
from rackflow.cli.targets import parse_seconds, parse_time, parse_types
from rackflow.client import NewComponent, Operation, Spec, Targets, component_type, operation_name
from rackflow.v1 import flow_pb2 as pb

RACK_ID = "5f0c4a51-2c1b-4d7e-9a43-0f3a1b2c3d4e"


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("30m", 1800), ("1h30m", 5400), ("2h", 7200)]
)
def test_parse_seconds(text: str, seconds: int) -> None:
    assert parse_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "1d", "10 m", "m", "1.5h", "-5s"])
def test_parse_seconds_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_seconds(text)


@pytest.mark.parametrize("text", ["9999999999h", "99999999999999", "876001h"])
def test_parse_seconds_refuses_a_duration_past_a_hundred_years(text: str) -> None:
    """`pause --for 9999999999h` and `audit --since` printed an OverflowError's traceback."""
    with pytest.raises(ValueError, match="longer than 100 years"):
        parse_seconds(text)


def test_parse_types_accepts_lower_case_and_spaces_and_refuses_unknown_types() -> None:
    assert parse_types("compute, NVSWITCH") == ("COMPUTE", "NVSWITCH")
    with pytest.raises(ValueError, match="unknown component type 'GPU'"):
        parse_types("COMPUTE,GPU")


def test_parse_time_needs_an_offset() -> None:
    assert parse_time("2026-06-01T04:00:00Z") == datetime(2026, 6, 1, 4, tzinfo=UTC)
    with pytest.raises(ValueError, match="no offset"):
        parse_time("2026-06-01T04:00:00")
    with pytest.raises(ValueError, match="not an RFC 3339 time"):
        parse_time("tomorrow")


def test_enum_names_are_forgiving_about_case_and_prefix() -> None:
    assert component_type("compute") == pb.COMPONENT_TYPE_COMPUTE
    assert component_type("COMPONENT_TYPE_CDU") == pb.COMPONENT_TYPE_CDU
    assert operation_name("power-reset") == "power_reset"
    with pytest.raises(ValueError, match="unknown operation 'reboot'"):
        operation_name("reboot")


def test_rack_targets_use_the_id_for_a_uuid_and_the_name_otherwise() -> None:
    spec = Targets(racks=("rack-01", RACK_ID), types=("COMPUTE",)).to_proto()
    first, second = spec.racks.targets
    assert first.WhichOneof("identifier") == "name" and first.name == "rack-01"
    assert second.WhichOneof("identifier") == "id" and second.id.id == RACK_ID
    assert list(first.component_types) == [pb.COMPONENT_TYPE_COMPUTE]


def test_component_targets_take_ids_or_type_and_external_id() -> None:
    spec = Targets(components=(RACK_ID, "COMPUTE:BMC-0042")).to_proto()
    by_id, external = spec.components.targets
    assert by_id.id.id == RACK_ID
    assert external.external == pb.ExternalRef(type=pb.COMPONENT_TYPE_COMPUTE, id="BMC-0042")
    with pytest.raises(ValueError, match="expected a UUID or TYPE:EXTERNAL_ID"):
        Targets(components=("node-1",)).to_proto()


def test_domain_targets_by_name() -> None:
    spec = Targets(domains=("nvl-a",), types=("NVSWITCH",)).to_proto()
    assert spec.nvl_domains.targets[0].name == "nvl-a"


@pytest.mark.parametrize(
    "targets",
    [Targets(), Targets(racks=("a",), domains=("b",)), Targets(components=(RACK_ID,), types=("COMPUTE",))],
)
def test_targets_must_be_exactly_one_kind(targets: Targets) -> None:
    with pytest.raises(ValueError):
        targets.to_proto()


def test_operation_builds_the_scheduled_operation_oneof() -> None:
    request = Operation(
        "power-off", Targets(racks=("r",)), "night", forced=True, queue=True, queue_timeout=60
    )
    assert request.to_proto().WhichOneof("operation") == "power_off"
    body = request.to_proto().power_off
    assert body.forced and body.description == "night"
    assert body.queue_options == pb.QueueOptions(
        conflict_strategy=pb.CONFLICT_STRATEGY_QUEUE, queue_timeout_seconds=60
    )


def test_operation_refuses_options_that_do_not_apply() -> None:
    with pytest.raises(ValueError, match="--forced applies to power-off and power-reset"):
        Operation("power_on", Targets(racks=("r",)), forced=True).to_proto()
    with pytest.raises(ValueError, match="applies to upgrade-firmware"):
        Operation("ingest", Targets(racks=("r",)), version="1.0").to_proto()


def test_upgrade_firmware_carries_version_and_window() -> None:
    start = datetime(2026, 6, 1, 4, tzinfo=UTC)
    body = Operation("upgrade_firmware", Targets(racks=("r",)), version="2.4.1", start=start).to_proto()
    assert body.upgrade_firmware.target_version == "2.4.1"
    assert body.upgrade_firmware.start_time.ToDatetime(tzinfo=UTC) == start
    assert not body.upgrade_firmware.HasField("end_time")


def test_spec_kinds() -> None:
    assert Spec.cron("0 2 * * *", "Europe/Berlin").to_proto() == pb.ScheduleSpec(
        type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="0 2 * * *", timezone="Europe/Berlin"
    )
    assert Spec.interval("24h").to_proto().type == pb.SCHEDULE_SPEC_TYPE_INTERVAL
    assert Spec.at("2026-06-01T04:00:00Z").to_proto().type == pb.SCHEDULE_SPEC_TYPE_ONE_TIME
    assert Spec("one-time", "2026-06-01T04:00:00Z").to_proto().type == pb.SCHEDULE_SPEC_TYPE_ONE_TIME


# --- fleet files ---------------------------------------------------------------------------------


def test_parse_fleet_reads_racks_components_and_domains() -> None:
    fleet = parse_fleet(
        {
            "domains": [{"name": "nvl-a"}],
            "racks": [
                {
                    "name": "rack-01",
                    "external_id": 1001,
                    "domain": "nvl-a",
                    "components": [{"type": "compute", "name": "node-0", "firmware_version": "2.4.0"}],
                },
                {"name": "rack-02"},
            ],
        }
    )
    assert fleet.domains == ("nvl-a",)
    first, second = fleet.racks
    assert (first.name, first.external_id, first.domain) == ("rack-01", "1001", "nvl-a")
    assert first.components == (NewComponent("compute", "node-0", "", "2.4.0"),)
    assert (second.domain, second.components) == ("", ())


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "fleet: expected a mapping"),
        ({"rack": []}, "unknown key 'rack'"),
        ({"racks": [{"external_id": "x"}]}, r"racks\[0\].name: expected a non-empty string"),
        ({"racks": [{"name": "r", "domain": "nvl-z"}]}, "'nvl-z' is not listed under domains"),
        ({"racks": [{"name": "r"}, {"name": "r"}]}, "rack 'r' is listed twice"),
        ({"racks": [{"name": "r", "components": [{"type": "GPU", "name": "g"}]}]}, "unknown component type"),
        (
            {"racks": [{"name": "r", "components": [{"type": "CDU", "name": "c", "firmware_version": 1.2}]}]},
            r"racks\[0\].components\[0\].firmware_version: expected a string \(quote",
        ),
    ],
)
def test_parse_fleet_names_the_place_of_a_mistake(document: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fleet(document)
