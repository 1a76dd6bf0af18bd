"""A loopback TCP proxy that can drop or delay the connections through it, for network faults.

rackflow instances connect to PostgreSQL through it (`postgresql://…@127.0.0.1:<proxy port>/db`), so a test
can cut every connection at once and refuse new ones for a while (`drop`: to rackflow, the network went
away), cut the one connection that sends a given message (`cut_at`: a COMMIT whose answer, or which itself,
is lost), or hold every chunk of data for some milliseconds each way (`delay`: a slow network). It runs its
own event loop in a daemon thread and is controlled from the caller's thread. Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time


class TcpProxy:
    """`start()` returns the port it listens on (127.0.0.1); `stop()` closes everything."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.delay_s = 0.0
        self._refuse_until = 0.0
        self._cut_at: tuple[bytes, bool] | None = (
            None  # `cut_at`'s message, and whether it reaches the server
        )
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp proxy", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> int:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(10)
        return self.port

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def drop(self, seconds: float) -> int:
        """Close every connection through the proxy now and refuse new ones for `seconds`; returns how many
        connections were cut."""
        self._refuse_until = time.monotonic() + seconds
        return asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(10)

    def cut_at(self, message: bytes, *, delivered: bool) -> None:
        """Cut the next connection that sends data containing `message` (e.g. b"COMMIT"), once. `delivered`:
        the server gets the message, and its answer is lost with the connection (it committed, the client
        never hears so); otherwise the message is lost with it (the server never sees the COMMIT)."""
        self._cut_at = (message, delivered)

    def delay(self, seconds: float) -> None:
        """Hold every chunk of data `seconds` before passing it on, each way (0: no delay)."""
        self.delay_s = seconds

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut()

    async def _cut(self) -> int:
        writers, self._writers = list(self._writers), set()
        for writer in writers:
            writer.transport.abort()
        return len(writers) // 2

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._refuse_until:
            client_writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers.update((client_writer, upstream_writer))
        answer_lost = asyncio.Event()  # this connection sent the message of `cut_at`, delivered
        await asyncio.gather(
            self._pipe(client_reader, upstream_writer, sent=answer_lost),
            self._pipe(upstream_reader, client_writer, answered=answer_lost),
            return_exceptions=True,
        )
        for writer in (client_writer, upstream_writer):
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        sent: asyncio.Event | None = None,
        answered: asyncio.Event | None = None,
    ) -> None:
        """Pass data on until either side ends. Client to server (`sent`): the message of `cut_at` is passed
        on and `sent` set, or it ends the connection. Server to client (`answered`): once it is set, the
        next data (the answer) ends the connection."""
        with contextlib.suppress(OSError, ConnectionError):
            while chunk := await reader.read(65536):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if answered is not None and answered.is_set():
                    break
                if sent is not None and self._cut_at is not None and self._cut_at[0] in chunk:
                    delivered = self._cut_at[1]
                    self._cut_at = None
                    if not delivered:
                        break
                    sent.set()
                writer.write(chunk)
                await writer.drain()
        writer.transport.abort()  # one side ended: end the other, as a broken network would
