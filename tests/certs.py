"""Throwaway certificate authorities and certificates for TLS tests, made with the `openssl` command.

EC P-256 keys keep generation fast. Server certificates name `localhost` and `127.0.0.1`, so clients can
verify the host they dial.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes]:
        return self.cert.read_bytes(), self.key.read_bytes()


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)


def make_ca(directory: Path, name: str) -> KeyPair:
    """A self-signed CA named `name`."""
    pair = KeyPair(directory / f"{name}.pem", directory / f"{name}.key")
    _new_key(pair.key)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        pair.key,
        "-out",
        pair.cert,
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    return pair


def make_cert(directory: Path, ca: KeyPair, common_name: str, *, server: bool) -> KeyPair:
    """A certificate for `common_name` signed by `ca`: a server's (localhost, 127.0.0.1) or a client's."""
    stem = directory / f"{common_name}-{'server' if server else 'client'}"
    pair = KeyPair(stem.with_suffix(".pem"), stem.with_suffix(".key"))
    csr, extensions = stem.with_suffix(".csr"), stem.with_suffix(".ext")
    _new_key(pair.key)
    _openssl("req", "-new", "-key", pair.key, "-out", csr, "-subj", f"/CN={common_name}")
    extensions.write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        if server
        else "extendedKeyUsage=clientAuth\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        ca.cert,
        "-CAkey",
        ca.key,
        "-CAcreateserial",
        "-out",
        pair.cert,
        "-days",
        "2",
        "-extfile",
        extensions,
    )
    return pair


@dataclass(frozen=True)
class Pki:
    """A CA with a server and a client certificate, and a second CA whose client the first must refuse."""

    ca: KeyPair
    server: KeyPair
    client: KeyPair
    rogue_client: KeyPair


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca, rogue = make_ca(directory, "rackflow-test-ca"), make_ca(directory, "rogue-ca")
    return Pki(
        ca=ca,
        server=make_cert(directory, ca, "localhost", server=True),
        client=make_cert(directory, ca, "ops-laptop", server=False),
        rogue_client=make_cert(directory, rogue, "intruder", server=False),
    )
