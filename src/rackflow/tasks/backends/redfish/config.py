"""Settings of the redfish backend, from `RACKFLOW_REDFISH_*` environment variables."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from rackflow.errors import InvalidArgument

PREFIX = "RACKFLOW_REDFISH_"


@dataclass(frozen=True)
class RedfishConfig:
    """Timeouts and retries for BMC calls, and how firmware versions become image URIs.

    `image_uri` is a template such as `https://images.example/{type}/{version}.bin` (`{type}` is the
    component type in lower case); with it, an upgrade's target_version is a version, verified after the
    update. A target_version that is itself a URI is used as the image as it is.

    `restart_proof_window`: how long a restart on a BMC that keeps no `LastResetTime` is watched for a state
    it passes through before it counts as done unobserved (`rules.reset_progress`; at most `power_timeout`).
    """

    concurrency: int = 4
    power_timeout: float = 300.0
    firmware_timeout: float = 1800.0
    poll_interval: float = 2.0
    restart_proof_window: float = 30.0
    retries: int = 3
    retry_delay: float = 1.0
    max_retry_delay: float = 30.0
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    verify_tls: bool | str = True
    image_uri: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= 256:
            raise InvalidArgument(f"{PREFIX}CONCURRENCY: must be 1..256, got {self.concurrency}")
        if not 0 <= self.retries <= 100:
            raise InvalidArgument(f"{PREFIX}RETRIES: must be 0..100, got {self.retries}")
        for name, value in (
            ("POWER_TIMEOUT", self.power_timeout),
            ("FIRMWARE_TIMEOUT", self.firmware_timeout),
            ("POLL_SECONDS", self.poll_interval),
            ("RESTART_PROOF_SECONDS", self.restart_proof_window),
            ("CONNECT_TIMEOUT", self.connect_timeout),
            ("READ_TIMEOUT", self.read_timeout),
        ):
            if not (math.isfinite(value) and value > 0):
                raise InvalidArgument(f"{PREFIX}{name}: must be a positive number of seconds, got {value}")
        if not (math.isfinite(self.retry_delay) and 0 <= self.retry_delay <= self.max_retry_delay):
            raise InvalidArgument(
                f"{PREFIX}RETRY_DELAY: must be 0..{self.max_retry_delay:g} seconds, got {self.retry_delay}"
            )
        if self.image_uri and "{version}" not in self.image_uri:
            raise InvalidArgument(f"{PREFIX}IMAGE_URI: must contain {{version}}, got {self.image_uri!r}")
        try:  # as `rules.firmware_image` fills it, so that no upgrade is the first to find it broken
            self.image_uri.format(version="1.0", type="compute")
        except (KeyError, IndexError, ValueError):
            raise InvalidArgument(
                f"{PREFIX}IMAGE_URI: only {{version}} and {{type}} are filled in, got {self.image_uri!r} "
                "(a literal brace is written twice: {{ }})"
            ) from None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RedfishConfig:
        """Unset variables keep the defaults; RACKFLOW_REDFISH_VERIFY_TLS is true, false or a CA file."""
        env = os.environ if env is None else env
        return cls(
            concurrency=_int(env, "CONCURRENCY", cls.concurrency),
            power_timeout=_seconds(env, "POWER_TIMEOUT", cls.power_timeout),
            firmware_timeout=_seconds(env, "FIRMWARE_TIMEOUT", cls.firmware_timeout),
            poll_interval=_seconds(env, "POLL_SECONDS", cls.poll_interval),
            restart_proof_window=_seconds(env, "RESTART_PROOF_SECONDS", cls.restart_proof_window),
            retries=_int(env, "RETRIES", cls.retries),
            retry_delay=_seconds(env, "RETRY_DELAY", cls.retry_delay),
            connect_timeout=_seconds(env, "CONNECT_TIMEOUT", cls.connect_timeout),
            read_timeout=_seconds(env, "READ_TIMEOUT", cls.read_timeout),
            verify_tls=_verify(env.get(f"{PREFIX}VERIFY_TLS", "").strip()),
            image_uri=env.get(f"{PREFIX}IMAGE_URI", "").strip(),
        )


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(PREFIX + name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        raise InvalidArgument(f"{PREFIX}{name}: {raw!r} is not a number of seconds") from None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(PREFIX + name, "").strip()
    try:
        return int(raw) if raw else default
    except ValueError:
        raise InvalidArgument(f"{PREFIX}{name}: {raw!r} is not a whole number") from None


def _verify(raw: str) -> bool | str:
    """True, False, or a CA bundle (a file, or a directory of certificates) that exists now: requests reads
    it at each connection, so a path that is not there would fail every step on an https BMC instead."""
    lowered = raw.lower()
    # The booleans every variable reads (docs/CONFIGURATION.md): `off` was taken for a CA bundle named `off`.
    if lowered in ("", "1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    if not os.path.exists(raw):
        raise InvalidArgument(
            f"{PREFIX}VERIFY_TLS: expected true, false or the path of a CA bundle; {raw!r} is none "
            "(no such file or directory)"
        )
    return raw
