"""uvicorn, embedded: the dashboard's HTTP server as one more worker in `rackflow serve`'s event loop.

The socket is bound by `bind()` before the server starts, so a taken port fails start-up at once, port 0
is resolved, and the start-up log can name the address. uvicorn's own signal handling is switched off:
`rackflow serve` stops every worker itself (the HTTP server drains its requests within the same grace
period as gRPC). Under mutual TLS the client certificate's subject CN is handed to each request, so the
audit trail names HTTP callers as it names gRPC callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from rackflow.config import host_port, parse_host_port
from rackflow.security import ServerTls
from rackflow.web.auth import CLIENT_CERTIFICATE_NAME

SHUTDOWN_GRACE_SECONDS = 5


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # rackflow serve's own handlers stop the whole process, this server included


class _CertificateNameProtocol(H11Protocol):
    """HTTP/1.1 that publishes the verified client certificate's CN in every request's state."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        certificate = ssl_object.getpeercert() if ssl_object is not None else None
        name = _common_name(certificate) if certificate else None
        if name is not None:  # this connection's own copy: the state of other connections stays as it is
            self.app_state = {**self.app_state, CLIENT_CERTIFICATE_NAME: name}


def _common_name(certificate: dict[str, Any]) -> str | None:
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class HttpServer:
    """Serves `app` on `listen` (with TLS when `tls` is given) until `run`'s stop event is set."""

    def __init__(self, app: ASGIApp, listen: str, tls: ServerTls | None) -> None:
        self.tls = tls
        self.host, self.port = parse_host_port(listen, "--http-listen")
        self._socket: socket.socket | None = None
        self._server = _EmbeddedServer(
            uvicorn.Config(
                app,
                http=_CertificateNameProtocol,
                lifespan="off",
                log_config=None,
                log_level="warning",
                access_log=False,
                timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
                ssl_certfile=tls.cert if tls else None,
                ssl_keyfile=tls.key if tls else None,
                ssl_ca_certs=tls.client_ca if tls else None,
                ssl_cert_reqs=ssl.CERT_REQUIRED if tls and tls.client_ca else ssl.CERT_NONE,
            )
        )

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def bind(self) -> str:
        """Bind the listening socket; returns HOST:PORT with the port the OS chose for port 0."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP explicitly (socket.create_server leaves 0): asyncio sets TCP_NODELAY only on accepted
        # sockets that say TCP, and without it a kept-alive response's body waits ~40 ms behind its headers
        # (Nagle's algorithm against the client's delayed ACK).
        listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self.port))
            listener.listen(socket.SOMAXCONN)
        except OSError as exc:
            listener.close()
            raise OSError(f"--http-listen: cannot listen on {self.host}:{self.port}: {exc.strerror}") from exc
        self._socket = listener
        port = self._socket.getsockname()[1]
        return host_port(self.host, port)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then finish the requests in flight (at most the grace period)."""
        assert self._socket is not None, "bind() first"
        serving = asyncio.create_task(self._server.serve(sockets=[self._socket]), name="http serve")
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
        self._server.should_exit = True
        stopped.cancel()
        await serving
