"""A loopback TCP proxy in front of a real Redis that can lose a reply after Redis applied the command.

`LossyProxy.lose_reply_to(marker)`: the next client command whose bytes contain `marker` is passed
to Redis, Redis's reply is read and thrown away, and the client's connection is closed: what a
client sees when its socket breaks or times out after the server ran the command. redis-py then
resends the command on a new connection (its Retry), which is how a non-idempotent write would be
applied twice.
"""

from __future__ import annotations

import asyncio
import contextlib

from specdec.redis_server import LOOPBACK

CHUNK_BYTES = 1 << 16


class LossyProxy:
    """Forwards 127.0.0.1:<port> to Redis at `upstream_port`; start() within the event loop."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.lost = 0  # replies thrown away so far
        self._marker: bytes | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> LossyProxy:
        self._server = await asyncio.start_server(self._serve, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def lose_reply_to(self, marker: bytes) -> None:
        """Arm: the next command containing `marker` runs in Redis but its reply never arrives."""
        self._marker = marker

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        dropping = asyncio.Event()
        tasks = {
            asyncio.create_task(self._to_redis(reader, up_writer, dropping)),
            asyncio.create_task(self._to_client(up_reader, writer, dropping)),
        }
        self._tasks |= tasks
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks -= tasks
        for w in (writer, up_writer):
            w.close()
            with contextlib.suppress(ConnectionError, OSError):
                await w.wait_closed()

    async def _to_redis(
        self, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, dropping: asyncio.Event
    ) -> None:
        while data := await reader.read(CHUNK_BYTES):
            if self._marker is not None and self._marker in data:
                self._marker = None
                dropping.set()
            up_writer.write(data)
            await up_writer.drain()

    async def _to_client(
        self, up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, dropping: asyncio.Event
    ) -> None:
        while data := await up_reader.read(CHUNK_BYTES):
            if dropping.is_set():
                self.lost += 1
                return  # the reply is dropped and the connection closed (by _serve)
            writer.write(data)
            await writer.drain()
