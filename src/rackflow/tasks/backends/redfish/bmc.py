"""One BMC resource through sushy. Every method blocks: the backend calls them with `asyncio.to_thread`.

sushy's own retries are turned down to a single attempt, so that retrying (with backoff, and never on
401/403) is decided in one place, `calls.py`, and a step's timeout means what it says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import sushy  # type: ignore[import-untyped]
from sushy import auth as sushy_auth
from sushy import connector as sushy_connector
from sushy import exceptions as sushy_errors

from rackflow.domain.bmc import Target
from rackflow.domain.inventory import PowerState
from rackflow.tasks.backends.redfish.config import RedfishConfig
from rackflow.tasks.backends.redfish.endpoint import Credentials
from rackflow.tasks.backends.redfish.rules import (
    AmbiguousFirmware,
    FirmwareEntry,
    PowerAction,
    PowerReading,
    Unsupported,
    choose_reset_type,
    power_state_from,
    related_firmware,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observed:
    """What a read of the BMC found: recorded on the component, and summarised in the log. `power` is None
    for a manager, which has no power control."""

    power: PowerReading | None
    firmware: str | None
    summary: str

    @property
    def power_state(self) -> PowerState:
        return PowerState.UNKNOWN if self.power is None else self.power.state


class ElsewhereRefused(sushy_errors.SushyError):  # type: ignore[misc]
    """A URL the BMC gave (an action's target, a task monitor) is on another host: not followed."""


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or default


class _ThisBmcOnly(sushy_connector.Connector):  # type: ignore[misc]
    """sushy follows an absolute URL the BMC names (a Reset action's target, SimpleUpdate's task monitor)
    wherever it points, with this BMC's credentials: a misconfigured or hostile BMC could have another
    machine powered off. Only relative paths and URLs on the BMC's own origin are requested."""

    def _op(self, method: str, path: str = "", *args: Any, **kwargs: Any) -> Any:
        if urlsplit(path).netloc and _origin(path) != _origin(self._url):
            raise ElsewhereRefused(f"the BMC named {path!r} for a {method}, not on {self._url}: not followed")
        return super()._op(method, path, *args, **kwargs)


class BmcSession:
    """A connection to one BMC and the one resource (system, chassis or manager) that is the component."""

    def __init__(self, target: Target, credentials: Credentials, config: RedfishConfig) -> None:
        self.target = target
        connector = _ThisBmcOnly(
            target.base_url,
            verify=config.verify_tls,
            server_side_retries=1,
            server_side_retries_delay=0,
            default_request_timeout=config.read_timeout,
            connect_timeout=config.connect_timeout,
        )
        self._root = sushy.Sushy(
            target.base_url,
            auth=sushy_auth.BasicAuth(username=credentials.username, password=credentials.password),
            root_prefix=target.root_prefix,
            connector=connector,
        )

    def close(self) -> None:
        self._root._conn.close()

    def _resource(self) -> Any:
        """A fresh read of the resource (sushy objects cache their JSON; a new one reads it anew)."""
        getter = {
            "Systems": self._root.get_system,
            "Chassis": self._root.get_chassis,
            "Managers": self._root.get_manager,
        }[self.target.collection]
        return getter(self.target.path)

    # --- power -----------------------------------------------------------------------------------

    def read_power(self) -> PowerReading:
        return _power_reading(self._power_resource())

    def reset(self, action: PowerAction) -> str:
        """Send the Reset action; returns the ResetType sent."""
        resource = self._power_resource()
        if self.target.collection == "Systems":
            offered = _names(resource.get_allowed_reset_system_values())
            reset_type = choose_reset_type(action, offered)
            resource.reset_system(sushy.ResetType(reset_type))
        else:
            offered = _names(resource.get_allowed_reset_chassis_values())
            reset_type = choose_reset_type(action, offered)
            resource.reset_chassis(sushy.ResetType(reset_type))
        return reset_type

    def _power_resource(self) -> Any:
        if self.target.collection == "Managers":
            raise Unsupported(
                f"{self.target.collection}/{self.target.identity} is a manager, which has no power control; "
                "point the component's bmc.resource at its Systems/<id> or Chassis/<id>"
            )
        return self._resource()

    # --- firmware --------------------------------------------------------------------------------

    def firmware_version(self) -> str | None:
        """The resource's own version field, else that of the firmware inventory entries that name the
        resource (`related_firmware`: AmbiguousFirmware when they disagree)."""
        resource = self._resource()
        own = {"Systems": "bios_version", "Managers": "firmware_version"}.get(self.target.collection)
        version = getattr(resource, own) if own else None
        if version:
            return str(version)
        entries = (
            FirmwareEntry(
                str(item.identity),
                str(item.version) if item.version else None,
                frozenset(
                    str(link.get("@odata.id", "")).rstrip("/")
                    for link in item.related_item or ()
                    if isinstance(link, dict)
                ),
            )
            for item in self._firmware_inventory()
        )
        return related_firmware(self.target.path, entries)

    def _firmware_inventory(self) -> list[Any]:
        """Firmware inventory entries; an empty list where the service has none (many do not)."""
        try:
            return list(self._root.get_update_service().firmware_inventory.get_members())
        except (sushy_errors.ResourceNotFoundError, sushy_errors.MissingAttributeError):
            return []

    def start_update(self, image_uri: str) -> Any | None:
        """SimpleUpdate of this resource; the task monitor, or None when the service finished at once."""
        service = self._root.get_update_service()
        scheme = image_uri.split("://", 1)[0].upper()
        try:
            protocol = sushy.UpdateTransferProtocolType(scheme)
        except ValueError:
            raise Unsupported(f"image URI {image_uri!r}: unsupported transfer protocol {scheme}") from None
        try:
            return service.simple_update(image_uri, targets=[self.target.path], transfer_protocol=protocol)
        except sushy_errors.MissingHeaderError:
            return None

    @staticmethod
    def update_running(monitor: Any) -> bool:
        """Refresh the task monitor; True while the service still works on the update."""
        return bool(monitor.check_is_processing)

    @staticmethod
    def update_result(monitor: Any) -> dict[str, Any] | None:
        """The finished task's JSON where the monitor returns it (it may also just be gone)."""
        response = monitor.response
        if response is None or not response.content:
            return None
        try:
            doc = response.json()
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    # --- inventory -------------------------------------------------------------------------------

    def observe(self) -> Observed:
        """Read the resource, its chassis and the firmware inventory: what bring-up and ingest record."""
        resource = self._resource()
        power = None if self.target.collection == "Managers" else _power_reading(resource)
        try:
            firmware = self.firmware_version()
            firmware_said = firmware or "unknown"
        except AmbiguousFirmware as exc:  # not recorded; the power state still is, and bring-up powers on
            firmware, firmware_said = None, f"not recorded: {exc}"
        parts = [
            f"{self.target.collection}/{self.target.identity} {resource.name!r}",
            *(f"{label} {value}" for label, value in _identity_fields(resource)),
            f"power {(power.state if power else PowerState.UNKNOWN).value}",
            f"firmware {firmware_said}",
        ]
        if self.target.collection == "Systems":
            chassis = [c.identity for c in _safe_links(lambda: resource.chassis)]
            parts.append(f"chassis {', '.join(chassis) or '-'}")
        inventory = [f"{item.name} {item.version}" for item in self._firmware_inventory()]
        if inventory:
            parts.append(f"firmware inventory: {', '.join(inventory)}")
        return Observed(power, firmware, "; ".join(parts))


def _power_reading(resource: Any) -> PowerReading:
    # The document's own word: sushy maps a PowerState outside Redfish's five (a vendor's "Standby") to
    # None, which would read as "not reported" in a message that should say what the BMC did report.
    raw = resource.json.get("PowerState")
    reported = raw if isinstance(raw, str) and raw else _value(resource.power_state)
    last_reset = resource.json.get("LastResetTime")  # ComputerSystem v1.12+; sushy does not map it
    return PowerReading(power_state_from(reported), reported, str(last_reset) if last_reset else None)


def _value(field: Any) -> str | None:
    """sushy maps some fields to enums; the Redfish string either way."""
    if field is None:
        return None
    return str(getattr(field, "value", field))


def _names(values: Any) -> set[str]:
    return {str(getattr(v, "value", v)) for v in values}


def _identity_fields(resource: Any) -> list[tuple[str, str]]:
    fields = (("model", "model"), ("serial", "serial_number"), ("manufacturer", "manufacturer"))
    return [(label, str(getattr(resource, attr))) for label, attr in fields if getattr(resource, attr, None)]


def _safe_links(read: Any) -> list[Any]:
    """Linked resources, or none when the service does not link them (optional in Redfish)."""
    try:
        return list(read())
    except (sushy_errors.MissingAttributeError, sushy_errors.ResourceNotFoundError):
        return []
