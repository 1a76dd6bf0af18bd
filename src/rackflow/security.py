"""Secrets and key material: bearer tokens (only their SHA-256 is ever stored) and TLS credentials.

Nothing here logs or formats a token or a key: error messages name the file, the entry and the field, never
the secret. Token hashes are compared with `hmac.compare_digest` against every entry, so the time a check
takes does not reveal which entry (if any) came close.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import ipaddress
import re
import ssl
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import grpc
import yaml

from rackflow.errors import InvalidArgument

TOKEN_ENV_PREFIX = "RACKFLOW_AUTH_TOKEN_"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class Role(enum.StrEnum):
    """`viewer` may read (Get/List/Preview/Check); `operator` may also change things; `approver` may do
    everything an operator may and also approve or reject a run awaiting approval (docs/SAFETY.md). Each
    role holds the ones before it."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    APPROVER = "approver"

    def holds(self, needed: Role) -> bool:
        """Whether this role may do what `needed` may."""
        order = list(Role)
        return order.index(self) >= order.index(needed)


def hash_token(token: str) -> str:
    """The form a token is stored in: lower-case hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenEntry:
    name: str
    role: Role
    sha256: str


@dataclass(frozen=True)
class TokenTable:
    """The accepted tokens, by hash. Names and hashes are unique, so a token maps to one principal."""

    entries: tuple[TokenEntry, ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise InvalidArgument("auth tokens: no tokens configured")
        for attr in ("name", "sha256"):
            values = [getattr(e, attr) for e in self.entries]
            duplicates = sorted({v for v in values if values.count(v) > 1})
            if duplicates:
                shown = duplicates if attr == "name" else [f"{len(duplicates)} hash(es)"]
                raise InvalidArgument(f"auth tokens: duplicate {attr}: {', '.join(shown)}")

    def verify(self, token: str) -> TokenEntry | None:
        """The entry whose hash matches `token`, or None. Every entry is compared, in constant time."""
        digest = hash_token(token)
        found = None
        for entry in self.entries:
            if hmac.compare_digest(entry.sha256, digest):
                found = entry
        return found


def _entry_from(item: object, where: str) -> TokenEntry:
    if not isinstance(item, Mapping):
        raise InvalidArgument(f"{where}: expected a mapping with name, role and sha256")
    if "token" in item:
        raise InvalidArgument(f"{where}: plaintext 'token' is not accepted; store its sha256 instead")
    unknown = sorted(set(map(str, item)) - {"name", "role", "sha256"})
    if unknown:
        raise InvalidArgument(f"{where}: unknown field(s) {', '.join(unknown)} (expected name, role, sha256)")
    name, role, digest = item.get("name"), item.get("role"), item.get("sha256")
    if not isinstance(name, str) or not name.strip() or len(name) > 255:
        raise InvalidArgument(f"{where}.name: expected a non-empty string of at most 255 characters")
    if reserved_name(name.strip()):
        raise InvalidArgument(
            f"{where}.name: {name.strip()!r} is reserved: {RESERVED_WHY}; choose another name"
        )
    if role not in {r.value for r in Role}:
        known = ", ".join(repr(r.value) for r in Role)
        raise InvalidArgument(f"{where}.role: expected one of {known}, got {role!r}")
    if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest.lower()):
        raise InvalidArgument(f"{where}.sha256: expected 64 hexadecimal characters (sha256 of the token)")
    return TokenEntry(name=name.strip(), role=Role(role), sha256=digest.lower())


def parse_token_file(text: str, source: str) -> tuple[TokenEntry, ...]:
    """A YAML (or JSON, which is YAML) list of `{name, role, sha256}` mappings."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"{source}: not valid YAML or JSON: {exc}") from None
    if not isinstance(data, list):
        raise InvalidArgument(f"{source}: expected a list of {{name, role, sha256}} entries")
    return tuple(_entry_from(item, f"{source}[{i}]") for i, item in enumerate(data))


def tokens_from_env(environ: Mapping[str, str]) -> tuple[TokenEntry, ...]:
    """`RACKFLOW_AUTH_TOKEN_<NAME>=<role>:<sha256>` variables; NAME becomes the principal, lower-cased."""
    entries = []
    for key in sorted(k for k in environ if k.startswith(TOKEN_ENV_PREFIX)):
        role, _, digest = environ[key].partition(":")
        name = key.removeprefix(TOKEN_ENV_PREFIX).lower()
        entries.append(_entry_from({"name": name, "role": role, "sha256": digest}, key))
    return tuple(entries)


def load_tokens(path: str | None, environ: Mapping[str, str]) -> TokenTable | None:
    """Tokens from the file at `path` and from the environment; None when neither configures any."""
    entries: tuple[TokenEntry, ...] = ()
    if path:
        entries = parse_token_file(_read(path, "--auth-tokens").decode(), path)
    entries += tokens_from_env(environ)
    return TokenTable(entries) if path or entries else None


def _read(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"{flag}: cannot read {path!r}: {exc.strerror}") from None


@dataclass(frozen=True)
class ServerTls:
    """Paths of the server's certificate chain and key, and of the CA that signs client certificates."""

    cert: str
    key: str
    client_ca: str | None = None

    @classmethod
    def from_flags(cls, cert: str | None, key: str | None, client_ca: str | None) -> ServerTls | None:
        """None when TLS is off; a key without a certificate (or a client CA without either) is refused."""
        if not cert and not key and not client_ca:
            return None
        if not cert or not key:
            raise InvalidArgument("--tls-cert, --tls-key: TLS needs both the certificate and its key")
        return cls(cert, key, client_ca or None)

    def check_files(self) -> None:
        """Refuse, naming the flag and the file, a certificate chain, key or client CA that gRPC could not
        serve with. gRPC finds out only when it binds the port: it logged `Invalid private key.` in its own
        format and failed the bind, which `serve` could only report as an address it could not listen on."""
        for path, flag in (
            (self.cert, "--tls-cert"),
            (self.key, "--tls-key"),
            (self.client_ca, "--tls-client-ca"),
        ):
            if path is not None:
                _read(path, flag)
        _check_certificates(self.cert, "--tls-cert")
        if self.client_ca is not None:
            _check_certificates(self.client_ca, "--tls-client-ca")
        _check_key_of(self.cert, self.key)


def _check_certificates(path: str, flag: str) -> None:
    """`path` holds at least one PEM certificate. Read with Python's `ssl` (OpenSSL), which takes the same PEM
    files as gRPC's BoringSSL: gRPC itself says what it cannot load only in a line of its own format, and
    then fails a bind (server) or every connection (client) without saying why."""
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError:
        raise InvalidArgument(f"{flag}: {path} holds no PEM certificate") from None


def _check_key_of(cert: str, key: str) -> None:
    """`key` is the unencrypted PEM private key of the certificate in `cert` (`--tls-cert`/`--tls-key`, the
    server's and the client's alike). A key protected by a passphrase is refused (gRPC cannot read it
    either), never prompted for."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise InvalidArgument(
                f"--tls-key: {key} is not the private key of the certificate in {cert}"
            ) from None
        why = f" ({exc.reason})" if exc.reason else ""  # else only `[SSL] PEM lib (_ssl.c:3926)`
        raise InvalidArgument(
            f"--tls-key: {key} is not a PEM private key (unencrypted) of the certificate in {cert}{why}"
        ) from None


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    """TLS for the listener; with a client CA, clients must present a certificate it signed (mTLS)."""
    client_ca = _read(tls.client_ca, "--tls-client-ca") if tls.client_ca else None
    return grpc.ssl_server_credentials(
        [(_read(tls.key, "--tls-key"), _read(tls.cert, "--tls-cert"))],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def channel_credentials(ca: str | None, cert: str | None, key: str | None) -> grpc.ChannelCredentials:
    """Client TLS: trust `ca` (or the system roots), and present `cert`/`key` when the server wants mTLS."""
    if (cert is None) != (key is None):
        raise InvalidArgument("--tls-cert, --tls-key: give both (client certificate and key) or neither")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(ca, "--tls-ca") if ca else None,
        private_key=_read(key, "--tls-key") if key else None,
        certificate_chain=_read(cert, "--tls-cert") if cert else None,
    )
    if ca:
        _check_certificates(ca, "--tls-ca")
    if cert and key:
        _check_certificates(cert, "--tls-cert")
        _check_key_of(cert, key)
    return credentials


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address; a wildcard (0.0.0.0, ::) or any other name is not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, *, tls: bool, auth: bool, insecure: bool, flag: str = "--listen") -> None:
    """Refuse to serve beyond this machine without TLS and authentication, unless told to.

    One rule for both listeners: gRPC (`--listen`) and the dashboard with its JSON API (`--http-listen`).
    """
    if is_loopback(host) or insecure or (tls and auth):
        return
    missing = [
        what
        for what, ok in (
            ("TLS (--tls-cert/--tls-key)", tls),
            ("authentication (--auth-tokens or --tls-client-ca)", auth),
        )
        if not ok
    ]
    raise InvalidArgument(
        f"{flag}: {host!r} is reachable beyond this machine, but {' and '.join(missing)} "
        f"{'are' if len(missing) > 1 else 'is'} not configured; "
        "configure it, listen on 127.0.0.1, or pass --insecure to accept the risk"
    )


# --- who is calling ---------------------------------------------------------------------------------
# The front ends (gRPC's interceptor, the HTTP API) set the caller of the request being served; what a
# service records about who did something (a pause's author, an event's principal) reads it here.

# The principal of what rackflow does by itself (a pause ending at resume_at), as the audit trail names it.
SYSTEM_PRINCIPAL = "rackflow"
ANONYMOUS = "anonymous"

# The principals the audit trail gives others than a caller with credentials: what rackflow does by
# itself, and a caller without credentials. A token or client certificate of that name made its holder's
# changes look like rackflow's own (an automatic pause, an expiry) or an unidentified caller's.
RESERVED_PRINCIPALS = frozenset({SYSTEM_PRINCIPAL, ANONYMOUS})
RESERVED_WHY = (
    "the audit trail names rackflow's own actions 'rackflow' and callers without credentials 'anonymous'"
)


def reserved_name(name: str) -> bool:
    return name.lower() in RESERVED_PRINCIPALS


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role
    source: str  # "token", "certificate" or "anonymous"


current_principal: ContextVar[Principal | None] = ContextVar("rackflow_principal", default=None)


def caller_identified() -> bool:
    """Whether the caller of the request being served is named by its credentials: a bearer token or a
    client certificate (its subject CN). Only then can rackflow tell two people apart (the two-person rule
    of approvals); an anonymous caller, or rackflow itself, is not."""
    principal = current_principal.get()
    return principal is not None and principal.source != ANONYMOUS


def caller_holds(role: Role) -> bool:
    """Whether the caller of the request being served holds `role` (a service called outside a request,
    by rackflow itself, holds every role)."""
    principal = current_principal.get()
    return principal is None or principal.role.holds(role)


def audited_name() -> str:
    """The calling principal's name as the audit trail records it: its name, "anonymous" for a request
    that names none."""
    principal = current_principal.get()
    return principal.name if principal is not None else ANONYMOUS


def caller_name() -> str:
    """The calling principal's name, to store with what it did (e.g. `paused_by`); empty for an anonymous
    caller, whose name says nothing."""
    principal = current_principal.get()
    return principal.name if principal is not None and principal.source != ANONYMOUS else ""
